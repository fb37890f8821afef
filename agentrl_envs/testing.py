"""Helpers for tests and benchmarks that run real servers and watch processes (Linux ``/proc``).

Shared by ``tests/`` and ``benchmarks/``, so neither imports the other. Nothing here imports pytest
or torch; ``import agentrl_envs`` does not import this module.

- :func:`free_port`, :func:`wait_http`: a loopback port, and waiting for ``GET /health`` to answer;
- :func:`simulator_server`: ``agentrl-envs serve`` in a subprocess on a free loopback port;
- :func:`start_cli_server`, :func:`stop_process`: any ``agentrl-envs`` server command (``openenv``,
  ``mcp --transport http``) on a free loopback port, its URL read from the banner it prints;
- :func:`serve_in_thread`: any ASGI app under uvicorn in a daemon thread;
- :func:`alive`, :func:`descendants`, :func:`with_marker`: process inspection through ``/proc``.
  Pids printed inside a sandboxed run belong to its own pid namespace, so callers find the processes
  a run started by a marker in their command line instead;
- :func:`sandbox_zygotes`: the Python sandbox's zygotes a process started.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

__all__ = [
    "SANDBOX_MARKER",
    "alive",
    "descendants",
    "free_port",
    "parent_of",
    "sandbox_zygotes",
    "serve_in_thread",
    "simulator_server",
    "start_cli_server",
    "stop_process",
    "wait_http",
    "with_marker",
]

#: In the command line of every sandbox zygote: the boot code (``_BOOT`` in
#: simulators/python/sandbox/runner.py) loads the sandbox package under this name. Spelled out here
#: so that this module imports nothing of the simulators.
SANDBOX_MARKER = "_agentrl_sandbox"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 120.0, proc: subprocess.Popen[Any] | None = None) -> None:
    """Wait until ``GET url/health`` answers 200.

    Raises:
        RuntimeError: ``proc`` exited first (its stderr tail is in the message), or ``timeout`` passed.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"the server exited with {proc.returncode}: {err}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up in {timeout} s")


@contextlib.contextmanager
def simulator_server(profile: str = "none") -> Iterator[tuple[str, subprocess.Popen[Any]]]:
    """``agentrl-envs serve`` in a subprocess on a free loopback port; yields (url, process), stops it after."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl_envs", "serve", "--host", "127.0.0.1", "--port", str(port), "--profile", profile],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc=proc)
        yield url, proc
    finally:
        stop_process(proc, timeout_s=10)
        if proc.stderr is not None:
            proc.stderr.close()


def start_cli_server(command: Sequence[str], stream: Literal["stdout", "stderr"]) -> tuple[subprocess.Popen[str], str]:
    """``python -m agentrl_envs COMMAND... --port 0`` on 127.0.0.1: (the process, its URL from the banner).

    Args:
        command: the ``agentrl-envs`` arguments, e.g. ``["openenv", "AgentRL/SQL-v0"]``.
        stream: where the server prints its ``http://127.0.0.1:PORT`` banner (``openenv``: stdout,
            ``mcp``: stderr). The stream is drained afterwards, so the server never blocks on a full pipe.

    Raises:
        RuntimeError: the first line on ``stream`` names no loopback URL (the server did not start).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl_envs", *command, "--port", "0"],
        stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
        stderr=subprocess.PIPE if stream == "stderr" else None,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    line = pipe.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if found is None:
        stop_process(proc)
        raise RuntimeError(f"agentrl-envs {' '.join(command)} did not start: {line!r}")
    threading.Thread(target=pipe.read, daemon=True).start()
    return proc, found.group(1)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30) -> None:
    """Terminate ``proc`` and wait for it (kill after ``timeout_s``)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve_in_thread(app: Callable[..., Any], port: int, *, lifespan: Literal["auto", "on", "off"] = "off") -> Iterator[str]:
    """uvicorn on 127.0.0.1:port in a daemon thread; yields the base URL, stops the server after.

    Args:
        app: an ASGI app.
        port: a free loopback port (:func:`free_port`).
        lifespan: uvicorn's lifespan mode: ``"on"`` for an app that starts and stops work of its own in
            its lifespan handlers (``agentrl-train serve``'s reload watcher); ``"off"`` skips them.

    Raises:
        RuntimeError: uvicorn did not start (the port was taken, or the app's startup failed: uvicorn
            logged why).
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan))

    def run() -> None:
        with contextlib.suppress(SystemExit):  # uvicorn exits when it cannot start; the RuntimeError below says so
            server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        for _ in range(6000):  # x 10 ms: a hang bound for a busy machine, not a speed check
            if server.started or not thread.is_alive():
                break
            time.sleep(0.01)
        if not server.started:
            raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{port}; its log above says why")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """A live process; a zombie counts as dead (killed, not yet reaped)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``, or None when it is already gone (it may exit between listing and reading)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[1]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (walking /proc by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for kid in children.get(stack.pop(), []):
            found.append(kid)
            stack.append(kid)
    return found


def _cmdline(pid: int) -> bytes:
    """The raw command line of ``pid`` (NUL-separated), or b"" if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def with_marker(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    needle = marker.encode()
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and needle in _cmdline(int(e)) and alive(int(e))]


def sandbox_zygotes(pid: int) -> list[int]:
    """The sandbox zygotes process ``pid`` started: its live children whose command line holds :data:`SANDBOX_MARKER`.

    Only children count: the zygote's own forks (warm slots, runs) inherit its command line, and
    :func:`descendants` of a zygote lists them.
    """
    needle = SANDBOX_MARKER.encode()
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] not in ("Z", "X") and fields[1] == str(pid):
                kids.append(int(entry))
    return sorted(k for k in kids if needle in _cmdline(k))
