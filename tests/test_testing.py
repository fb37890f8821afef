"""The helpers of agentrl_envs.testing: the /proc scans on processes these tests start, and uvicorn in a thread."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

import httpx
import pytest

from agentrl_envs.testing import SANDBOX_MARKER, alive, descendants, free_port, sandbox_zygotes, serve_in_thread

# Both the child and its fork wait for stdin to close, so closing it ends them both.
FORKING_CHILD = "import os, sys; os.fork(); sys.stdin.read()"
WAITING_CHILD = "import sys; sys.stdin.read()"
POLLS = 6_000  # x 10 ms: a hang bound for a busy machine, not a speed check


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    for _ in range(POLLS):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def test_sandbox_zygotes_lists_the_marked_children_of_a_process_and_not_their_forks() -> None:
    marked = subprocess.Popen([sys.executable, "-c", FORKING_CHILD, SANDBOX_MARKER], stdin=subprocess.PIPE)
    plain = subprocess.Popen([sys.executable, "-c", WAITING_CHILD, "not-a-sandbox"], stdin=subprocess.PIPE)
    try:
        _wait_for(lambda: len(descendants(marked.pid)) == 1, "the marked child to fork")
        (fork,) = descendants(marked.pid)
        with open(f"/proc/{fork}/cmdline", "rb") as f:
            assert SANDBOX_MARKER.encode() in f.read()  # a fork keeps the marker: only children may count
        mine = sandbox_zygotes(os.getpid())
        assert marked.pid in mine
        assert plain.pid not in mine and fork not in mine
        assert sandbox_zygotes(marked.pid) == [fork]
        assert sandbox_zygotes(plain.pid) == []
    finally:
        for proc in (marked, plain):
            assert proc.stdin is not None
            proc.stdin.close()
    _wait_for(lambda: not alive(marked.pid), "the marked child to exit")
    assert marked.pid not in sandbox_zygotes(os.getpid())  # exited and not reaped yet (a zombie): not listed
    assert marked.wait(timeout=60) == 0 and plain.wait(timeout=60) == 0
    _wait_for(lambda: not alive(fork), "the fork to exit")


def test_sandbox_zygotes_of_a_process_that_is_gone_or_never_was_is_empty() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    assert sandbox_zygotes(proc.pid) == []
    assert sandbox_zygotes(-1) == [] and sandbox_zygotes(0) == []


class _LifespanApp:
    """An ASGI app that records the lifespan events it gets and answers every request with 204."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                self.events.append(event["type"])
                await send({"type": event["type"] + ".complete"})
                if event["type"] == "lifespan.shutdown":
                    return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("lifespan", ["on", "off"])
def test_serve_in_thread_runs_the_lifespan_handlers_only_when_asked(lifespan: Literal["on", "off"]) -> None:
    app = _LifespanApp()
    with serve_in_thread(app, free_port(), lifespan=lifespan) as url:
        assert httpx.get(url + "/anything").status_code == 204
        assert app.events == (["lifespan.startup"] if lifespan == "on" else [])
    assert app.events == (["lifespan.startup", "lifespan.shutdown"] if lifespan == "on" else [])


def test_serve_in_thread_says_so_when_uvicorn_cannot_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"uvicorn did not start on 127.0.0.1:{port}"):
            with serve_in_thread(_LifespanApp(), port):
                pass
