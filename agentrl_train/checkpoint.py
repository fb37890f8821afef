"""Checkpoints with exact resume: trainable weights, optimizer, every RNG, env seeds and episode state.

A checkpoint is a folder ``checkpoints/update-NNNNNN/`` written to a temporary name and renamed, so
it is complete or absent; ``checkpoints/latest`` names the newest, and only a name of that form
inside the run folder is accepted from it. Nothing in a checkpoint is pickled: the trainable weights
are ``trainable.safetensors``, the rest (optimizer, RNG states, each rank's env state) JSON plus
safetensors (:mod:`agentrl_train.statefile`), so loading a checkpoint someone sent cannot run code;
a folder in the older pickle format (``state.pt``) is refused, not read. Resuming restores the weights,
the optimizer, the SGD generator, each env's sampling generator and its current episode (reset on
its seed, actions replayed), so a stopped and resumed run ends with the same parameters as one that
was not stopped (same seed, CPU).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl_envs.errors import AgentRLError
from agentrl_train.statefile import StateFileError, load_tree, save_tree

__all__ = ["CheckpointError", "checkpoint_folder", "is_checkpoint_name", "load_latest", "save"]

_NAME = re.compile(r"update-[0-9]{6,12}")


class CheckpointError(AgentRLError):
    """A checkpoint is missing, incomplete or does not match this run."""


def _dir(out: Path) -> Path:
    return out / "checkpoints"


def save(
    out: Path,
    update: int,
    global_steps: int,
    policy: Any,
    optimizer: Any,
    pool: Any,
    sgd_rng: Any,
    history: list[Any],
    dist: Any,
    keep: int = 2,
    pending: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``update`` (every rank writes its env state; rank 0 the rest).

    ``pending``: this rank's rollout already collected for the next update (``--async-rollouts 1``,
    :func:`agentrl_train.rollout_engine.rollout_state`), kept beside its env state.
    """
    from safetensors.torch import save_file

    root = _dir(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"update-{update:06d}"
    tmp = root / f".tmp-update-{update:06d}-rank{dist.rank}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_tree(tmp / f"envs-rank{dist.rank}", {"pool": pool.state(), "rank": dist.rank, "world": dist.world, "pending": pending})
    if dist.is_main:
        save_file({n: p.detach().cpu().contiguous() for n, p in policy.trainable_parameters()}, tmp / "trainable.safetensors")
        save_tree(
            tmp / "state",
            {
                "update": update,
                "global_steps": global_steps,
                "optimizer": optimizer.state_dict(),
                "sgd_rng": sgd_rng.bit_generator.state,
                "python_rng": random.getstate(),
                "numpy_rng": np.random.get_state(),
                "torch_rng": torch.get_rng_state(),
                "history": history,
                "world": dist.world,
            },
        )
    dist.barrier()
    if dist.is_main:
        final.mkdir(exist_ok=True)
    dist.barrier()
    for f in tmp.iterdir():
        os.replace(f, final / f.name)
    tmp.rmdir()
    dist.barrier()
    if dist.is_main:
        (final / "complete").write_text("ok\n")
        (root / "latest.tmp").write_text(final.name + "\n")
        os.replace(root / "latest.tmp", root / "latest")
        _prune(root, keep=keep, current=update)
    dist.barrier()
    return final


def load_latest(
    out: Path, policy: Any, optimizer: Any, pool: Any, sgd_rng: Any, *, rank: int = 0, world: int = 1
) -> dict[str, Any]:
    """Restore the newest complete checkpoint of the run folder ``out``.

    Raises:
        CheckpointError: none there, one that is incomplete or corrupt, or another world size.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = checkpoint_folder(out)
    if not (folder / "complete").exists():
        raise CheckpointError(f"--resume: checkpoint {folder} is incomplete; delete it and point 'latest' at an older one")
    if (folder / "state.pt").exists() and not (folder / "state.json").exists():
        raise CheckpointError(
            f"--resume: checkpoint {folder} is in the old pickle format (state.pt), which is not loaded because "
            "unpickling runs code; start the run again without --resume (its final/ adapter still loads)"
        )
    try:
        weights = load_file(folder / "trainable.safetensors")
        state = load_tree(folder / "state")
        envs = load_tree(folder / f"envs-rank{rank}")
    except FileNotFoundError as exc:
        raise CheckpointError(f"--resume: checkpoint {folder} lacks {Path(exc.filename or '').name}") from None
    except StateFileError as exc:
        raise CheckpointError(f"--resume: checkpoint {folder} is corrupt ({exc})") from None
    except (SafetensorError, RuntimeError, OSError, ValueError) as exc:
        raise CheckpointError(f"--resume: checkpoint {folder} is corrupt ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(state, dict) or not isinstance(envs, dict) or "pool" not in envs:
        raise CheckpointError(f"--resume: checkpoint {folder} is corrupt (its state files do not hold a training state)")
    if state.get("world", 1) != world:
        raise CheckpointError(
            f"--resume: checkpoint {folder} was written by {state.get('world')} ranks, this run has {world}; "
            "resume with the same world size"
        )
    params = dict(policy.trainable_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise CheckpointError(
            f"--resume: checkpoint {folder} does not fit this model (missing {missing[0]}); same --model and LoRA settings?"
        )
    with torch.no_grad():
        for name, p in params.items():
            if weights[name].shape != p.shape:
                raise CheckpointError(
                    f"--resume: {name} has shape {tuple(weights[name].shape)} in the checkpoint, {tuple(p.shape)} here"
                )
            p.copy_(weights[name])
    try:
        optimizer.load_state_dict(state["optimizer"])
        sgd_rng.bit_generator.state = state["sgd_rng"]
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        torch.set_rng_state(state["torch_rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise CheckpointError(f"--resume: checkpoint {folder} is corrupt ({type(exc).__name__}: {str(exc)[:200]})") from None
    pool.restore(envs["pool"])
    return {**state, "pending": envs.get("pending")}


def is_checkpoint_name(name: str) -> bool:
    """``update-`` and 6-12 digits: the only names a checkpoint folder has."""
    return bool(_NAME.fullmatch(name))


def checkpoint_folder(out: Path, option: str = "--resume") -> Path:
    """The checkpoint ``checkpoints/latest`` names: an ``update-N`` folder directly inside the run folder.

    ``latest`` is a file a stranger may have written: anything but such a name (a path, ``..``, a
    symbolic link leading elsewhere) is refused before any file is opened.
    """
    root = _dir(out)
    latest = root / "latest"
    if not latest.is_file():
        raise CheckpointError(f"{option}: no checkpoint in {root}; run without {option} to start fresh")
    if latest.stat().st_size > 64:
        raise CheckpointError(f"{option}: {latest} is not a checkpoint name (it should hold e.g. update-000010)")
    name = latest.read_text(encoding="utf-8", errors="replace").strip()
    if not _NAME.fullmatch(name):
        raise CheckpointError(f"{option}: {latest} names {name[:40]!r}, not a checkpoint of this run (e.g. update-000010)")
    folder = root / name
    if folder.is_symlink() or not folder.is_dir() or folder.resolve().parent != root.resolve():
        raise CheckpointError(f"{option}: {folder} is not a checkpoint folder inside {root}")
    return folder


def _step(folder: Path) -> int | None:
    """The update number of ``update-N`` (None for any other name)."""
    digits = folder.name.removeprefix("update-")
    return int(digits) if folder.name.startswith("update-") and digits.isdigit() else None


def _prune(root: Path, keep: int, current: int) -> None:
    """Keep the checkpoint of update ``current`` and the ``keep - 1`` newest before it, by update number.

    By number, not name (``update-1000000`` sorts before ``update-999999``); checkpoints after
    ``current`` (left by an earlier run in this folder) are not this run's to prune.
    """
    older = sorted(
        (step, p)
        for p in root.glob("update-*")
        if (step := _step(p)) is not None and step < current and (p / "complete").exists()
    )
    for _, p in older[: max(len(older) - (max(keep, 1) - 1), 0)]:
        shutil.rmtree(p, ignore_errors=True)
