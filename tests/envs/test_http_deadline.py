"""The ``http`` tool against a slow or dripping upstream: one deadline for the whole call (issue #33, 9).

httpx times each read on its own, so an upstream that sends a byte a second kept ``env.step``
waiting for as long as it dripped. :class:`DrippingServer` is such an upstream (a raw socket on
127.0.0.1, a free port): it drips its answer, headers or body, for a minute. Every test waits a
bounded time for the call, far past its budget and far short of the drip.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the ids
from agentrl_envs.backends.base import ToolRequest, ToolResponse
from agentrl_envs.backends.rest import RESTBackend
from agentrl_envs.core.actions import format_call

BUDGET_S = 1.0
#: how long a test waits for a call that has a BUDGET_S budget (generous: a loaded machine)
WAIT_S = 20.0
#: how long the server drips (a call without a whole-call deadline would wait this long)
DRIP_S = 60.0
OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{"items": []}'


class DrippingServer:
    """Answers the first ``honest`` requests of each connection at once, then drips every answer.

    ``mode``: ``"headers"`` drips the status line and headers one byte at a time; ``"body"`` sends the
    headers of a 1 MB body and then drips the body.
    """

    def __init__(self, mode: str, honest: int = 0) -> None:
        self.mode, self.honest = mode, honest
        self.stop = threading.Event()
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            served = 0
            while not self.stop.is_set():
                if not _read_request(conn):
                    return
                if served < self.honest:
                    conn.sendall(OK)
                    served += 1
                    continue
                if self.mode == "headers":
                    self._drip(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 10_000)
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
                    self._drip(conn, b"[" + b"1," * 500_000)
                return

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        steps = int(DRIP_S / 0.1)
        for i in range(min(len(data), steps)):
            if self.stop.wait(0.1):
                return
            try:
                conn.sendall(data[i : i + 1])
            except OSError:  # the client hung up: what the deadline is for
                return

    def close(self) -> None:
        self.stop.set()
        self._listener.close()
        self._accepter.join(5)
        for thread in self._threads:
            thread.join(5)


def _read_request(conn: socket.socket) -> bool:
    """Read one request head (the tests send no bodies to it); False at the end of the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = conn.recv(4096)
        except OSError:
            return False
        if not chunk:
            return False
        data += chunk
    return True


@pytest.fixture(params=["headers", "body"])
def dripping(request: pytest.FixtureRequest) -> Iterator[DrippingServer]:
    server = DrippingServer(request.param)
    yield server
    server.close()


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, waited for at most ``seconds`` (a test failure past them, not a hang)."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(result=call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the call was still running after {seconds} s (its budget: {BUDGET_S} s)"
    return out["result"]


def _is_timeout(response: ToolResponse) -> bool:
    return not response.ok and response.fault == {"type": "timeout", "status": 504, "origin": "service"}


def test_a_dripping_upstream_is_cut_off_at_the_budget(dripping: DrippingServer) -> None:
    backend = RESTBackend(dripping.url, timeout_s=BUDGET_S)
    try:
        for path in ("/v1/tickets", "/v1/customers/1"):
            response = _within(WAIT_S, lambda p=path: backend.handle(ToolRequest("ep", "http", {"method": "GET", "path": p})))
            assert _is_timeout(response) and "the whole call" in response.error, response
    finally:
        backend.close()


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_a_reused_connection_that_starts_dripping_is_cut_off_too(mode: str) -> None:
    """The second call goes out on the kept-alive connection of the first, which no trace event shows."""
    server = DrippingServer(mode, honest=1)
    backend = RESTBackend(server.url, timeout_s=BUDGET_S)
    try:
        first = backend.handle(ToolRequest("ep", "http", {"method": "GET", "path": "/v1/tickets"}))
        assert first.ok, first
        second = _within(WAIT_S, lambda: backend.handle(ToolRequest("ep", "http", {"method": "GET", "path": "/v1/tickets"})))
        assert _is_timeout(second) and server.connections == 1, (second, server.connections)
    finally:
        backend.close()
        server.close()


def test_env_step_on_a_dripping_upstream_returns_a_timeout_observation(dripping: DrippingServer) -> None:
    env = gym.make(
        "AgentRL/HTTP-v0", backend={"http": RESTBackend(dripping.url, timeout_s=BUDGET_S)}, candidates=3, python_sandbox=False
    )
    try:
        env.reset(seed=0, options={"task_seed": 0})
        action = format_call("http", {"method": "GET", "path": "/v1/tickets"})
        obs, _reward, terminated, truncated, info = _within(WAIT_S, lambda: env.step(action))
        assert "timeout" in obs and info["fault"]["type"] == "timeout", (obs[:300], info.get("fault"))
        assert not terminated and not truncated and env.observation_space.contains(obs)
    finally:
        env.close()
