"""Trainer throughput on this machine (printed, never asserted).

Runs a short PPO job with the CLI's defaults (tiny model, candidates mode, SQLPythonSMTP-v1) and
prints, from its metrics: env steps/s, rollout tokens/s, update tokens/s, the share of rollout time
in the model vs the env, and the peak RSS.

    python benchmarks/bench_train.py [--updates 4] [--num-envs 8] [--vectorization async] [--mode candidates|generate]
    python benchmarks/bench_train.py --model smollm2-135m --mode generate --init-adapter RUN/final \
        --env AgentRL/SQL-v0 --updates 1 --max-new-tokens 160   # the real model, from an SFT adapter

Then, in the same run, the same model (its weights and tokenizer; TRL's Qwen 2.5 chat template so
that TRL parses its tool calls; the same LoRA preset, or the same ``--init-adapter`` loaded trainable,
for a model other than ``tiny``) on the same env through TRL's ``GRPOTrainer(environment_factory=...)``
for the same number of episodes (``benchmarks/trl_grpo.py``; one torch thread, as agentrl's trainer),
and prints agentrl's wall time per 1,000 env steps as a ratio to TRL's (``--no-trl`` skips it). An env
step is one tool call that reached the env; TRL's count comes from the env class it calls.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from agentrl_train.config_io import load_config
from agentrl_train.train import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=4, help="PPO updates to time (default 4)")
    ap.add_argument("--num-envs", type=int, default=8, help="sub-envs (default 8)")
    ap.add_argument("--vectorization", default="async", choices=["async", "sync"], help="vector env mode (default async)")
    ap.add_argument(
        "--mode", default="candidates", choices=["candidates", "generate"], help="agentrl action mode (default candidates)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=96, help="token budget of one generated action (generate mode and TRL)")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL GRPOTrainer comparison")
    ap.add_argument("--model", default="tiny", help="tiny (default), smollm2-135m or a local folder (both sides)")
    ap.add_argument("--lora-preset", default=None, help="LoRA preset (default: the trainer's; small for TRL on a real model)")
    ap.add_argument("--init-adapter", default="", help="start both sides from this saved adapter (an sft run's final/)")
    ap.add_argument("--env", default=None, help="env id (default: the trainer's, AgentRL/SQLPythonSMTP-v1)")
    ap.add_argument("--rollout-steps", type=int, default=None, help="env steps per env per update (default: the trainer's)")
    args = ap.parse_args()
    extra = {"model": args.model, "init_adapter": args.init_adapter}
    extra.update(
        {k: v for k, v in (("lora_preset", args.lora_preset), ("env", args.env), ("rollout_steps", args.rollout_steps)) if v}
    )
    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    cfg = load_config(
        None,
        {
            "updates": args.updates,
            "num_envs": args.num_envs,
            "vectorization": args.vectorization,
            "eval_every": 0,
            "final_eval_splits": ["train"],
            "eval_episodes": 1,
            "record": True,
            "tensorboard": False,
            "progress": False,
            "out": str(out),
            "mode": args.mode,
            "max_new_tokens": args.max_new_tokens,
            **extra,
        },
    )
    t0 = time.perf_counter()
    summary = train(cfg, log=lambda *a, **k: None)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    upd = [r for r in rows if r["kind"] == "update"][1:] or [r for r in rows if r["kind"] == "update"]  # skip the warm-up update
    steps = cfg.ppo.rollout_steps * cfg.env.num_envs * len(upd)
    model_s = sum(r["time/rollout_model_s"] for r in upd)
    env_s = sum(r["time/rollout_env_s"] for r in upd)
    sgd_s = sum(r["time/update_s"] for r in upd)
    tokens = sum(r["rollout_tokens"] for r in upd)
    total = sum(r["time/total_s"] for r in upd)
    print(f"updates timed: {len(upd)} ({steps} env steps), whole run {wall:.1f} s incl. model build and final eval")
    print("| measure | value |")
    print("|---|---|")
    print(f"| env steps/s (rollout + update) | {steps / total:.2f} |")
    print(f"| rollout env steps/s | {steps / (model_s + env_s):.2f} |")
    print(f"| rollout tokens/s (policy + reference scoring, no grad) | {tokens / max(model_s, 1e-9):,.0f} |")
    print(f"| update tokens/s (fwd + bwd, {cfg.ppo.epochs} epochs) | {tokens * cfg.ppo.epochs / max(sgd_s, 1e-9):,.0f} |")
    print(f"| rollout time in the model | {model_s / max(model_s + env_s, 1e-9):.1%} |")
    print(f"| time in rollout vs update | {(model_s + env_s) / total:.1%} / {sgd_s / total:.1%} |")
    print(f"| wall time per 1,000 env steps | {1000 * total / steps:.0f} s |")
    print(f"| peak RSS (trainer process) | {json.loads((out / 'summary.json').read_text())['peak_rss_mb']:.0f} MB |")
    print(f"run folder: {out} (finished: {summary['finished']})")
    if not args.no_trl:
        every = [r for r in rows if r["kind"] == "update"]
        compare_with_trl(
            cfg.env.env,
            agentrl_s=sum(r["time/total_s"] for r in every),
            agentrl_steps=cfg.ppo.rollout_steps * cfg.env.num_envs * len(every),
            agentrl_episodes=sum(int(r["episodes"]) for r in every),
            mode=args.mode,
            max_new_tokens=args.max_new_tokens,
            model=args.model,
            adapter=_adapter_folder(args.init_adapter),
            lora_preset=args.lora_preset or "small",
        )


def _adapter_folder(path: str) -> str | None:
    """The peft folder (``adapter_config.json``) of an ``--init-adapter``: a run's ``final/`` holds it in ``exec/``."""
    if not path:
        return None
    folder = Path(path)
    return str(folder if (folder / "adapter_config.json").is_file() else folder / "exec")


def compare_with_trl(
    env_id: str,
    *,
    agentrl_s: float,
    agentrl_steps: int,
    agentrl_episodes: int,
    mode: str,
    max_new_tokens: int,
    model: str = "tiny",
    adapter: str | None = None,
    lora_preset: str = "small",
) -> None:
    """TRL GRPO on the same model and env for as many episodes; print the per-1,000-env-steps ratio."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trl_grpo import train_grpo

    prompts, generations = 4, 2
    steps = max(1, math.ceil(agentrl_episodes / (prompts * generations)))
    trl = train_grpo(
        env_id,
        steps=steps,
        max_new_tokens=max_new_tokens,
        prompts=prompts,
        generations=generations,
        model=model,
        adapter=adapter,
        lora_preset=lora_preset,
    )
    ours = 1000 * agentrl_s / max(agentrl_steps, 1)
    print(
        f"TRL GRPOTrainer(environment_factory=...): {steps} steps x {prompts} prompts x {generations} generations, "
        f"model {model}" + (f", from {adapter}" if adapter else "")
    )
    print("| measure | agentrl | TRL |")
    print("|---|---|---|")
    print(f"| action mode | {mode} | generate (Qwen 2.5 template) |")
    print(f"| episodes | {agentrl_episodes} finished | {trl['episodes']} played |")
    print(f"| env steps | {agentrl_steps} | {trl['env_steps']} |")
    print(f"| wall s (every update / trainer.train()) | {agentrl_s:.1f} | {trl['wall_s']:.1f} |")
    if trl["env_steps"] == 0:
        print(f"| wall time per 1,000 env steps | {ours:.0f} s | undefined: TRL's model made no tool call |")
        return
    theirs = 1000 * trl["wall_s"] / trl["env_steps"]
    print(f"| wall time per 1,000 env steps | {ours:.0f} s | {theirs:.0f} s |")
    print(f"| env's mean reward (TRL's log) | - | {trl['mean_reward']:.3f} |")
    print(f"agentrl / TRL wall time per 1,000 env steps: {ours / theirs:.2f}x (aim <= 0.5x)")


if __name__ == "__main__":
    main()
