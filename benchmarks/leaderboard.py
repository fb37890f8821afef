"""The leaderboard: baselines and trained agents on the same fixed episodes, one table and one PNG.

Every entry plays the same episodes (seeds ``episode_seed(1_000_003, j, 0)`` for j < ``--episodes``,
the seeds ``agentrl-train eval`` uses) of one env on each split (train / test / heldout) under the
error profiles ``none`` and ``realistic``; candidate-view entries also on both candidate
difficulties (easy, hard). Entries:

- ``random``: a uniformly random candidate (:class:`~agentrl_envs.agents.RandomCandidateAgent`).
- ``overlap``: the no-model word-overlap heuristic (:class:`~agentrl_envs.agents.OverlapAgent`).
- ``oracle``: the gold plan (:class:`~agentrl_envs.agents.OracleAgent`), the ceiling.
- ``sb3-ppo``: Stable-Baselines3 PPO on :class:`~agentrl_envs.wrappers.candidates_discrete.CandidatesDiscrete`, one run per difficulty.
- ``agentrl-candidates``: ``agentrl-train ppo --mode candidates`` (tiny model), one run per difficulty.
- ``agentrl-generate``: ``agentrl-train sft`` then ``agentrl-train ppo --mode generate`` (tiny model).
- ``trl-grpo``: TRL's ``GRPOTrainer(environment_factory=...)`` on the same tiny model (its weights and
  tokenizer, with TRL's Qwen 2.5 chat template so TRL can parse tool calls), evaluated greedily like
  the agentrl policies.
- ``algo-ppo-hierarchical``, ``algo-grpo``, ``algo-grpo-rtg``, ``algo-dr_grpo``, ``algo-rloo``, ``algo-ppo-gae``:
  the trainer's algorithms, trained by ``benchmarks/bench_algorithms.py`` (its runs and its equal
  env-step budget, ``--algo-budget``) on the easy candidates view, once per seed of ``--algo-seeds``;
  each cell is the mean (min-max) over the seeds, and a second table gives each algorithm's difference
  to PPO (hierarchical), bold where it is larger than the seed spread.

Trained entries train on the train split with the profile ``none`` and are then evaluated everywhere.
Their runs live in ``--runs`` (default ``runs/leaderboard``) and are reused when a run with the same
budget is there (``--retrain`` trains again); every entry's rows are also saved in
``RUNS/results/ENTRY.json``, and ``--reuse-results`` takes them from there instead of evaluating again
(so entries can be run one at a time and the table assembled at the end). The algorithm rows' runs live
in ``RUNS/algorithms/budgetB/ALGO-seedS`` (``python benchmarks/bench_algorithms.py --out RUNS/algorithms``
trains the same runs) and keep their evaluation there, so an interrupted run resumes. Outputs: ``--md`` (Markdown table, its caption says the
budgets and the command), ``--png`` and ``--json``::

    python benchmarks/leaderboard.py                                   # make leaderboard
    python benchmarks/leaderboard.py --entries random,overlap,oracle --episodes 8
    python benchmarks/leaderboard.py --entries random,overlap,oracle,sb3-ppo,agentrl-candidates,agentrl-generate,trl-grpo
                                                                       # without the algorithm rows

Only the trained entries import torch (lazily).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import agentrl_envs  # noqa: F401 - registers the envs
from agentrl_envs.agents import OracleAgent, OverlapAgent, RandomCandidateAgent
from agentrl_envs.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_algorithms as algorithms  # a sibling script, not a package

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED = 1_000_003  #: agentrl_train.evaluate.EVAL_SEED: every entry plays the episodes `agentrl-train eval` plays
SPLITS = ("train", "test", "heldout")
PROFILES = ("none", "realistic")
DIFFICULTIES = ("easy", "hard")
ALGO_ENTRIES = {f"algo-{a}": a for a in algorithms.ALGOS}  #: entry -> bench_algorithms' algorithm
ALGO_VIEW = "easy"  #: the candidate difficulty bench_algorithms trains on (the env's default)
ENTRIES = ("random", "overlap", "oracle", "sb3-ppo", "agentrl-candidates", "agentrl-generate", "trl-grpo", *ALGO_ENTRIES)
CELLS = [(s, p) for s in SPLITS for p in PROFILES]


@dataclass
class Budget:
    """What every entry gets; the table's caption prints it."""

    env: str = "AgentRL/SQLPythonSMTP-v0"  #: the env every entry plays
    episodes: int = 8  #: evaluation episodes per cell (split x profile x view)
    candidates: int = 4  #: K of the candidates view
    sb3_timesteps: int = 4096  #: SB3 PPO env steps per difficulty
    ppo_updates: int = 4  #: agentrl candidates-mode PPO updates (8 envs x 8 steps each) per difficulty
    sft_episodes: int = 32  #: oracle episodes behind agentrl's generate-mode warm start
    gen_updates: int = 1  #: agentrl generate-mode PPO updates (4 envs x 4 steps each) after sft
    trl_steps: int = 4  #: TRL GRPO optimizer steps (4 prompts x 2 generations each)
    #: token budget of one generated action (agentrl generate and TRL): the trainer's default, which holds
    #: the longest oracle call of every env (tiny tokens: 111 on SQLPythonSMTP-v0; `agentrl-train check-model tiny`)
    max_new_tokens: int = 160
    seed: int = 0  #: seed of every training run (but the algorithm rows')
    algo_budget: int = 512  #: env steps of every algorithm row's runs (bench_algorithms' equal budget)
    algo_seeds: str = "0,1,2"  #: the algorithm rows' training seeds, comma-separated


def eval_seeds(n: int) -> list[int]:
    """``agentrl_train.episodes.episode_seed(EVAL_SEED, j, 0)`` for j < n, without importing torch."""
    return [int(np.random.SeedSequence([EVAL_SEED, j, 0, 0]).generate_state(1)[0] & 0x7FFFFFFF) for j in range(n)]


def play(env: gym.Env[Any, Any], act: Callable[[Any, dict[str, Any]], Any], seeds: list[int]) -> dict[str, float]:
    """Episodes on ``seeds`` with ``act(observation, info) -> action``; success rate and mean return."""
    successes, returns = [], []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        ret, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(act(obs, info))
            ret, done = ret + float(reward), terminated or truncated
        successes.append(bool(info.get("success")))
        returns.append(ret)
    return {"success_rate": float(np.mean(successes)), "mean_return": float(np.mean(returns))}


def make_kwargs(b: Budget, split: str, profile: str, difficulty: str | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"split": split, "error_profile": profile}
    if difficulty:
        kw.update(candidates=b.candidates, candidates_difficulty=difficulty)
    return kw


# -- entries: each returns {view: {"train/none": {...}, ...}} ------------------------------------

Rows = dict[str, dict[str, dict[str, float]]]


def _no_model(b: Budget, agent: Callable[[gym.Env[Any, Any]], Any], difficulties: tuple[str | None, ...]) -> Rows:
    rows: Rows = {}
    for d in difficulties:
        view = f"candidates {d}" if d else "gold plan"
        rows[view] = {}
        for split, profile in CELLS:
            env = gym.make(b.env, **make_kwargs(b, split, profile, d))
            try:
                rows[view][f"{split}/{profile}"] = play(env, agent(env).act, eval_seeds(b.episodes))
            finally:
                env.close()
    return rows


def entry_random(b: Budget, runs: Path, retrain: bool) -> Rows:
    return _no_model(b, lambda env: RandomCandidateAgent(seed=0), DIFFICULTIES)


def entry_overlap(b: Budget, runs: Path, retrain: bool) -> Rows:
    return _no_model(b, lambda env: OverlapAgent(seed=0), DIFFICULTIES)


def entry_oracle(b: Budget, runs: Path, retrain: bool) -> Rows:
    return _no_model(b, OracleAgent, (None,))


class DamagedRun(ConfigError):
    """A run folder the leaderboard would reuse cannot be read; its entry is skipped with a warning."""


def _reusable(folder: Path, budget: dict[str, Any], done: str, retrain: bool) -> bool:
    """True when ``folder`` holds a finished run (``done`` exists) trained with ``budget``.

    Raises:
        DamagedRun: its budget stamp is unreadable (training again would overwrite a run that may be fine).
    """
    stamp = folder / "leaderboard-budget.json"
    if retrain or not (folder / done).exists() or not stamp.exists():
        return False
    try:
        saved = json.loads(stamp.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise DamagedRun(f"{stamp} is damaged ({exc}); delete {folder} or pass --retrain") from None
    if saved != budget:
        print(f"leaderboard: {folder} was trained with another budget; training again", flush=True)
        return False
    print(f"leaderboard: reusing {folder}", flush=True)
    return True


def _stamp(folder: Path, budget: dict[str, Any]) -> None:
    (folder / "leaderboard-budget.json").write_text(json.dumps(budget, sort_keys=True))


def entry_sb3_ppo(b: Budget, runs: Path, retrain: bool) -> Rows:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    from agentrl_envs.wrappers.candidates_discrete import CandidatesDiscrete

    rows: Rows = {}
    for d in DIFFICULTIES:
        folder = runs / f"sb3-ppo-{d}"
        budget = {"env": b.env, "candidates": b.candidates, "timesteps": b.sb3_timesteps, "seed": b.seed, "difficulty": d}
        if not _reusable(folder, budget, "model.zip", retrain):
            folder.mkdir(parents=True, exist_ok=True)
            kw = {"candidates": b.candidates, "candidates_difficulty": d, "split": "train", "render_mode": None}
            vec = make_vec_env(b.env, n_envs=2, seed=b.seed, wrapper_class=CandidatesDiscrete, env_kwargs=kw)
            model = PPO("MlpPolicy", vec, n_steps=256, batch_size=128, n_epochs=4, seed=b.seed, verbose=0)
            model.set_logger(Logger(folder=None, output_formats=[]))  # no empty /tmp/SB3-<time> folder per learn()
            model.learn(total_timesteps=b.sb3_timesteps)
            vec.close()
            model.save(folder / "model.zip")
            _stamp(folder, budget)
        model = PPO.load(folder / "model.zip", device="cpu")
        rows[f"candidates {d}"] = {}
        for split, profile in CELLS:
            env = CandidatesDiscrete(gym.make(b.env, **make_kwargs(b, split, profile, d)))
            try:
                act = lambda obs, info, m=model: int(m.predict(obs, deterministic=True)[0])  # noqa: E731
                rows[f"candidates {d}"][f"{split}/{profile}"] = play(env, act, eval_seeds(b.episodes))
            finally:
                env.close()
    return rows


def _agentrl(args: list[str]) -> None:
    """Run ``agentrl-train ARGS`` in a subprocess (what a user would type); fail loudly."""
    cmd = [sys.executable, "-m", "agentrl_train", *args]
    print("leaderboard: $ agentrl-train " + shlex.join(args), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"agentrl-train {args[0]} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")


def _run_args(b: Budget, folder: Path, command: str = "ppo") -> list[str]:
    """Seed, run folder, and no evaluation during training (the leaderboard evaluates afterwards).

    sft evaluates only at its end and shows no progress bar: it refuses ppo's flags for those.
    """
    quiet = ["--eval-episodes", "1", "--final-eval-splits", "[train]"]
    if command == "ppo":
        quiet += ["--eval-every", "0", "--no-progress", "--no-tensorboard"]
    return ["--seed", str(b.seed), "--out", str(folder), *quiet]


def _evaluate_run(b: Budget, folder: Path, difficulties: tuple[str | None, ...]) -> Rows:
    """Greedy evaluation of an agentrl run folder's ``final/`` policy (or a model folder for TRL).

    Raises:
        DamagedRun: its config.yaml or saved adapter cannot be read.
    """
    from agentrl_train.config_io import read_run_config
    from agentrl_train.evaluate import evaluate
    from agentrl_train.policy import build_policy

    try:
        cfg = read_run_config(folder, "run folder")
        cfg.model.init_adapter = ""
        policy = build_policy(cfg, log=lambda *a, **k: None)
        if (folder / "final").is_dir():
            policy.load_adapter_weights(folder / "final", option="run folder")
    except ConfigError as exc:
        raise DamagedRun(f"{exc}; delete {folder} or pass --retrain") from None
    rows: Rows = {}
    for d in difficulties:
        view = f"candidates {d}" if d else "generate"
        cfg.env.env_kwargs = {"candidates_difficulty": d} if d else {}
        rows[view] = {}
        for split, profile in CELLS:
            r = evaluate(policy, cfg, split, b.episodes, error_profile=profile)
            rows[view][f"{split}/{profile}"] = {"success_rate": r["success_rate"], "mean_return": r["mean_return"]}
    return rows


def entry_agentrl_candidates(b: Budget, runs: Path, retrain: bool) -> Rows:
    rows: Rows = {}
    for d in DIFFICULTIES:
        folder = runs / f"agentrl-candidates-{d}"
        budget = {"env": b.env, "candidates": b.candidates, "updates": b.ppo_updates, "seed": b.seed, "difficulty": d}
        if not _reusable(folder, budget, "final", retrain):
            mode = [
                "--mode",
                "candidates",
                "--candidates",
                str(b.candidates),
                "--env-kwargs",
                json.dumps({"candidates_difficulty": d}),
            ]
            _agentrl(["ppo", "--env", b.env, *mode, "--updates", str(b.ppo_updates), *_run_args(b, folder)])
            _stamp(folder, budget)
        rows.update(_evaluate_run(b, folder, (d,)))
    return rows


def entry_agentrl_generate(b: Budget, runs: Path, retrain: bool) -> Rows:
    sft_dir, folder = runs / "agentrl-sft", runs / "agentrl-generate"
    tokens = ["--max-new-tokens", str(b.max_new_tokens)]
    budget = {"env": b.env, "sft_episodes": b.sft_episodes, "updates": b.gen_updates, "seed": b.seed, "tokens": b.max_new_tokens}
    if not _reusable(folder, budget, "final", retrain):
        _agentrl(["sft", "--env", b.env, "--episodes", str(b.sft_episodes), *_run_args(b, sft_dir, "sft")])
        ppo = ["--mode", "generate", "--init-adapter", str(sft_dir / "final"), "--num-envs", "4", "--rollout-steps", "4"]
        _agentrl(["ppo", "--env", b.env, *ppo, "--updates", str(b.gen_updates), *tokens, *_run_args(b, folder)])
        _stamp(folder, budget)
    return _evaluate_run(b, folder, (None,))


def entry_trl_grpo(b: Budget, runs: Path, retrain: bool) -> Rows:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trl_grpo import train_grpo

    folder = runs / "trl-grpo"
    budget = {"env": b.env, "steps": b.trl_steps, "seed": b.seed, "tokens": b.max_new_tokens}
    if not _reusable(folder, budget, "model/config.json", retrain):
        train_grpo(b.env, steps=b.trl_steps, max_new_tokens=b.max_new_tokens, seed=b.seed, save_to=folder / "model")
        # A run folder agentrl's evaluation reads: generate mode over the saved model (a fresh LoRA is the identity).
        from agentrl_train.config_io import dump_config, load_config

        folder.mkdir(parents=True, exist_ok=True)
        cfg = load_config(None, {"model": str(folder / "model"), "env": b.env, "mode": "generate"})
        cfg.ppo.max_new_tokens = b.max_new_tokens
        dump_config(cfg, folder / "config.yaml")
        _stamp(folder, budget)
    return _evaluate_run(b, folder, (None,))


def parse_seeds(b: Budget) -> list[int]:
    """``--algo-seeds`` as a list.

    Raises:
        ConfigError: empty, not integers, or repeated.
    """
    try:
        seeds = [int(s) for s in b.algo_seeds.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--algo-seeds {b.algo_seeds!r}: use comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--algo-seeds {b.algo_seeds!r}: use distinct comma-separated integers, e.g. 0,1,2")
    return seeds


def entry_algorithm(algo: str, b: Budget, runs: Path, retrain: bool) -> Rows:
    """One algorithm's runs (one per seed) at the equal budget, each evaluated on every cell; mean and per-seed values."""
    root = runs / "algorithms" / f"budget{b.algo_budget}"
    seeds = parse_seeds(b)
    if retrain:
        for seed in seeds:
            shutil.rmtree(root / f"{algo}-seed{seed}", ignore_errors=True)
    ev = algorithms.Evaluation(
        cells=tuple(CELLS), episodes=b.episodes, env_kwargs={"candidates_difficulty": ALGO_VIEW}, name="leaderboard"
    )
    results, missing = algorithms.run_matrix([algo], seeds, b.algo_budget, root.resolve(), ev)
    if missing:
        raise RuntimeError(f"{algo}: runs {', '.join(missing)} failed; their logs are beside them in {root}")
    seed_runs = results[algo]
    cells = {}
    for split, profile in CELLS:
        key = f"{split}/{profile}"
        per_seed = [r["cells"][key]["success_rate"] for r in seed_runs]
        returns = [r["cells"][key]["mean_return"] for r in seed_runs]
        cells[key] = {"success_rate": float(np.mean(per_seed)), "mean_return": float(np.mean(returns)), "per_seed": per_seed}
    return {f"candidates {ALGO_VIEW}": cells}


RUNNERS: dict[str, Callable[[Budget, Path, bool], Rows]] = {
    "random": entry_random,
    "overlap": entry_overlap,
    "oracle": entry_oracle,
    "sb3-ppo": entry_sb3_ppo,
    "agentrl-candidates": entry_agentrl_candidates,
    "agentrl-generate": entry_agentrl_generate,
    "trl-grpo": entry_trl_grpo,
    **{e: (lambda b, runs, retrain, a=a: entry_algorithm(a, b, runs, retrain)) for e, a in ALGO_ENTRIES.items()},
}


# -- outputs ---------------------------------------------------------------------------------------


def caption(b: Budget, entries: list[str], command: str, seconds: dict[str, float]) -> str:
    budgets = {
        "sb3-ppo": f"SB3 PPO {b.sb3_timesteps} env steps per difficulty",
        "agentrl-candidates": f"agentrl candidates-mode PPO {b.ppo_updates} updates x 64 env steps per difficulty",
        "agentrl-generate": f"agentrl generate mode: sft on {b.sft_episodes} oracle episodes, then {b.gen_updates} PPO updates x 16 env steps",
        "trl-grpo": f"TRL GRPO {b.trl_steps} steps x 4 prompts x 2 generations",
    }
    trained = [budgets[e] for e in entries if e in budgets]
    algos = [e for e in entries if e in ALGO_ENTRIES]
    text = (
        f"Success rate on `{b.env}`, {b.episodes} fixed episodes per cell (the seeds of `agentrl-train eval`; trained "
        f"policies act greedily), candidates K={b.candidates}."
    )
    if trained:
        text += (
            f" Training budgets: {'; '.join(trained)}; the tiny model (`--model tiny`) for agentrl and TRL, generated actions"
            f" of at most {b.max_new_tokens} tokens; every run on the train split, profile none, seed {b.seed}."
        )
    if algos:
        cap = algorithms.STEPS_PER_UPDATE_MAX
        text += (
            f" Algorithm rows ({', '.join(algos)}): `agentrl-train ppo --mode candidates` with the tiny model on easy"
            f" candidates (K=4), {algorithms.NUM_ENVS} envs x windows of {algorithms.WINDOW} steps, training episodes of"
            f" at most {algorithms.WINDOW} steps, groups of {algorithms.GROUP}, the train split, profile none; every run"
            f" trained to {b.algo_budget} env steps (the update that reaches the budget finishes, so a run ends within"
            f" [{b.algo_budget}, {b.algo_budget + cap}) steps; `benchmarks/bench_algorithms.py`'s equal budget), once per"
            f" seed {', '.join(map(str, parse_seeds(b)))}; each cell is the mean (min-max) over the seeds of the greedy"
            f" success of the run's last checkpoint on the same episodes as the other rows (the env's own step limit)."
        )
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
    return f"{text} Wall time (training + evaluation): {timing}. Command: `{command}`."


def _label(entry: str, rows: Rows) -> str:
    """The table's name of an entry: an algorithm row says the algorithm and its seeds."""
    if entry not in ALGO_ENTRIES:
        return entry
    n = len(next(iter(next(iter(rows.values())).values()))["per_seed"])
    return f"{algorithms.ALGOS[ALGO_ENTRIES[entry]][0]}, {n} seed{'s' if n > 1 else ''}"


def _value(cell: dict[str, Any]) -> str:
    """A success rate, or ``mean (min-max)`` over seeds for an algorithm row."""
    return algorithms.spread(cell["per_seed"]) if "per_seed" in cell else f"{cell['success_rate']:.2f}"


def markdown(results: dict[str, Rows], b: Budget, command: str, seconds: dict[str, float]) -> str:
    """The table, the algorithm rows' differences to PPO (hierarchical) (or the first algorithm row), the caption."""
    keys = {f"{s}/{p}": f"{s} / {p}" for s, p in CELLS}
    lines = ["| entry | view | " + " | ".join(keys.values()) + " |", "|---|---|" + "---|" * len(CELLS)]
    for entry, rows in results.items():
        for view, cells in rows.items():
            lines.append(f"| {_label(entry, rows)} | {view} | " + " | ".join(_value(cells[k]) for k in keys) + " |")
    algo_rows = {_label(e, r): next(iter(r.values())) for e, r in results.items() if e in ALGO_ENTRIES}
    if len(algo_rows) > 1:
        ref = f"algo-{algorithms.REFERENCE}"
        reference = _label(ref, results[ref]) if ref in results else next(iter(algo_rows))
        values = {label: {k: cells[k]["per_seed"] for k in keys} for label, cells in algo_rows.items()}
        lines += ["", *algorithms.difference_table(values, reference, keys)]
    return "\n".join(lines) + "\n\n" + caption(b, list(results), command, seconds) + "\n"


def plot(results: dict[str, Rows], b: Budget, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{_label(e, rows)} ({v})" for e, rows in results.items() for v in rows]
    table = [[cells[f"{s}/{p}"] for s, p in CELLS] for rows in results.values() for cells in rows.values()]
    grid = np.array([[c["success_rate"] for c in row] for row in table])
    fig, ax = plt.subplots(figsize=(9.5, 0.5 * len(labels) + 1.6))
    ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(CELLS)), [f"{s}\n{p}" for s, p in CELLS])
    ax.set_yticks(range(len(labels)), labels)
    for i, j in np.ndindex(grid.shape):
        text = _value(table[i][j]).replace(" ", "\n")  # an algorithm row: the mean over (min-max)
        ax.text(j, i, text, ha="center", va="center", color="white" if grid[i, j] < 0.6 else "black", fontsize=8)
    title = f"success rate, {b.env}, {b.episodes} episodes per cell, seed {b.seed}\n(random, overlap and oracle rows are the baselines)"
    if any(e in ALGO_ENTRIES for e in results):
        title += f"\nalgorithm rows: mean (min-max) over the seeds {b.algo_seeds}"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


BUDGET_FIELDS = {
    "sb3-ppo": ("sb3_timesteps",),
    "agentrl-candidates": ("ppo_updates",),
    "agentrl-generate": ("sft_episodes", "gen_updates", "max_new_tokens"),
    "trl-grpo": ("trl_steps", "max_new_tokens"),
    **{e: ("algo_budget", "algo_seeds") for e in ALGO_ENTRIES},
}


def entry_budget(b: Budget, entry: str) -> dict[str, Any]:
    """The part of the budget an entry's results depend on (the key of its saved results)."""
    return {k: getattr(b, k) for k in ("env", "episodes", "candidates", "seed", *BUDGET_FIELDS.get(entry, ()))}


def main(argv: list[str] | None = None) -> int:
    defaults = Budget()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"comma-separated, from {', '.join(ENTRIES)} (default: all)")
    for name, value in asdict(defaults).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value, help=f"(default: {value})")
    ap.add_argument("--runs", default="runs/leaderboard", help="folder of the trained runs (reused when the budget matches)")
    ap.add_argument("--retrain", action="store_true", help="train every trained entry again")
    ap.add_argument(
        "--reuse-results",
        action="store_true",
        help="take an entry's table rows from RUNS/results/ENTRY.json when its budget matches (no evaluation)",
    )
    ap.add_argument(
        "--md", default="docs/results/leaderboard-table.md", help="Markdown table (default: docs/results/leaderboard-table.md)"
    )
    ap.add_argument("--png", default="docs/img/leaderboard.png", help="PNG (default: docs/img/leaderboard.png; '' for none)")
    ap.add_argument("--json", default="", help="also write the raw results here")
    args = ap.parse_args(argv)
    entries = [e.strip() for e in args.entries.split(",") if e.strip()]
    unknown = [e for e in entries if e not in RUNNERS]
    if unknown or not entries:
        raise ConfigError(f"--entries: unknown {unknown or 'empty list'}; use a comma-separated subset of {', '.join(ENTRIES)}")
    b = Budget(**{k: getattr(args, k) for k in asdict(defaults)})
    if b.episodes < 1:
        raise ConfigError(f"--episodes {b.episodes}: use a positive number")
    if any(e in ALGO_ENTRIES for e in entries):
        parse_seeds(b)
        if b.algo_budget < 1:
            raise ConfigError(f"--algo-budget {b.algo_budget}: use a positive number of env steps (default 512)")
        if (b.env, b.candidates) != (algorithms.ENV, 4):
            raise ConfigError(
                f"--env {b.env} --candidates {b.candidates}: the algorithm rows train on {algorithms.ENV} with K=4;"
                " use those, or leave the algo-* entries out of --entries"
            )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # The command that reproduces the numbers: the entries and every budget option off its default (output,
    # cache and reuse options do not change a number: the episodes are fixed and every run is seeded).
    shown = ([] if entries == list(ENTRIES) else ["--entries", ",".join(entries)]) + [
        f"--{k.replace('_', '-')}={v}" for k, v in asdict(b).items() if v != getattr(defaults, k)
    ]
    command = shlex.join(["python", "benchmarks/leaderboard.py", *shown])
    results: dict[str, Rows] = {}
    seconds: dict[str, float] = {}
    for entry in entries:
        cache = Path(args.runs) / "results" / f"{entry}.json"
        saved = algorithms.saved_results(cache, entry_budget(b, entry), "leaderboard") if args.reuse_results else None
        if saved is not None:
            results[entry], seconds[entry] = saved["rows"], saved["seconds"]
            print(f"leaderboard: {entry}: reusing the results in {cache}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            results[entry] = RUNNERS[entry](b, Path(args.runs), args.retrain)
        except DamagedRun as exc:
            print(f"leaderboard: warning: skipping {entry}: {exc}", file=sys.stderr, flush=True)
            continue
        seconds[entry] = time.perf_counter() - t0
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"budget": entry_budget(b, entry), "rows": results[entry], "seconds": seconds[entry]}))
        print(f"leaderboard: {entry} done in {seconds[entry]:.0f} s", flush=True)
    if not results:
        raise ConfigError("every entry was skipped (see the warnings above); nothing to tabulate")
    table = markdown(results, b, command, seconds)
    Path(args.md).parent.mkdir(parents=True, exist_ok=True)
    Path(args.md).write_text(table, encoding="utf-8")
    if args.png:
        plot(results, b, Path(args.png))
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": asdict(b), "results": results, "seconds": seconds}, indent=1))
    print(table, end="")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as exc:
        print(f"leaderboard: error: {exc}", file=sys.stderr)
        sys.exit(2)
