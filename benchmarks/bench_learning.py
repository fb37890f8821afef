"""Does the tiny model learn SQLPythonSMTP-v0 in candidates mode with the CLI's other defaults? (printed)

Runs ``agentrl-train ppo`` with its defaults for each seed, and once with rewards shuffled across
the batch (the control: the same budget should stay flat), and prints greedy success on train and
test at every evaluation with the wall time it was reached, next to the no-model baselines
(random candidate, overlap heuristic) on the same episodes.

    python benchmarks/bench_learning.py [--seeds 0 1 2] [--updates N] [--control] [--control-seeds 0 1 2] [--parallel]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(out: Path, seed: int, updates: int | None, shuffle: bool) -> subprocess.Popen[bytes]:
    # v0: the env docs/results/learning.md was measured on (the CLI's default until v1; v1 adds the oracle's lookups)
    cmd = [
        sys.executable,
        "-m",
        "agentrl_train",
        "ppo",
        "--env",
        "AgentRL/SQLPythonSMTP-v0",
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    if updates is not None:
        cmd += ["--updates", str(updates)]
    cmd += ["--no-progress", "--no-tensorboard", "--no-record", "--checkpoint-every", "0"]
    if shuffle:
        cmd += ["--shuffle-rewards"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(out.with_suffix(".log"), "wb"))


def baselines(episodes: int) -> dict[str, dict[str, float]]:
    import gymnasium as gym

    import agentrl_envs  # noqa: F401
    from agentrl_envs.agents import OverlapAgent, RandomCandidateAgent
    from agentrl_train.episodes import episode_seed
    from agentrl_train.evaluate import EVAL_SEED

    out: dict[str, dict[str, float]] = {}
    for name, cls in (("random candidate", RandomCandidateAgent), ("overlap heuristic", OverlapAgent)):
        out[name] = {}
        for split in ("train", "test"):
            env = gym.make("AgentRL/SQLPythonSMTP-v0", candidates=4, split=split)
            wins = 0
            for j in range(episodes):
                obs, info = env.reset(seed=episode_seed(EVAL_SEED, j, 0))
                agent = cls(seed=j)
                done = False
                while not done:
                    obs, _, term, trunc, info = env.step(agent.act(obs, info))
                    done = term or trunc
                wins += bool(info.get("success"))
            env.close()
            out[name][split] = wins / episodes
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="seeds to train (default 0 1 2; none: only controls)")
    ap.add_argument("--updates", type=int, default=None, help="PPO updates per run (default: the CLI's default, 5)")
    ap.add_argument("--control", action="store_true", help="also run seed 0 with rewards shuffled across the batch")
    ap.add_argument("--control-seeds", type=int, nargs="+", default=[], help="run these seeds with rewards shuffled")
    ap.add_argument(
        "--parallel", action="store_true", help="run the jobs at the same time (wall times then include the contention)"
    )
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-learning-"))
    root.mkdir(parents=True, exist_ok=True)
    jobs = [(f"seed {s}", root / f"seed{s}", s, False) for s in args.seeds]
    for s in sorted(set(args.control_seeds) | ({0} if args.control else set())):
        jobs.append((f"seed {s}, rewards shuffled", root / f"shuffled{s}", s, True))
    procs = []
    for name, out, seed, shuffle in jobs:
        p = run(out, seed, args.updates, shuffle)
        if not args.parallel:
            p.wait()
        procs.append((name, out, p))
    for _, _, p in procs:
        p.wait()
    print("| run | update | env steps | wall s | train greedy success | test greedy success |")
    print("|---|---|---|---|---|---|")
    for name, out, p in procs:
        rows = (
            [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            if (out / "metrics.jsonl").exists()
            else []
        )
        evals: dict[int, dict[str, object]] = {}
        for r in rows:
            if r["kind"] == "eval":
                evals.setdefault(r["update"], {"steps": r["env_steps"], "wall": r["wall_s"]})[r["split"]] = r["success_rate"]
        for u, e in sorted(evals.items()):
            print(
                f"| {name} | {u} | {e['steps']} | {e['wall']:.0f} | {e.get('train', float('nan')):.2f} | {e.get('test', float('nan')):.2f} |"
            )
        if p.returncode:
            print(f"| {name} | failed (exit {p.returncode}; see {out.with_suffix('.log')}) | | | | |")
    for name, res in baselines(16).items():
        print(f"| {name} (no model) | - | - | - | {res['train']:.2f} | {res['test']:.2f} |")
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
