"""Trainer throughput on this machine (printed, never asserted).

Runs a short PPO job with the CLI's defaults (tiny model, candidates mode, SQLPythonSMTP-v0) and
prints, from its metrics: env steps/s, rollout tokens/s, update tokens/s, the share of rollout time
in the model vs the env, and the peak RSS.

    python benchmarks/bench_train.py [--updates 4] [--num-envs 8] [--vectorization async]

Not measured here: the same work through TRL's GRPOTrainer(environment_factory=...). A random or
weakly pretrained tiny model rarely emits a tool call TRL can parse, so TRL's env-step count is ~0
and a per-1,000-env-steps ratio is undefined; that comparison needs a model that calls tools.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agentrl_train.config import load_config
from agentrl_train.train import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=4, help="PPO updates to time (default 4)")
    ap.add_argument("--num-envs", type=int, default=8, help="sub-envs (default 8)")
    ap.add_argument("--vectorization", default="async", choices=["async", "sync"], help="vector env mode (default async)")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
