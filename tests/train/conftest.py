"""Fixtures for the trainer's tests: a small tiny model (built once per machine, cached) and configs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

SMALL = {"tiny_pretrain_steps": 30, "tiny_corpus_episodes": 8}

#: the modules whose tests use the default tiny model (the CLI's ``--model tiny``); the others use SMALL's
DEFAULT_TINY_MODULES = ("test_learning.py", "test_grpo_learning.py", "test_serve.py")
_background: subprocess.Popen[bytes] | None = None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests that need the default tiny model last, and build it on one core in the background meanwhile.

    Building it takes minutes of pretraining. When the run holds other tests too (``make test``), it
    is built beside them, on one thread (the weights do not depend on the thread count:
    ``test_tiny.py``), and the first test that needs it waits on the build's file lock and finds it
    done. A run of those tests alone builds it in the foreground, on every core.
    """
    global _background
    here = Path(__file__).parent
    users = [i for i in items if i.path.parent == here and i.path.name in DEFAULT_TINY_MODULES]
    if not users or len(users) == len(items):
        return
    items[:] = [i for i in items if i not in users] + users  # a stable move: each group keeps its order
    from agentrl_train.tiny import TinySpec, cache_root

    if config.option.collectonly or (cache_root() / f"tiny-{TinySpec().key()}" / "done").exists():
        return
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "tiny-background-build.log", "wb") as log:
        code = "from agentrl_train.tiny import build_tiny; build_tiny()"
        _background = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop a background build the run did not need in the end (SIGINT: it removes its temporary folder)."""
    if _background is not None and _background.poll() is None:
        _background.send_signal(signal.SIGINT)
        try:
            _background.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _background.kill()
            _background.wait()


def small_config(tmp_path: Any, **overrides: Any) -> Any:
    from agentrl_train.config_io import load_config

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
    from agentrl_train.policy import build_policy

    cfg = small_config(tmp_path_factory.mktemp("p"))
    return build_policy(cfg, log=lambda *a, **k: None), cfg
