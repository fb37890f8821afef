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
``agentrl-train eval``) on train, test, heldout and test with ``error_profile="realistic"``
(:class:`Evaluation`; ``benchmarks/leaderboard.py`` evaluates the same runs on its own cells). Nothing is
evaluated during training: the PNG plots each update's rollout success (the sampled policy on the
train split, the ``success`` of ``metrics.jsonl``) against env steps. Runs go one at a time, in two rounds (PPO (hierarchical), GRPO and GRPO on returns-to-go for every seed,
then the others; each round seed-major, so an interrupted matrix holds whole comparisons), each a subprocess at niceness 10 with ``OMP_NUM_THREADS=1``; a finished run's results are
kept in ``OUT/budgetB/ALGO-seedS/bench-result.json`` and reused, and an unfinished run resumes from
its checkpoint, so an interrupted matrix continues where it stopped::

    python benchmarks/bench_algorithms.py --budget 512                  # the matrix: 6 algorithms x 3 seeds
    python benchmarks/bench_algorithms.py --algos ppo-hierarchical --seeds 0 --budget 256   # one run
    python benchmarks/bench_algorithms.py --budget 512 --table-only     # tabulate the runs finished so far

Outputs: ``--md`` (the Markdown tables), ``--png`` (success vs env steps) and ``OUT/budgetB/results.json``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
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
CELLS = (("train", "none"), ("test", "none"), ("heldout", "none"), ("test", "realistic"))


@dataclass(frozen=True)
class Evaluation:
    """The episodes a finished run is evaluated on; its results are kept per ``name``, so one run serves several."""

    cells: tuple[tuple[str, str], ...] = CELLS  #: (split, error profile) pairs
    episodes: int = 16  #: fixed episodes per cell (the seeds of ``agentrl-train eval``)
    #: replaces the run's env kwargs (its ``max_steps: 8``) when set, e.g. to play the leaderboard's episodes
    env_kwargs: dict[str, Any] | None = None
    name: str = "bench"  #: the run folder's NAME-eval.json and NAME-result.json


def cell_key(split: str, profile: str) -> str:
    return f"{split}/{profile}"


def _cell(split: str, profile: str) -> str:
    return split if profile == "none" else f"{split} {profile}"


def saved_results(cache: Path, budget: dict[str, Any], prog: str) -> dict[str, Any] | None:
    """Saved rows when ``cache`` holds them for ``budget``; None otherwise (a damaged cache is computed again)."""
    if not cache.exists():
        return None
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved["budget"] != budget:
            return None
        if not isinstance(saved["rows"], dict) or not isinstance(saved["seconds"], (int, float)):
            raise ValueError("rows or seconds of the wrong type")
    except (ValueError, OSError, KeyError, TypeError) as exc:
        print(f"{prog}: warning: {cache} is damaged ({exc}); evaluating again", file=sys.stderr, flush=True)
        return None
    return saved


def _nice(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """A run's command at niceness 10 (not 10 more: under ``nice -n 10`` it stays at 10) and its environment."""
    # PYTHONPATH: this checkout's packages, not another installed copy
    more = str(max(0, 10 - os.nice(0)))
    return ["nice", "-n", more, sys.executable, *args], {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


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


def _stamp(algo: str, seed: int, budget: int, ev: Evaluation) -> dict[str, Any]:
    """What a run's results depend on: a saved result with another stamp is not reused."""
    return {"algo": ALGOS[algo][1], "seed": seed, "budget": budget, **json.loads(json.dumps(asdict(ev)))}


def train_to_budget(algo: str, seed: int, budget: int, folder: Path, log: Path) -> tuple[int, float]:
    """Train (or resume) one run until its env steps reach ``budget``; the calls made and their wall seconds."""
    calls, seconds = 0, 0.0
    while (steps := _steps(folder)) < budget:
        more = math.ceil((budget - steps) / STEPS_PER_UPDATE_MAX)
        resume = ["--resume"] if (folder / "checkpoints").is_dir() else []
        args = ["-m", "agentrl_train", *train_args(algo, seed, budget, folder), *resume, "--max-updates-this-call", str(more)]
        seconds += _call(args, log)
        calls += 1
    return calls, seconds


def run_one(algo: str, seed: int, budget: int, root: Path, ev: Evaluation) -> dict[str, Any]:
    """Train one run to the budget (resuming a folder left unfinished), evaluate it; reuse a finished one.

    One process at a time works on a run (``ROOT/ALGO-seedS.lock``): another one (the leaderboard and
    this script on the same folder) waits for it, then trains no further than the budget.
    """
    folder = root / f"{algo}-seed{seed}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with folder.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _run_locked(algo, seed, budget, folder, ev)


def _run_locked(algo: str, seed: int, budget: int, folder: Path, ev: Evaluation) -> dict[str, Any]:
    stamp = _stamp(algo, seed, budget, ev)
    cache = folder / f"{ev.name}-result.json"
    saved = saved_results(cache, stamp, "bench_algorithms")
    if saved is not None:
        print(f"bench_algorithms: reusing {cache}", flush=True)
        return saved["rows"]
    log, cpu0 = folder.with_suffix(".log"), _cpu()
    calls, seconds = train_to_budget(algo, seed, budget, folder, log)
    seconds += _call([__file__, "--evaluate", str(folder), "--evaluation", json.dumps(asdict(ev))], log)
    updates = [r for r in _rows(folder) if r["kind"] == "update"]
    result = {
        "algo": algo,
        "seed": seed,
        "env_steps": _steps(folder),
        "updates": len(updates),
        "update_s": sum(r["time/total_s"] for r in updates),
        "cells": json.loads((folder / f"{ev.name}-eval.json").read_text()),
        "curve": [(r["env_steps"], r["success"]) for r in updates if math.isfinite(r["success"])],
        "calls": calls,
        "wall_s": seconds,
        "cpu_s": _cpu() - cpu0,
    }
    cache.write_text(json.dumps({"budget": stamp, "rows": result, "seconds": seconds}))
    return result


def evaluate_folder(folder: Path, ev: Evaluation) -> None:
    """(In its own process.) The last checkpoint's greedy success on every cell, to FOLDER/NAME-eval.json."""
    from agentrl_train.evaluate import evaluate, load_run

    policy, cfg = load_run(str(folder), checkpoint="latest")
    if ev.env_kwargs is not None:
        cfg.env.env_kwargs = dict(ev.env_kwargs)
    cells = {}
    for split, profile in ev.cells:
        r = evaluate(policy, cfg, split, ev.episodes, error_profile=profile)
        cells[cell_key(split, profile)] = {"success_rate": r["success_rate"], "mean_return": r["mean_return"]}
    (folder / f"{ev.name}-eval.json").write_text(json.dumps(cells))


def run_matrix(
    algos: list[str], seeds: list[int], budget: int, root: Path, ev: Evaluation, table_only: bool = False
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Every (algorithm, seed) run, one at a time; the finished runs' results per algorithm, and the runs missing.

    Two rounds (FIRST_ROUND, then the rest), each seed-major: an interrupted matrix holds whole comparisons.
    ``table_only`` trains nothing and takes the saved results.
    """
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in algos}
    missing = []
    rounds = [[a for a in algos if a in FIRST_ROUND], [a for a in algos if a not in FIRST_ROUND]]
    for algo, seed in [(a, s) for part in rounds for s in seeds for a in part]:
        t0 = time.perf_counter()
        if table_only:
            cache = root / f"{algo}-seed{seed}" / f"{ev.name}-result.json"
            saved = saved_results(cache, _stamp(algo, seed, budget, ev), "bench_algorithms")
            if saved is not None:
                results[algo].append(saved["rows"])
            else:
                missing.append(f"{algo}-seed{seed}")
            continue
        try:
            r = run_one(algo, seed, budget, root, ev)
        except RuntimeError as exc:
            print(f"bench_algorithms: {algo} seed {seed} failed: {exc}", flush=True)
            missing.append(f"{algo}-seed{seed}")
            continue
        results[algo].append(r)
        cells = ", ".join(f"{n} {c['success_rate']:.2f}" for n, c in r["cells"].items())
        print(
            f"bench_algorithms: {algo} seed {seed}: {r['env_steps']} env steps in {r['updates']} updates, {cells}; "
            f"{time.perf_counter() - t0:.0f} s (run {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU)",
            flush=True,
        )
    return {a: rs for a, rs in results.items() if rs}, missing


# -- outputs ---------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    """``mean (min-max)`` of the seeds' values."""
    return f"{np.mean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def difference_table(values: dict[str, dict[str, list[float]]], reference: str, headers: dict[str, str]) -> list[str]:
    """Markdown lines: each row's mean minus ``reference``'s per cell, **bold** where larger than the seed spread.

    ``values`` maps a row label to ``{cell: [one value per seed]}``; ``headers`` maps each cell to its column
    title. A difference is larger than the seed spread when the two rows' min-max ranges do not overlap;
    with one seed on either side there is no spread, and the cell says so.
    """
    ref = values[reference]
    out = [
        f"Difference of the mean to {reference}; **bold**: larger than the seed spread (the two rows' min-max",
        "ranges over seeds do not overlap).",
        "",
        "| algorithm | " + " | ".join(headers.values()) + " |",
        "|---|" + "---|" * len(headers),
    ]
    for label, cells in values.items():
        if label == reference:
            continue
        row = []
        for n in headers:
            a, b = cells[n], ref[n]
            diff = f"{np.mean(a) - np.mean(b):+.2f}"
            if min(len(a), len(b)) < 2:
                row.append(f"{diff} (1 seed)")
            else:
                row.append(f"**{diff}**" if min(a) > max(b) or max(a) < min(b) else diff)
        out.append(f"| {label} | " + " | ".join(row) + " |")
    return out


def tables(results: dict[str, list[dict[str, Any]]], budget: int, episodes: int, command: str, commit: str) -> str:
    """The success table (mean and min-max over seeds) and the differences to PPO (hierarchical)."""
    headers = {cell_key(s, p): _cell(s, p) for s, p in CELLS}
    out = [
        "| algorithm | seeds | env steps (mean) | "
        + " | ".join(headers.values())
        + " | update wall s / 1,000 env steps | CPU s per run (training + evaluation) |",
        "|---|---|---|" + "---|" * len(headers) + "---|---|",
    ]
    for algo, runs in results.items():
        cells = [spread([r["cells"][n]["success_rate"] for r in runs]) for n in headers]
        per_k = [1000 * r["update_s"] / r["env_steps"] for r in runs]
        wall = f"{np.mean(per_k):.0f} ({min(per_k):.0f}-{max(per_k):.0f})"
        steps = np.mean([r["env_steps"] for r in runs])
        cpu = [r["cpu_s"] for r in runs]
        cpu_cell = f"{np.mean(cpu):.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
        out.append(f"| {ALGOS[algo][0]} | {len(runs)} | {steps:.0f} | " + " | ".join(cells) + f" | {wall} | {cpu_cell} |")
    if REFERENCE in results:
        values = {ALGOS[a][0]: {n: [r["cells"][n]["success_rate"] for r in runs] for n in headers} for a, runs in results.items()}
        out += ["", *difference_table(values, ALGOS[REFERENCE][0], headers)]
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


def commit() -> str:
    """The checkout's short commit, for the captions."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


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
    ap.add_argument("--evaluation", default="{}", help=argparse.SUPPRESS)  # its Evaluation, as JSON
    args = ap.parse_args(argv)
    if args.evaluate:
        spec = json.loads(args.evaluation)
        spec["cells"] = tuple(tuple(c) for c in spec.get("cells", CELLS))
        evaluate_folder(Path(args.evaluate), Evaluation(**spec))
        return 0
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    if not algos or any(a not in ALGOS for a in algos):
        ap.error(f"--algos {args.algos!r}: use a comma-separated subset of {', '.join(ALGOS)}")
    if args.budget < 1 or args.episodes < 1:
        ap.error("--budget and --episodes: use values >= 1")
    root = Path(args.out).resolve() / f"budget{args.budget}"
    results, missing = run_matrix(algos, args.seeds, args.budget, root, Evaluation(episodes=args.episodes), args.table_only)
    if not results:
        print("bench_algorithms: no run finished", flush=True)
        return 1
    shown = [f"--budget={args.budget}"] + ([] if args.episodes == 16 else [f"--episodes={args.episodes}"])
    if algos != list(ALGOS):
        shown.append(f"--algos={','.join(algos)}")
    if args.seeds != [0, 1, 2]:
        shown += ["--seeds", *map(str, args.seeds)]
    command = shlex.join(["python", "benchmarks/bench_algorithms.py", *shown])
    table = tables(results, args.budget, args.episodes, command, commit())
    if missing:
        table += f"\nRuns not in the table ({'not run yet' if args.table_only else 'failed'}): {', '.join(missing)}.\n"
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
