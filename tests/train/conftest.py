"""Fixtures for the trainer's tests: a small tiny model (built once per machine, cached) and configs."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

SMALL = {"tiny_pretrain_steps": 30, "tiny_corpus_episodes": 8}


def small_config(tmp_path: Any, **overrides: Any) -> Any:
    from agentrl_train.config import load_config

    opts: dict[str, Any] = {
        **SMALL,
        "num_envs": 2,
        "rollout_steps": 4,
        "updates": 2,
        "vectorization": "sync",
        "eval_episodes": 2,
        "eval_every": 0,
        "checkpoint_every": 1,
        "progress": False,
        "tensorboard": False,
        "final_eval_splits": ["test"],
        "out": str(tmp_path / "run"),
    }
    opts.update(overrides)
    return load_config(None, opts)


@pytest.fixture(scope="session")
def small_policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A policy on the small tiny model, seed 0 (shared: tests must not train it)."""
    from agentrl_train.train import build_policy

    cfg = small_config(tmp_path_factory.mktemp("p"))
    return build_policy(cfg, log=lambda *a, **k: None), cfg
