"""DDP throughput on this machine: 1 rank x 2N envs vs 2 ranks x N envs (printed, never asserted).

Runs the same short PPO job (tiny model, candidates mode, SQLPythonSMTP-v1, sync vector envs so
each rank is one process) twice through the CLI, once as one process and once under torchrun with
2 ranks (gloo), and prints from each run's ``resources.json``: global env steps/s and tokens/s per
phase, the mean step time, the share of time in all-reduce, and peak RSS per rank; then the 2-rank
/ 1-rank ratio of the whole update loop.

    python benchmarks/bench_ddp.py [--updates 4] [--num-envs 4] [--rollout-steps 4]

``--num-envs`` is the global count (each of 2 ranks gets half). The first update of each run is
included (the rollout phase also pays the first forward's allocations).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(out: Path, world: int, args: argparse.Namespace) -> tuple[float, dict]:
    opts = {
        "updates": args.updates,
        "num_envs": args.num_envs // world,
        "rollout_steps": args.rollout_steps,
        "vectorization": "sync",
        "eval_every": 0,
        "final_eval_splits": "[train]",
        "eval_episodes": 1,
        "checkpoint_every": 0,
        "out": str(out),
    }
    flags = [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))] + ["--no-tensorboard", "--no-progress"]
    head = [sys.executable, "-m", "agentrl_train"]
    if world > 1:
        head = [str(Path(sys.executable).parent / "torchrun"), "--standalone", f"--nproc-per-node={world}", "-m", "agentrl_train"]
    t0 = time.perf_counter()
    proc = subprocess.run([*head, "ppo", *flags], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{world}-rank run failed:\n{proc.stderr[-3000:]}")
    return wall, json.loads((out / "resources.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=4, help="PPO updates per run (default 4)")
    ap.add_argument("--num-envs", type=int, default=4, help="global sub-envs, split over the ranks (default 4)")
    ap.add_argument("--rollout-steps", type=int, default=4, help="env steps per sub-env per update (default 4)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    runs = {}
    for world in (1, 2):
        wall, res = _run(root / f"world{world}", world, args)
        runs[world] = (wall, res["stages"]["exec"])
    steps = args.updates * args.rollout_steps * args.num_envs
    print(
        f"{args.updates} updates x {args.rollout_steps} steps x {args.num_envs} global envs = {steps} env steps per run; os.cpu_count()={os.cpu_count()}"
    )
    print("| ranks | phase | mean s / call | env steps/s | tokens/s | comm share | peak RSS MB per rank |")
    print("|---|---|---|---|---|---|---|")
    loop = {}
    for world, (_wall, entry) in runs.items():
        loop[world] = sum(entry["phases"][p]["seconds"] for p in ("rollout", "update") if p in entry["phases"])
        for phase, r in entry["phases"].items():
            rss = " / ".join(f"{x:.0f}" for x in r["peak_rss_mb_per_rank"])
            print(
                f"| {world} | {phase} | {r['mean_s']:.3f} | {r['env_steps_per_s']:.1f} | {r['tokens_per_s']:.0f} "
                f"| {r['comm_share']:.1%} | {rss} |"
            )
    print()
    print(
        "| ranks | whole run wall s (incl. start, model load, final eval) | rollout+update s | env steps/s over rollout+update |"
    )
    print("|---|---|---|---|")
    for world, (wall, _entry) in runs.items():
        print(f"| {world} | {wall:.1f} | {loop[world]:.1f} | {steps / loop[world]:.2f} |")
    print(f"\n2 ranks / 1 rank throughput (rollout+update): {loop[1] / loop[2]:.2f}x")


if __name__ == "__main__":
    main()
