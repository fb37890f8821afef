"""Generate mode end to end: behaviour cloning, then PPO, on AgentRL/SQL-v0 (printed, not asserted).

Runs ``agentrl-train sft`` (oracle transcripts, assistant tokens only), evaluates it greedily, runs
``agentrl-train ppo --mode generate --init-adapter <sft>/final`` from it, and evaluates again: success
and mean return on train and test without faults, and under ``error_profile=realistic`` the fault
recovery rate (episodes with a fault that still succeeded) beside the no-fault run.

    python benchmarks/bench_generate.py [--sft-episodes 64] [--updates 6] [--episodes 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "AgentRL/SQL-v0"


def cli(*args: str) -> str:
    cmd = [sys.executable, "-m", "agentrl_train", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return done.stdout


def evaluate(run: Path, split: str, episodes: int, profile: str) -> dict[str, object]:
    out = cli("eval", "--run", str(run), "--split", split, "--episodes", str(episodes), "--error-profile", profile, "--json")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-episodes", type=int, default=64, help="oracle transcripts for sft (default 64)")
    ap.add_argument("--sft-epochs", type=int, default=3, help="sft epochs (default 3)")
    ap.add_argument("--updates", type=int, default=6, help="PPO updates after sft (default 6)")
    ap.add_argument("--episodes", type=int, default=32, help="greedy eval episodes per split and profile (default 32)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-generate-"))
    common = ["--env", ENV, "--mode", "generate", "--seed", str(args.seed)]
    t0 = time.perf_counter()
    cli(
        "sft",
        *common,
        "--final-eval-splits",
        "[]",
        "--episodes",
        str(args.sft_episodes),
        "--sft-epochs",
        str(args.sft_epochs),
        "--out",
        str(root / "sft"),
    )
    t_sft = time.perf_counter() - t0
    t0 = time.perf_counter()
    cli(
        "ppo", *common, "--init-adapter", str(root / "sft" / "final"), "--updates", str(args.updates),
        "--eval-every", "0", "--final-eval-splits", "[]", "--no-record", "--checkpoint-every", "0", "--out", str(root / "ppo"),
        "--no-progress", "--no-tensorboard",
    )  # fmt: skip
    t_ppo = time.perf_counter() - t0
    rows = []
    for stage, run in (("after sft", root / "sft"), ("after sft + PPO", root / "ppo")):
        for split in ("train", "test"):
            clean = evaluate(run, split, args.episodes, "none")
            faulty = evaluate(run, split, args.episodes, "realistic")
            rows.append((stage, split, clean, faulty))
    print(f"{ENV}, generate mode, tiny model: sft {args.sft_episodes} episodes x {args.sft_epochs} epochs ({t_sft:.0f} s),")
    print(f"then {args.updates} PPO updates ({t_ppo:.0f} s); greedy, {args.episodes} episodes per cell")
    print()
    print("| policy | split | success (no faults) | mean return | success (realistic) | episodes with faults | recovery rate |")
    print("|---|---|---|---|---|---|---|")
    for stage, split, c, f in rows:
        rec = "-" if f["recovery_rate"] is None else f"{f['recovery_rate']:.2f}"
        print(
            f"| {stage} | {split} | {c['success_rate']:.2f} | {c['mean_return']:.2f} | {f['success_rate']:.2f} "
            f"| {f['episodes_with_faults']} | {rec} |"
        )
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
