"""Evaluation of a policy on fixed episodes of a split (optionally under a fault profile): greedy by
default, or sampled from the policy with seeds fixed per episode."""

from __future__ import annotations

import json
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from agentrl_train.rollout import act, episode_seed

__all__ = ["EVAL_SEED", "evaluate", "evaluate_run", "evaluate_splits", "load_run", "markdown_table"]

EVAL_SEED = 1_000_003  #: evaluation episodes use seeds disjoint from any training run's


class _Slot:
    """The per-env state :func:`agentrl_train.rollout.act` reads, for one plain env."""

    def __init__(self) -> None:
        self.first_index = 0
        self.messages: list[list[dict[str, str]]] = [[]]
        self.tools: list[Any] = [None]
        self.infos: list[dict[str, Any]] = [{}]
        self.generators = [torch.Generator().manual_seed(0)]
        self.prompt_states: list[dict[str, Any]] = [{}]


@torch.no_grad()
def evaluate(
    policy: Any, cfg: Any, split: str, episodes: int, *, error_profile: str | None = None, sample: bool = False
) -> dict[str, Any]:
    """Greedy episodes ``0..episodes-1`` of ``split``; the same episodes for every policy and run.

    With ``sample=True`` the actions are drawn from the policy instead, from a generator seeded per
    episode (the same draws for the same policy; the stochastic policy's success, which a greedy
    evaluation can hide: a near-uniform policy's greedy choice follows its smallest differences).

    Returns ``success_rate``, ``mean_return``, ``mean_length``, ``policy`` (``greedy`` or ``sampled``)
    and, when any fault happened, the fault ``recovery_rate`` (episodes with a fault that still succeeded).
    """
    kwargs: dict[str, Any] = {"split": split, "error_profile": error_profile or cfg.env.error_profile, **cfg.env.env_kwargs}
    if cfg.env.mode == "candidates":
        kwargs["candidates"] = cfg.env.candidates
    env = gym.make(cfg.env.env, **kwargs)
    slot = _Slot()
    policy.eval()
    results = []
    try:
        for j in range(episodes):
            obs, info = env.reset(seed=episode_seed(EVAL_SEED, j, 0))
            slot.generators[0].manual_seed(episode_seed(EVAL_SEED, j, 1))
            slot.messages[0] = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
            slot.tools[0], slot.infos[0] = info["tools"], info
            slot.prompt_states[0] = {}
            ret, n, done = 0.0, 0, False
            while not done:
                tr = act(policy, slot, 0, cfg, greedy=not sample, reference=False)
                obs, r, term, trunc, info = env.step(tr.action_text)
                slot.messages[0] += [{"role": "assistant", "content": tr.action_text}, {"role": "tool", "content": str(obs)}]
                slot.infos[0] = info
                ret, n, done = ret + float(r), n + 1, term or trunc
            fs = info.get("fault_stats") or {}
            results.append(
                {"success": bool(info.get("success")), "return": ret, "length": n, "faults": int(fs.get("faults", 0) or 0)}
            )
    finally:
        env.close()
    faulted = [r for r in results if r["faults"] > 0]
    return {
        "split": split,
        "episodes": episodes,
        "error_profile": kwargs["error_profile"],
        "policy": "sampled" if sample else "greedy",
        "success_rate": float(np.mean([r["success"] for r in results])) if results else math.nan,
        "mean_return": float(np.mean([r["return"] for r in results])) if results else math.nan,
        "mean_length": float(np.mean([r["length"] for r in results])) if results else math.nan,
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
) -> dict[str, Any]:
    """Evaluate a run folder's policy (``final/``, or ``checkpoints/NAME``) on ``split``.

    Raises:
        ConfigError: not a run folder, or no saved policy in it.
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
    policy, cfg = load_run(run, checkpoint)
    return evaluate(policy, cfg, split, episodes, error_profile=error_profile, sample=sample)


def load_run(run: str, checkpoint: str | None = None) -> tuple[Any, Any]:
    """A run folder's saved policy (``final/``, or ``checkpoints/NAME``; ``latest`` for the newest) and its config.

    The folder's files are checked before the model is built: a damaged one is named in the error.

    Raises:
        ConfigError: not a run folder, no saved policy in it, or a damaged file (named).
    """
    from pathlib import Path

    from agentrl_envs.errors import ConfigError
    from agentrl_train.config import read_run_config
    from agentrl_train.train import build_policy

    folder = Path(run)
    cfg = read_run_config(folder, "--run")
    cfg.model.init_adapter = ""
    if checkpoint is not None:  # "" is refused by name: it evaluated final/, silently
        f = _checkpoint_file(folder, checkpoint)
    else:
        final = folder / "final"
        if not final.is_dir():
            raise ConfigError(f"--run {run}: no final/ folder (the run did not finish); use --checkpoint latest")
        for need in (final / cfg.model.adapter / "adapter_model.safetensors", final / "value_head.safetensors"):
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
