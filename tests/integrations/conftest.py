"""Helpers for the integration tests: run an example script as a subprocess; one OpenEnv server per module."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl_envs.testing import start_cli_server, stop_process

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, *args: str, extra_env: dict[str, str] | None = None) -> str:
    """Run examples/<name> with ``args``; return its stdout and stderr (fails the test on a non-zero exit)."""
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(extra_env or {})
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def require(module: str) -> None:
    """Import ``module`` or skip, except under CI (``AGENTRL_REQUIRE_INTEGRATION=1``), where its absence fails."""
    import importlib

    import pytest

    try:
        importlib.import_module(module)
    except ImportError as exc:
        reason = f"{module} is not importable ({exc}); install the extra: pip install -e '.[mcp,openenv]'"
        if os.environ.get("AGENTRL_REQUIRE_INTEGRATION") == "1":
            pytest.fail(f"AGENTRL_REQUIRE_INTEGRATION=1: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def openenv_url() -> Iterator[str]:
    """``agentrl-envs openenv AgentRL/SQL-v0 --max-sessions 4`` on 127.0.0.1 for one test module: its root URL."""
    proc, root = start_cli_server(["openenv", "AgentRL/SQL-v0", "--max-sessions", "4"], "stdout")
    try:
        yield root
    finally:
        stop_process(proc)
