"""Evaluation of a policy on fixed episodes of a split (optionally under a fault profile): greedy by
default, or sampled from the policy with seeds fixed per episode."""

from __future__ import annotations

import json
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from agentrl_train.episodes import EpisodeStates, episode_seed
from agentrl_train.rollout import act_many

__all__ = ["EVAL_SEED", "evaluate", "evaluate_run", "evaluate_splits", "load_run", "markdown_table"]

EVAL_SEED = 1_000_003  #: evaluation episodes use seeds disjoint from any training run's


@torch.no_grad()
def evaluate(
    policy: Any,
    cfg: Any,
    split: str,
    episodes: int,
    *,
    error_profile: str | None = None,
    sample: bool = False,
    transcripts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Greedy episodes ``0..episodes-1`` of ``split``; the same episodes for every policy and run.

    Up to ``cfg.env.num_envs`` episodes run side by side (in generate mode their tokens are decoded
    in one batch); episode ``j`` always has the seed ``episode_seed(EVAL_SEED, j, 0)`` and, with
    ``sample=True``, draws its actions from a generator seeded by ``j`` alone, so the results do not
    depend on how many run at once. The policy reads each episode through
    :class:`~agentrl_train.episodes.EpisodeStates`, as in training: generate mode sees the same
    token stream (token in, token out) as a rollout.

    ``sample=True`` gives the stochastic policy's success, which a greedy evaluation can hide (a
    near-uniform policy's greedy choice follows its smallest differences).

    Returns ``success_rate``, ``mean_return``, ``mean_length``, ``policy`` (``greedy`` or ``sampled``)
    and, when any fault happened, the fault ``recovery_rate`` (episodes with a fault that still succeeded).
    ``transcripts``, when given, receives one record per episode in episode order: ``episode``,
    ``seed``, ``task_id``, ``instruction``, ``steps`` (each ``action``, ``observation``, ``reward``,
    ``tool``, ``call_format``), ``success``, ``return``, ``length``, ``faults``.
    """
    kwargs = _make_kwargs(cfg, split, error_profile)
    width = max(1, min(episodes, int(getattr(cfg.env, "num_envs", 1) or 1)))
    envs = [gym.make(cfg.env.env, **kwargs) for _ in range(width)]
    slots = EpisodeStates(width)
    running: dict[int, dict[str, Any]] = {}  # slot -> {"episode", "return", "length"}
    results: dict[int, dict[str, Any]] = {}
    heads: dict[int, dict[str, Any]] = {}  # episode -> its transcript (with ``transcripts``)
    policy.eval()
    next_episode = 0

    def begin(k: int) -> None:
        nonlocal next_episode
        j = next_episode
        next_episode += 1
        seed = episode_seed(EVAL_SEED, j, 0)
        obs, info = envs[k].reset(seed=seed)
        slots.generators[k].manual_seed(episode_seed(EVAL_SEED, j, 1))
        slots.start(k, obs, info)
        running[k] = {"episode": j, "return": 0.0, "length": 0}
        if transcripts is not None:
            heads[j] = {"episode": j, "seed": seed, "task_id": info.get("task_id"), "instruction": obs, "steps": []}

    try:
        for k in range(width):
            begin(k)
        while running:
            ks = sorted(running)
            for k, tr in zip(ks, act_many(policy, slots, ks, cfg, greedy=not sample, reference=False)):
                obs, r, term, trunc, info = envs[k].step(tr.action_text)
                ep = running[k]
                ep["return"] += float(r)
                ep["length"] += 1
                if transcripts is not None:
                    heads[ep["episode"]]["steps"].append(_transcript_step(tr.action_text, obs, r, info))
                if term or trunc:
                    results[ep["episode"]] = _episode_result(ep, info)
                    del running[k]
                    if next_episode < episodes:
                        begin(k)
                else:
                    slots.advance(policy, k, tr, obs, info, cfg)
    finally:
        for env in envs:
            env.close()
    done = [results[j] for j in sorted(results)]
    if transcripts is not None:
        transcripts.extend({**heads[j], **results[j]} for j in sorted(results))
    return _summary(done, split, episodes, kwargs["error_profile"], sample)


def _make_kwargs(cfg: Any, split: str, error_profile: str | None) -> dict[str, Any]:
    """``gym.make`` keywords of an evaluation env: the run's env options on ``split`` (and ``error_profile``)."""
    kwargs: dict[str, Any] = {"split": split, "error_profile": error_profile or cfg.env.error_profile, **cfg.env.env_kwargs}
    if cfg.env.mode == "candidates":
        kwargs["candidates"] = cfg.env.candidates
    return kwargs


def _transcript_step(action: str, obs: Any, reward: Any, info: dict[str, Any]) -> dict[str, Any]:
    """One step of an episode's transcript."""
    return {
        "action": action,
        "observation": obs,
        "reward": float(reward),
        "tool": info.get("tool"),
        "call_format": info.get("call_format"),
    }


def _episode_result(ep: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """An ended episode's outcome (``info``: its last step's)."""
    fs = info.get("fault_stats") or {}
    return {
        "success": bool(info.get("success")),
        "return": ep["return"],
        "length": ep["length"],
        "faults": int(fs.get("faults", 0) or 0),
    }


def _summary(done: list[dict[str, Any]], split: str, episodes: int, error_profile: str, sample: bool) -> dict[str, Any]:
    """The evaluation's row: success, return and length over the episodes ``done``, and recovery from faults."""
    faulted = [r for r in done if r["faults"] > 0]
    return {
        "split": split,
        "episodes": episodes,
        "error_profile": error_profile,
        "policy": "sampled" if sample else "greedy",
        "success_rate": float(np.mean([r["success"] for r in done])) if done else math.nan,
        "mean_return": float(np.mean([r["return"] for r in done])) if done else math.nan,
        "mean_length": float(np.mean([r["length"] for r in done])) if done else math.nan,
        "episodes_with_faults": len(faulted),
        "recovery_rate": float(np.mean([r["success"] for r in faulted])) if faulted else None,
    }


def evaluate_splits(policy: Any, cfg: Any, splits: list[str], episodes: int) -> dict[str, dict[str, Any]]:
    return {s: evaluate(policy, cfg, s, episodes) for s in splits}


def final_eval(policy: Any, cfg: Any, out: Any, log: Any) -> dict[str, dict[str, Any]]:
    """The end-of-run table over ``--final-eval-splits``, written to ``out/eval.json`` and ``eval.md`` and logged.

    With no splits nothing is evaluated, and an earlier run's table in ``out`` is removed: it would
    describe weights ``final/`` no longer holds.
    """
    from pathlib import Path

    out = Path(out)
    if not cfg.run.final_eval_splits:
        for stale in ("eval.json", "eval.md"):
            (out / stale).unlink(missing_ok=True)
        log("final evaluation skipped (--final-eval-splits is empty)")
        return {}
    table = evaluate_splits(policy, cfg, cfg.run.final_eval_splits, cfg.run.eval_episodes)
    (out / "eval.json").write_text(json.dumps(table, indent=2))
    (out / "eval.md").write_text(markdown_table(table))
    log(markdown_table(table))
    return table


def markdown_table(table: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| split | episodes | profile | success | mean return | mean length | fault recovery |",
        "|---|---|---|---|---|---|---|",
    ]
    for split, r in table.items():
        rec = "-" if r.get("recovery_rate") is None else f"{r['recovery_rate']:.2f} ({r['episodes_with_faults']} ep.)"
        lines.append(
            f"| {split} | {r['episodes']} | {r['error_profile']} | {r['success_rate']:.2f} | {r['mean_return']:.2f} | {r['mean_length']:.1f} | {rec} |"
        )
    return "\n".join(lines) + "\n"


def evaluate_run(
    run: str,
    split: str,
    episodes: int,
    *,
    error_profile: str | None = None,
    checkpoint: str | None = None,
    sample: bool = False,
    transcripts: str | None = None,
) -> dict[str, Any]:
    """Evaluate a run folder's policy (``final/``, or ``checkpoints/NAME``) on ``split``.

    ``transcripts``: a file to write every episode to, one JSON object per line (see :func:`evaluate`).

    Raises:
        ConfigError: not a run folder, or no saved policy in it, or the transcripts file cannot be written.
    """
    from agentrl_envs.errors import ConfigError

    if episodes < 1:
        raise ConfigError(f"--episodes {episodes}: use a positive number")
    if not str(run).strip():  # Path("") is the current folder
        raise ConfigError(f"--run {run!r}: name a run folder (the --out folder of a ppo or sft run)")
    if error_profile is not None and not error_profile.strip():  # "" was the run's own profile, silently
        raise ConfigError(
            f"--error-profile {error_profile!r}: name a fault profile (e.g. none or realistic, or a .yaml path), "
            "or drop the option for the run's own"
        )
    sink = _transcript_file(transcripts) if transcripts is not None else None
    policy, cfg = load_run(run, checkpoint)
    records: list[dict[str, Any]] | None = [] if sink is not None else None
    result = evaluate(policy, cfg, split, episodes, error_profile=error_profile, sample=sample, transcripts=records)
    if sink is not None and records is not None:
        sink.write_text("".join(json.dumps(r) + "\n" for r in records))
    return result


def _transcript_file(path: str) -> Any:
    """The ``--transcripts`` path, checked before the evaluation runs (a bad path fails in seconds, not after it)."""
    from pathlib import Path

    from agentrl_envs.errors import ConfigError

    if not str(path).strip():
        raise ConfigError("--transcripts '': name a file to write (JSON lines)")
    f = Path(path)
    if f.is_dir():
        raise ConfigError(f"--transcripts {path}: that is a folder; name a file, e.g. {f / 'transcripts.jsonl'}")
    if not f.parent.is_dir():
        raise ConfigError(f"--transcripts {path}: no folder {f.parent}; create it first")
    if f.exists() and not f.is_file():
        raise ConfigError(f"--transcripts {path}: not a regular file")
    return f


def load_run(run: str, checkpoint: str | None = None) -> tuple[Any, Any]:
    """A run folder's saved policy (``final/``, or ``checkpoints/NAME``; ``latest`` for the newest) and its config.

    The folder's files are checked before the model is built: a damaged one is named in the error.

    Raises:
        ConfigError: not a run folder, no saved policy in it, or a damaged file (named).
    """
    from pathlib import Path

    from agentrl_envs.errors import ConfigError
    from agentrl_train.config import CRITIC_ADVANTAGES
    from agentrl_train.config_io import read_run_config
    from agentrl_train.policy import build_policy

    folder = Path(run)
    cfg = read_run_config(folder, "--run")
    cfg.model.init_adapter = ""
    if checkpoint is not None:  # "" is refused by name: it evaluated final/, silently
        f = _checkpoint_file(folder, checkpoint)
    else:
        final = folder / "final"
        if not final.is_dir():
            raise ConfigError(f"--run {run}: no final/ folder (the run did not finish); use --checkpoint latest")
        needs = [final / cfg.model.adapter / "adapter_model.safetensors"]
        if cfg.ppo.advantage in CRITIC_ADVANTAGES:  # a group advantage trains no value head
            needs.append(final / "value_head.safetensors")
        for need in needs:
            if not need.is_file():
                raise ConfigError(f"--run {run}: {need} is missing (a damaged final/); use --checkpoint latest")
    policy = build_policy(cfg, log=lambda *a, **k: None)
    if checkpoint is not None:
        _load_checkpoint_weights(policy, f, checkpoint)
    else:
        policy.load_adapter_weights(folder / "final", option="--run")
    return policy, cfg


def _checkpoint_file(folder: Any, checkpoint: str) -> Any:
    from agentrl_envs.errors import ConfigError
    from agentrl_train.checkpoint import CheckpointError, checkpoint_folder, is_checkpoint_name

    ckpts = folder / "checkpoints"
    name = checkpoint
    if checkpoint == "latest":
        try:
            name = checkpoint_folder(folder, "--checkpoint latest").name
        except CheckpointError as exc:
            raise ConfigError(str(exc)) from None
    if not is_checkpoint_name(name) or (ckpts / name).is_symlink():
        raise ConfigError(
            f"--checkpoint {checkpoint[:40]!r}: {name[:40]!r} is not a checkpoint name (e.g. update-000010, or latest)"
        )
    f = ckpts / name / "trainable.safetensors"
    if not f.is_file():
        have = sorted(p.name for p in ckpts.glob("update-*")) if ckpts.is_dir() else []
        raise ConfigError(f"--checkpoint {checkpoint}: no {f}; this run has {', '.join(have) or 'no checkpoints'}")
    return f


def _load_checkpoint_weights(policy: Any, f: Any, checkpoint: str) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from agentrl_envs.errors import ConfigError

    try:
        weights = load_file(f)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--checkpoint {checkpoint}: {f} is damaged ({reason})") from None
    with torch.no_grad():
        for n, p in policy.trainable_parameters():
            if n not in weights or weights[n].shape != p.shape:
                raise ConfigError(f"--checkpoint {checkpoint}: {f} does not fit this run's model ({n})")
            p.copy_(weights[n])
