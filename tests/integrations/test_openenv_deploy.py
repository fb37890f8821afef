"""``deploy/openenv/`` through OpenEnv's own checks (what ``openenv validate`` runs).

- The directory: ``validate_multi_mode_deployment`` (``openenv validate deploy/openenv``) finds no
  issue, every deployment mode is supported, and ``uv.lock`` still records the repository's own
  dependencies (a change to the root pyproject.toml needs ``uv lock`` again).
- The running server: ``server/app.py``'s ``main()`` in a subprocess on 127.0.0.1 and a free port,
  checked by ``validate_running_environment`` (``openenv validate --url``): all six criteria pass.
- ``main()`` refuses a port in use with a clear message.

Docker (``server/Dockerfile``, ``openenv build``/``push``) is not tested: no Docker daemon here.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from agentrl_envs.testing import free_port, stop_process

from .conftest import ROOT, require

require("openenv.cli._validation")

from openenv.cli._validation import (  # noqa: E402
    get_deployment_modes,
    validate_multi_mode_deployment,
    validate_running_environment,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEPLOY = ROOT / "deploy" / "openenv"
APP = DEPLOY / "server" / "app.py"
ENV_ID = "AgentRL/SQL-v0"

#: What validate_running_environment checks in openenv-core 0.3 (openenv/cli/_validation.py).
RUNTIME_CRITERIA = {
    "openapi_version_available",  # GET /openapi.json has info.version
    "health_endpoint",  # GET /health: {"status": "healthy"}
    "metadata_endpoint",  # GET /metadata: name and description
    "schema_endpoint",  # GET /schema: action, observation and state schemas
    "mcp_endpoint",  # POST /mcp {} answers a JSON-RPC 2.0 payload (here: its invalid-request error)
    "mode_endpoint_consistency",  # /reset, /step and /state all present ("simulation" mode)
}


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def _server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTRL_HOST", "AGENTRL_PORT")}
    env.update(AGENTRL_ENV_ID=ENV_ID, **extra)
    return env


def test_directory_passes_openenv_validate() -> None:
    is_valid, issues = validate_multi_mode_deployment(DEPLOY)
    assert (is_valid, issues) == (True, [])
    assert get_deployment_modes(DEPLOY) == {"docker": True, "openenv_serve": True, "uv_run": True, "python_module": True}


def test_pyproject_names_this_repository() -> None:
    root = _toml(ROOT / "pyproject.toml")["project"]
    deploy = _toml(DEPLOY / "pyproject.toml")
    requirements = {canonicalize_name(Requirement(d).name): Requirement(d) for d in deploy["project"]["dependencies"]}
    ours = requirements[canonicalize_name(root["name"])]
    assert ours.extras == {"openenv"}
    assert deploy["tool"]["uv"]["sources"][root["name"]] == {"path": "../..", "editable": True}
    extra = {canonicalize_name(Requirement(d).name): Requirement(d) for d in root["optional-dependencies"]["openenv"]}
    assert requirements["openenv-core"].specifier == extra["openenv-core"].specifier  # the same openenv-core as the extra
    assert deploy["project"]["scripts"] == {"server": "server.app:main"}


def _lock_requirements(entries: list[dict[str, Any]]) -> set[tuple[str, frozenset[str], SpecifierSet]]:
    return {(canonicalize_name(e["name"]), frozenset(e.get("extras", ())), SpecifierSet(e.get("specifier", ""))) for e in entries}


def _root_requirements(project: dict[str, Any]) -> set[tuple[str, frozenset[str], SpecifierSet]]:
    texts = list(project["dependencies"]) + [d for group in project["optional-dependencies"].values() for d in group]
    return {(canonicalize_name(r.name), frozenset(r.extras), r.specifier) for r in map(Requirement, texts)}


def test_uv_lock_matches_the_repository() -> None:
    """uv.lock holds the root pyproject.toml's requirements as they were at `uv lock`: stale if they differ."""
    lock = _toml(DEPLOY / "uv.lock")
    packages = {p["name"]: p for p in lock["package"]}
    root = _toml(ROOT / "pyproject.toml")["project"]
    ours = packages[root["name"]]
    assert ours["source"] == {"editable": "../../"}
    stale = _lock_requirements(ours["metadata"]["requires-dist"]) ^ _root_requirements(root)
    assert not stale, f"deploy/openenv/uv.lock is stale (run `uv lock` in deploy/openenv): {sorted(map(str, stale))}"
    deploy = _toml(DEPLOY / "pyproject.toml")["project"]
    assert _lock_requirements(packages[deploy["name"]]["metadata"]["requires-dist"]) == _root_requirements(
        {"dependencies": deploy["dependencies"], "optional-dependencies": {}}
    )
    assert packages["openenv-core"]["version"].startswith("0.3.")
    assert {p["source"].get("registry") for p in lock["package"] if "registry" in p["source"]} == {"https://pypi.org/simple"}


def _start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """``python deploy/openenv/server/app.py ARGS``: the process and its first stdout line (its banner)."""
    proc = subprocess.Popen(
        [sys.executable, str(APP), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=DEPLOY
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    proc, banner = _start(["--port", str(port)], _server_env())  # the default host: 127.0.0.1
    try:
        root = f"http://127.0.0.1:{port}"
        assert root in banner and ENV_ID in banner, (banner, proc.poll())
        for pipe in (proc.stdout, proc.stderr):
            threading.Thread(target=pipe.read, daemon=True).start()  # type: ignore[union-attr]
        for _ in range(600):  # x 0.1 s: a hang bound for a busy machine, not a speed check
            try:
                if httpx.get(root + "/health", timeout=5.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, f"server exited with {proc.returncode}"
            time.sleep(0.1)
        else:
            pytest.fail(f"{root}/health never answered 200")
        yield root
    finally:
        stop_process(proc)
    # uvicorn shuts down on SIGTERM, then raises the signal again (its capture_signals): not stop_process's kill
    assert proc.returncode == -signal.SIGTERM


def test_running_server_passes_openenv_validate(url: str) -> None:
    report = validate_running_environment(url, timeout_s=30.0)
    outcome = {c["id"]: c["passed"] for c in report["criteria"]}
    assert outcome == dict.fromkeys(RUNTIME_CRITERIA, True), report
    assert report["passed"] and report["mode"] == "simulation" and report["standard_profile"] == "openenv-http/1.x"
    assert report["summary"]["failed_criteria"] == []
    metadata = next(c for c in report["criteria"] if c["id"] == "metadata_endpoint")
    assert metadata["actual"]["name"] == ENV_ID


def test_mcp_endpoint_lists_the_env_tools(url: str) -> None:
    """POST /mcp ``tools/list`` (OpenEnv's MCP route): the env's tools with their JSON schemas."""
    listed = httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30.0).json()
    tools = {t["name"]: t["input_schema"] for t in listed["result"]["tools"]}
    assert list(tools) == ["sql", "finish"] and tools["sql"]["required"] == ["query"]


def test_main_refuses_a_port_in_use() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc, banner = _start([], _server_env(AGENTRL_PORT=str(port)))  # the port from the environment
        try:
            _, err = proc.communicate(timeout=300)
        finally:
            stop_process(proc)
    assert proc.returncode == 2 and banner == ""
    assert re.search(rf"server: cannot listen on 127\.0\.0\.1:{port}: ", err), err
