"""The trainer's algorithms at an equal env-step budget: PPO (GAE, hierarchical), GRPO, Dr. GRPO, RLOO, GRPO on returns-to-go.

Every run trains the tiny model (``--model tiny``) in candidates mode (K=4) on ``AgentRL/SQLPythonSMTP-v0``,
train split, no faults: 16 envs, episodes of at most 8 steps, a rollout window of 8 steps, groups of 4
(4 groups) for the group advantages, every other option at the CLI's default except the entropy
coefficient, held at 0.01 (``--ent-start 0.01 --ent-end 0.01``) so that no schedule depends on a run's
update count (the group runs' counts are not known in advance).

**Equal budget.** Every run trains until its env steps reach ``--budget`` and stops after the update
that reaches it. A PPO update takes 16 x 8 = 128 env steps; a group update between 16 and 128 (an
env whose episode ended waits for its group). PPO runs ``budget / 128`` updates in one call; a group
run is resumed from its checkpoint in calls of ``ceil(remaining / 128)`` updates (no update takes
more than 128 steps, so a call ends on or before the update that crosses the budget, never after it)
until its steps reach the budget. Every run thus ends in ``[budget, budget + 128)`` env steps; the
table gives the mean reached.

Each run then evaluates its last checkpoint greedily on ``--episodes`` fixed episodes (the seeds of
``agentrl-train eval``) on train, test, heldout and test with ``error_profile="realistic"``. Nothing is
evaluated during training: the PNG plots each update's rollout success (the sampled policy on the
train split, the ``success`` of ``metrics.jsonl``) against env steps. Runs go one at a time, in two rounds (PPO (hierarchical), GRPO and GRPO on returns-to-go for every seed,
then the others; each round seed-major, so an interrupted matrix holds whole comparisons), each a subprocess under ``nice -n 10`` with ``OMP_NUM_THREADS=1``; a finished run's results are
kept in ``OUT/budgetB/ALGO-seedS/bench-result.json`` and reused, and an unfinished run resumes from
its checkpoint, so an interrupted matrix continues where it stopped::

    python benchmarks/bench_algorithms.py --budget 512                  # the matrix: 6 algorithms x 3 seeds
    python benchmarks/bench_algorithms.py --algos ppo-hierarchical --seeds 0 --budget 256   # one run
    python benchmarks/bench_algorithms.py --budget 512 --table-only     # tabulate the runs finished so far

Outputs: ``--md`` (the Markdown tables), ``--png`` (success vs env steps) and ``OUT/budgetB/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from leaderboard import ROOT, _saved_results  # a sibling script, not a package

ENV = "AgentRL/SQLPythonSMTP-v0"
NUM_ENVS, WINDOW, GROUP = 16, 8, 4
STEPS_PER_UPDATE_MAX = NUM_ENVS * WINDOW  #: a PPO update's steps, and the most any group update takes
#: name -> (label, the options that make the algorithm); the reference for the difference table comes first
ALGOS: dict[str, tuple[str, list[str]]] = {
    "ppo-hierarchical": ("PPO (hierarchical)", ["--advantage", "hierarchical"]),
    "grpo": ("GRPO", ["--advantage", "grpo", "--group-size", str(GROUP)]),
    "grpo-rtg": ("GRPO, return-to-go", ["--advantage", "grpo", "--group-size", str(GROUP), "--group-score", "return-to-go"]),
    "dr_grpo": ("Dr. GRPO", ["--advantage", "dr_grpo", "--group-size", str(GROUP)]),
    "rloo": ("RLOO", ["--advantage", "rloo", "--group-size", str(GROUP)]),
    "ppo-gae": ("PPO (gae)", ["--advantage", "gae"]),
}
#: the first round of runs: the reference, GRPO and its return-to-go variant (the docs' first two questions)
FIRST_ROUND = ("ppo-hierarchical", "grpo", "grpo-rtg")
REFERENCE = "ppo-hierarchical"
CELLS = [("train", "none"), ("test", "none"), ("heldout", "none"), ("test", "realistic")]


def _cell(split: str, profile: str) -> str:
    return split if profile == "none" else f"{split} {profile}"


def _nice(args: list[str]) -> tuple[list[str], dict[str, str]]:
    # PYTHONPATH: this checkout's packages, not another installed copy
    return ["nice", "-n", "10", sys.executable, *args], {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _rows(folder: Path) -> list[dict[str, Any]]:
    f = folder / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def _steps(folder: Path) -> int:
    return max((r["env_steps"] for r in _rows(folder) if r["kind"] == "update"), default=0)


def train_args(algo: str, seed: int, budget: int, folder: Path) -> list[str]:
    """``agentrl-train ppo`` options of one run (PPO: exactly the budget's updates; a group run: a cap it never reaches)."""
    grouped = "--group-size" in ALGOS[algo][1]
    updates = math.ceil(budget / (NUM_ENVS if grouped else STEPS_PER_UPDATE_MAX))  # a group update takes >= 1 step per env
    return [
        "ppo", "--env", ENV, "--model", "tiny", "--mode", "candidates", "--candidates", "4",
        "--num-envs", str(NUM_ENVS), "--rollout-steps", str(WINDOW), "--env-kwargs", "{max_steps: 8}",
        *ALGOS[algo][1], "--ent-start", "0.01", "--ent-end", "0.01", "--updates", str(updates),
        "--eval-every", "0", "--final-eval-splits", "[]",
        "--checkpoint-every", "1", "--keep-checkpoints", "1", "--no-record", "--no-progress", "--no-tensorboard",
        "--seed", str(seed), "--out", str(folder),
    ]  # fmt: skip


def _cpu() -> float:
    """CPU seconds of the finished child processes (and theirs): what the runs cost on an idle core."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _call(args: list[str], log: Path) -> float:
    """Run ``python ARGS`` under nice with one thread; its wall seconds. Raises RuntimeError on failure."""
    cmd, env = _nice(args)
    t0 = time.perf_counter()
    with log.open("ab") as f:
        f.write(("$ " + shlex.join(cmd) + "\n").encode())
        f.flush()
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if rc:
        raise RuntimeError(f"exit {rc}: {shlex.join(args[:4])} ... (see {log})")
    return time.perf_counter() - t0


def _stamp(algo: str, seed: int, budget: int, episodes: int) -> dict[str, Any]:
    """What a run's results depend on: a saved result with another stamp is not reused."""
    return {"algo": ALGOS[algo][1], "seed": seed, "budget": budget, "episodes": episodes}


def run_one(algo: str, seed: int, budget: int, root: Path, episodes: int) -> dict[str, Any]:
    """Train one run to the budget (resuming a folder left unfinished), evaluate it; reuse a finished one."""
    folder = root / f"{algo}-seed{seed}"
    stamp = _stamp(algo, seed, budget, episodes)
    cache = folder / "bench-result.json"
    saved = _saved_results(cache, stamp)
    if saved is not None:
        print(f"bench_algorithms: reusing {folder}", flush=True)
        return saved["rows"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    log, calls, seconds, cpu0 = folder.with_suffix(".log"), 0, 0.0, _cpu()
    while (steps := _steps(folder)) < budget:
        more = math.ceil((budget - steps) / STEPS_PER_UPDATE_MAX)
        resume = ["--resume"] if (folder / "checkpoints").is_dir() else []
        seconds += _call(
            [
                "-m",
                "agentrl_train",
                *train_args(algo, seed, budget, folder),
                *resume,
                "--max-updates-this-call",
                str(more),
            ],
            log,
        )
        calls += 1
    seconds += _call([__file__, "--evaluate", str(folder), "--episodes", str(episodes)], log)
    rows = _rows(folder)
    updates = [r for r in rows if r["kind"] == "update"]
    result = {
        "algo": algo,
        "seed": seed,
        "env_steps": _steps(folder),
        "updates": len(updates),
        "update_s": sum(r["time/total_s"] for r in updates),
        "cells": json.loads((folder / "bench-eval.json").read_text()),
        "curve": [(r["env_steps"], r["success"]) for r in updates if math.isfinite(r["success"])],
        "calls": calls,
        "wall_s": seconds,
        "cpu_s": _cpu() - cpu0,
    }
    cache.write_text(json.dumps({"budget": stamp, "rows": result, "seconds": seconds}))
    return result


def evaluate_folder(folder: Path, episodes: int) -> None:
    """(In its own process.) The last checkpoint's greedy success on every cell, to FOLDER/bench-eval.json."""
    from agentrl_train.evaluate import evaluate, load_run

    policy, cfg = load_run(str(folder), checkpoint="latest")
    cells = {}
    for split, profile in CELLS:
        r = evaluate(policy, cfg, split, episodes, error_profile=profile)
        cells[_cell(split, profile)] = {"success_rate": r["success_rate"], "mean_return": r["mean_return"]}
    (folder / "bench-eval.json").write_text(json.dumps(cells))


# -- outputs ---------------------------------------------------------------------------------------


def _spread(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def tables(results: dict[str, list[dict[str, Any]]], budget: int, episodes: int, command: str, commit: str) -> str:
    """The success table (mean and min-max over seeds) and the differences to PPO (hierarchical)."""
    names = [_cell(s, p) for s, p in CELLS]
    out = [
        "| algorithm | seeds | env steps (mean) | "
        + " | ".join(names)
        + " | update wall s / 1,000 env steps | CPU s per run (training + evaluation) |",
        "|---|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for algo, runs in results.items():
        cells = [_spread([r["cells"][n]["success_rate"] for r in runs]) for n in names]
        per_k = [1000 * r["update_s"] / r["env_steps"] for r in runs]
        wall = f"{np.mean(per_k):.0f} ({min(per_k):.0f}-{max(per_k):.0f})"
        steps = np.mean([r["env_steps"] for r in runs])
        cpu = [r["cpu_s"] for r in runs]
        cpu_cell = f"{np.mean(cpu):.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
        out.append(f"| {ALGOS[algo][0]} | {len(runs)} | {steps:.0f} | " + " | ".join(cells) + f" | {wall} | {cpu_cell} |")
    ref = results.get(REFERENCE)
    if ref:
        out += ["", f"Difference of the mean to {ALGOS[REFERENCE][0]}; **bold**: larger than the seed spread (the two", ""]
        out[-2] += " algorithms' min-max ranges over seeds do not overlap)."
        out += ["| algorithm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for algo, runs in results.items():
            if algo == REFERENCE:
                continue
            row = []
            for n in names:
                a, b = [r["cells"][n]["success_rate"] for r in runs], [r["cells"][n]["success_rate"] for r in ref]
                diff = f"{np.mean(a) - np.mean(b):+.2f}"
                if min(len(a), len(b)) < 2:  # one seed has no spread to compare with
                    row.append(f"{diff} (1 seed)")
                else:
                    row.append(f"**{diff}**" if min(a) > max(b) or max(a) < min(b) else diff)
            out.append(f"| {ALGOS[algo][0]} | " + " | ".join(row) + " |")
    caption = (
        f"Greedy success on `{ENV}`, candidates mode (K=4), the tiny model; {episodes} fixed episodes per cell "
        f"(the seeds of `agentrl-train eval`); mean (min-max) over seeds; every run trained to {budget} env steps "
        f"(stopping after the update that reaches it). Wall times are those of the machine that ran it, "
        f"under whatever else ran there; CPU s counts the run's own processes. Command: `{command}` at commit `{commit}`."
    )
    return "\n".join(out) + "\n\n" + caption + "\n"


def plot(results: dict[str, list[dict[str, Any]]], budget: int, path: Path) -> None:
    """Rollout success vs env steps: the mean over seeds (interpolated between updates) and the min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = max(r["curve"][0][0] for runs in results.values() for r in runs)  # every run has a point at or before it
    grid = np.linspace(first, budget, 33)
    seeds = sorted({r["seed"] for runs in results.values() for r in runs})
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for algo, runs in results.items():
        ys = np.array([np.interp(grid, *zip(*r["curve"])) for r in runs])
        line = ax.plot(grid, ys.mean(axis=0), label=f"{ALGOS[algo][0]} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=line[0].get_color(), alpha=0.15)
    ax.set(xlabel="env steps", ylabel="rollout success (sampled policy, train split)", ylim=(-0.02, 1.02), xlim=(0, budget))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(
        f"{ENV}, candidates mode, tiny model: seeds {', '.join(map(str, seeds))}, budget {budget} env steps\n"
        "mean over seeds of each update's rollout success, band: min-max over seeds",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=512, help="env steps per run (default 512: 4 PPO updates)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="(default: 0 1 2)")
    ap.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated, from {', '.join(ALGOS)} (default: all)")
    ap.add_argument("--episodes", type=int, default=16, help="episodes per evaluated cell after training (default 16)")
    ap.add_argument("--out", default="runs/bench-algorithms", help="run folders, reused (default: runs/bench-algorithms)")
    ap.add_argument("--md", default="docs/results/algorithms-table.md", help="Markdown tables ('' for none)")
    ap.add_argument("--png", default="docs/img/algorithms.png", help="the plot ('' for none)")
    ap.add_argument("--table-only", action="store_true", help="tabulate the finished runs in --out; train nothing")
    ap.add_argument("--evaluate", default="", help=argparse.SUPPRESS)  # the evaluation subprocess of one run folder
    args = ap.parse_args(argv)
    if args.evaluate:
        evaluate_folder(Path(args.evaluate), args.episodes)
        return 0
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    if not algos or any(a not in ALGOS for a in algos):
        ap.error(f"--algos {args.algos!r}: use a comma-separated subset of {', '.join(ALGOS)}")
    if args.budget < 1 or args.episodes < 1:
        ap.error("--budget and --episodes: use values >= 1")
    root = Path(args.out).resolve() / f"budget{args.budget}"
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in algos}
    failed = []
    # two rounds (FIRST_ROUND, then the rest), each seed-major: an interrupted matrix holds whole comparisons
    rounds = [[a for a in algos if a in FIRST_ROUND], [a for a in algos if a not in FIRST_ROUND]]
    for algo, seed in [(a, s) for part in rounds for s in args.seeds for a in part]:
        t0 = time.perf_counter()
        if args.table_only:
            stamp = _stamp(algo, seed, args.budget, args.episodes)
            saved = _saved_results(root / f"{algo}-seed{seed}" / "bench-result.json", stamp)
            if saved is not None:
                results[algo].append(saved["rows"])
            else:
                failed.append(f"{algo}-seed{seed}")
            continue
        try:
            r = run_one(algo, seed, args.budget, root, args.episodes)
        except RuntimeError as exc:
            print(f"bench_algorithms: {algo} seed {seed} failed: {exc}", flush=True)
            failed.append(f"{algo}-seed{seed}")
            continue
        results[algo].append(r)
        cells = ", ".join(f"{n} {c['success_rate']:.2f}" for n, c in r["cells"].items())
        print(
            f"bench_algorithms: {algo} seed {seed}: {r['env_steps']} env steps in {r['updates']} updates, {cells}; "
            f"{time.perf_counter() - t0:.0f} s (run {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU)",
            flush=True,
        )
    results = {a: rs for a, rs in results.items() if rs}
    if not results:
        print("bench_algorithms: no run finished", flush=True)
        return 1
    shown = [f"--budget={args.budget}"] + ([] if args.episodes == 16 else [f"--episodes={args.episodes}"])
    if algos != list(ALGOS):
        shown.append(f"--algos={','.join(algos)}")
    if args.seeds != [0, 1, 2]:
        shown += ["--seeds", *map(str, args.seeds)]
    command = shlex.join(["python", "benchmarks/bench_algorithms.py", *shown])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    table = tables(results, args.budget, args.episodes, command, commit)
    if failed:
        table += f"\nRuns not in the table ({'not run yet' if args.table_only else 'failed'}): {', '.join(failed)}.\n"
    (root / "results.json").write_text(json.dumps(results, indent=1))
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(table, encoding="utf-8")
    if args.png:
        plot(results, args.budget, Path(args.png))
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
