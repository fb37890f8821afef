"""Helpers for the integration tests: run an example script as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def start_server(command: list[str], stream: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m agentrl_envs COMMAND... --port 0`` on 127.0.0.1; (process, its URL from the banner on ``stream``)."""
    import re

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl_envs", *command, "--port", "0"],
        stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
        stderr=subprocess.PIPE if stream == "stderr" else None,
        text=True,
        cwd=ROOT,
    )
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    line = pipe.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"the server did not start: {line!r}")
    import threading

    threading.Thread(target=pipe.read, daemon=True).start()  # drained, so the server never blocks on a full pipe
    return proc, found.group(1)


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
