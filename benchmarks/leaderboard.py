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

Trained entries train on the train split with the profile ``none`` and are then evaluated everywhere.
Their runs live in ``--runs`` (default ``runs/leaderboard``) and are reused when a run with the same
budget is there (``--retrain`` trains again); every entry's rows are also saved in
``RUNS/results/ENTRY.json``, and ``--reuse-results`` takes them from there instead of evaluating again
(so entries can be run one at a time and the table assembled at the end). Outputs: ``--md`` (Markdown table, its caption says the
budgets and the command), ``--png`` and ``--json``::

    python benchmarks/leaderboard.py                                   # make leaderboard
    python benchmarks/leaderboard.py --entries random,overlap,oracle --episodes 8

Only the trained entries import torch (lazily).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED = 1_000_003  #: agentrl_train.evaluate.EVAL_SEED: every entry plays the episodes `agentrl-train eval` plays
SPLITS = ("train", "test", "heldout")
PROFILES = ("none", "realistic")
DIFFICULTIES = ("easy", "hard")
ENTRIES = ("random", "overlap", "oracle", "sb3-ppo", "agentrl-candidates", "agentrl-generate", "trl-grpo")
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
    seed: int = 0  #: seed of every training run


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
    from trl_tiny import train_grpo

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


RUNNERS: dict[str, Callable[[Budget, Path, bool], Rows]] = {
    "random": entry_random,
    "overlap": entry_overlap,
    "oracle": entry_oracle,
    "sb3-ppo": entry_sb3_ppo,
    "agentrl-candidates": entry_agentrl_candidates,
    "agentrl-generate": entry_agentrl_generate,
    "trl-grpo": entry_trl_grpo,
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
    text = (
        f"Success rate on `{b.env}`, {b.episodes} fixed episodes per cell (the seeds of `agentrl-train eval`; trained "
        f"policies act greedily), candidates K={b.candidates}."
    )
    if trained:
        text += (
            f" Training budgets: {'; '.join(trained)}; the tiny model (`--model tiny`) for agentrl and TRL, generated actions"
            f" of at most {b.max_new_tokens} tokens; every run on the train split, profile none, seed {b.seed}."
        )
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
    return f"{text} Wall time (training + evaluation): {timing}. Command: `{command}`."


def markdown(results: dict[str, Rows], b: Budget, command: str, seconds: dict[str, float]) -> str:
    head = "| entry | view | " + " | ".join(f"{s} / {p}" for s, p in CELLS) + " |"
    lines = [head, "|---|---|" + "---|" * len(CELLS)]
    for entry, rows in results.items():
        for view, cells in rows.items():
            values = " | ".join(f"{cells[f'{s}/{p}']['success_rate']:.2f}" for s, p in CELLS)
            lines.append(f"| {entry} | {view} | {values} |")
    return "\n".join(lines) + "\n\n" + caption(b, list(results), command, seconds) + "\n"


def plot(results: dict[str, Rows], b: Budget, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{e} ({v})" for e, rows in results.items() for v in rows]
    grid = np.array(
        [[cells[f"{s}/{p}"]["success_rate"] for s, p in CELLS] for rows in results.values() for cells in rows.values()]
    )
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(labels) + 1.6))
    ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(CELLS)), [f"{s}\n{p}" for s, p in CELLS])
    ax.set_yticks(range(len(labels)), labels)
    for i, j in np.ndindex(grid.shape):
        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="white" if grid[i, j] < 0.6 else "black")
    ax.set_title(
        f"success rate, {b.env}, {b.episodes} episodes per cell, seed {b.seed}\n"
        "(random, overlap and oracle rows are the baselines)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


BUDGET_FIELDS = {
    "sb3-ppo": ("sb3_timesteps",),
    "agentrl-candidates": ("ppo_updates",),
    "agentrl-generate": ("sft_episodes", "gen_updates", "max_new_tokens"),
    "trl-grpo": ("trl_steps", "max_new_tokens"),
}


def entry_budget(b: Budget, entry: str) -> dict[str, Any]:
    """The part of the budget an entry's results depend on (the key of its saved results)."""
    return {k: getattr(b, k) for k in ("env", "episodes", "candidates", "seed", *BUDGET_FIELDS.get(entry, ()))}


def _saved_results(cache: Path, budget: dict[str, Any]) -> dict[str, Any] | None:
    """An entry's saved rows when ``cache`` holds them for ``budget``; None otherwise (a damaged cache is evaluated again)."""
    if not cache.exists():
        return None
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved["budget"] != budget:
            return None
        if not isinstance(saved["rows"], dict) or not isinstance(saved["seconds"], (int, float)):
            raise ValueError("rows or seconds of the wrong type")
    except (ValueError, OSError, KeyError, TypeError) as exc:
        print(f"leaderboard: warning: {cache} is damaged ({exc}); evaluating again", file=sys.stderr, flush=True)
        return None
    return saved


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
        saved = _saved_results(cache, entry_budget(b, entry)) if args.reuse_results else None
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
