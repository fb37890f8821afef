"""``agentrl-envs serve``: the simulator API over HTTP, optionally with a server-side fault profile.

The stack is uvicorn (with uvloop and httptools when installed) running a plain ASGI callable:
no web framework in between, because every request is a tiny JSON call and Starlette's routing
and request objects would add about a quarter to each one's CPU time (measured by
``benchmarks/bench_router.py``; the numbers are at the top of :mod:`simulators.app`). uvicorn is
maintained by the Encode team (also behind httpx and Starlette), is the reference ASGI server, and
sets TCP_NODELAY on every connection (asyncio and uvloop transports both do), so small answers are
not held back by Nagle's algorithm.

``HEAD`` on any route is answered as ``GET`` is (status, headers, ``content-length``), without the body.

Access: with a bearer token (``token=``, ``--token`` or ``$AGENTRL_SERVE_TOKEN``) every request but
``GET /health`` needs ``Authorization: Bearer <token>`` (401 otherwise). The token is optional on a
loopback address and required on any other: :func:`serve` refuses to start without one. Episodes
are owned by the client that opened them and template databases are content-addressed (see
:mod:`simulators.app`).

Limits (:class:`ServeLimits`): ``GET /health`` and ``GET /openapi.json`` are answered on the event
loop, never behind a worker. Python calls, SQL calls and everything else run in three separate
thread pools ("lanes"), so slow Python runs never hold up a query or an episode open. A lane
admits a call while the wait it would have for a worker, estimated from the lane's recent service
times, is within ``retry_after_s`` (a 429 asks the client to come back after that long, so
refusing a call that would have waited less only makes it slower), and never more than ``workers *
(1 + queue_per_worker)`` calls at once; one client (a peer address) may have at most
``per_client`` calls admitted over all lanes, and the admitted calls' bodies together at most
``max_queued_bytes``. A call past any bound is answered at once with 429 ``server_busy`` and a
``Retry-After`` (the ``http`` backend waits and retries it).

Why a wait and not only a count: at 500 point lookups/s per process, a fixed bound of 36 calls
is 72 ms of arrivals, and a server process on a shared 2-core machine stops that long now and then
(the OS runs something else; a full collection while episodes open), so a count alone answers 429
to calls that would each have waited well under a second. A point lookup holds a worker ~0.3-2 ms,
so the SQL lane queues up to its cap (1,004 calls, ~2 s of arrivals at that rate), while a lane of
2 s queries or 5 s Python runs admits only what it can start within a second.

Episodes: one server process holds at most ``max_episodes`` (8,192) open episodes
and closes any without a call for ``episode_idle_s`` (15 minutes); a client that opens one past
the cap gets 503 ``too_many_episodes``, and a call on an expired one 404 ``unknown_episode``
saying why. The bookkeeping is O(1) per request (:mod:`simulators.episode_table`).

A template upload may be up to ``max_upload_bytes`` (read as it streams in; 413 past it, naming
the setting); every other body stays within 8 MiB.

Running it: :func:`agentrl_envs.server.processes.serve` (``agentrl-envs serve``). Scale:
``serve(workers=N)`` (``agentrl-envs serve --workers N``) runs N server processes, one port each, and the ``http`` backend given all their URLs keeps
each episode on one of them. Each process freezes what start-up allocated out of the cycle
collector's reach and raises its thresholds, and gives freed memory back as episodes close
(:mod:`simulators.memory`).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import ipaddress
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrl_envs.backends.base import ToolRequest
from agentrl_envs.backends.direct import DirectBackend
from agentrl_envs.backends.http import TOKEN_ENV
from agentrl_envs.backends.wire import AT_HEADER, EPISODE_TOKEN_HEADER, response_body
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import ErrorProfile
from agentrl_envs.faults.injector import FaultInjectingBackend
from simulators import SimulatorApp
from simulators.app import MAX_UPLOAD_BYTES, match_route
from simulators.episode_table import check_episode_limits
from simulators.tools import TOOL_ROUTES

__all__ = ["ServeLimits", "SimulatorServer", "check_bind"]

_INLINE = {("GET", "/health"), ("GET", "/openapi.json")}
MIN_TOKEN_CHARS = 16
#: Latest virtual time (``X-AgentRL-At``, seconds) a call may carry: ~31 years, far past any episode's clock
MAX_AT_S = 1e9
#: weight of the latest call in a lane's moving average of service times
SERVICE_WEIGHT = 1 / 16

Answer = tuple[int, bytes, dict[str, str]]


@dataclass(frozen=True)
class ServeLimits:
    """How much of the server the calls in flight may hold.

    Attributes:
        python_workers: threads running Python tool calls (each waits on one sandboxed program).
        sql_workers: threads running SQL calls.
        workers: threads for everything else: episodes, files, mail, template uploads.
        queue_per_worker: calls that may wait for a worker of their lane, per worker: a lane never
            admits more than ``workers * (1 + queue_per_worker)`` calls, and fewer while its
            estimated wait for a worker would pass ``retry_after_s``; 429 past that.
        per_client: calls one client (one peer address; every loopback client shares one) may have
            admitted at once over all lanes; 429 past that.
        retry_after_s: the ``Retry-After`` of a 429, in whole seconds, and the longest wait for a
            worker a lane admits a call to.
        max_upload_bytes: the largest template database upload (JSON bytes); 413 past it.
        max_queued_bytes: request body bytes the admitted calls may hold together (a call is
            always admitted when no other is in flight); 429 past that.
        max_episodes: episodes open at once in one server process; opening one more answers 503
            ``too_many_episodes`` (refused rather than closing another client's episode).
        episode_idle_s: an episode without a call (tool, file, replacement) for this long is
            closed, as its client would have; a call in flight keeps it open.
    """

    python_workers: int = 4
    sql_workers: int = 4
    workers: int = 4
    queue_per_worker: int = 250
    per_client: int = 1024
    retry_after_s: int = 1
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_queued_bytes: int = 256 << 20
    max_episodes: int = 8192
    episode_idle_s: float = 900.0

    def __post_init__(self) -> None:
        try:
            check_episode_limits(self.max_episodes, self.episode_idle_s)
        except ValueError as exc:
            raise ConfigError(f"ServeLimits.{exc}") from None
        upload = self.max_upload_bytes
        if not isinstance(upload, int) or isinstance(upload, bool) or not 1 <= upload <= 1 << 40:
            raise ConfigError(f"ServeLimits.max_upload_bytes={upload!r}: use a number of bytes from 1 to 2**40")
        queued = self.max_queued_bytes
        if not isinstance(queued, int) or isinstance(queued, bool) or not 1 <= queued <= 1 << 40:
            raise ConfigError(f"ServeLimits.max_queued_bytes={queued!r}: use a number of bytes from 1 to 2**40")
        for name in ("python_workers", "sql_workers", "workers", "per_client", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 4096:
                raise ConfigError(f"ServeLimits.{name}={value!r}: use a whole number from 1 to 4096")
        if not isinstance(self.queue_per_worker, int) or not 0 <= self.queue_per_worker <= 4096:
            raise ConfigError(f"ServeLimits.queue_per_worker={self.queue_per_worker!r}: use a whole number from 0 to 4096")


class _Lane:
    """One thread pool, the calls it has admitted and how long its calls hold a worker.

    Touched only on the event loop. ``service_s`` is a moving average (weight ``SERVICE_WEIGHT``
    per call) of the seconds a call spent in its worker, waits for the GIL included; with every
    worker busy the lane finishes about ``workers / service_s`` calls per second.
    """

    def __init__(self, name: str, workers: int, queue_per_worker: int, max_wait_s: float) -> None:
        self.name = name
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix=f"agentrl-serve-{name}")
        self.workers = workers
        self.limit = workers * (1 + queue_per_worker)
        self.max_wait_s = max_wait_s
        self.admitted = 0
        self.service_s = 0.0

    def expected_wait_s(self) -> float:
        """Seconds a call admitted now would wait for a worker (0 while one is free)."""
        return max(0, self.admitted + 1 - self.workers) * self.service_s / self.workers

    def served(self, seconds: float) -> None:
        """Count a finished call's time in its worker into ``service_s``."""
        self.service_s += SERVICE_WEIGHT * (seconds - self.service_s)


class SimulatorServer:
    """An ASGI application serving the simulator API.

    Args:
        profile: a fault profile to inject server-side (faults then arrive as HTTP errors).
        sql_deadline_s, python_timeout_s: service limits.
        token: the bearer token every request but ``GET /health`` must carry; None for none.
        limits: worker pools and admission bounds (see :class:`ServeLimits`).
        app: the simulator to serve (default: a new one with the given service limits).
    """

    def __init__(
        self,
        profile: ErrorProfile | None = None,
        sql_deadline_s: float = 2.0,
        python_timeout_s: float = 5.0,
        *,
        token: str | None = None,
        limits: ServeLimits | None = None,
        app: SimulatorApp | None = None,
    ) -> None:
        if token is not None:
            _check_token(token)
        self.direct = DirectBackend(app, sql_deadline_s=sql_deadline_s, python_timeout_s=python_timeout_s)
        self.faults = FaultInjectingBackend(self.direct, profile) if profile is not None and profile.injects else None
        self.limits = limits or ServeLimits()
        if app is None:
            self.direct.app.max_upload_bytes = self.limits.max_upload_bytes
            self.direct.app.set_episode_limits(self.limits.max_episodes, self.limits.episode_idle_s)
        if self.faults is not None:
            self.direct.app.on_expire = self.faults.forget
        self._token = token.encode() if token is not None else None
        lim = self.limits
        self._lanes = {
            "python": _Lane("python", lim.python_workers, lim.queue_per_worker, lim.retry_after_s),
            "sql": _Lane("sql", lim.sql_workers, lim.queue_per_worker, lim.retry_after_s),
            "control": _Lane("control", lim.workers, lim.queue_per_worker, lim.retry_after_s),
        }
        self._per_client: collections.Counter[str] = collections.Counter()
        self._queued_bytes = 0
        #: calls answered 429 ``server_busy`` so far
        self.busy_answers = 0

    def in_flight(self) -> dict[str, int]:
        """Calls admitted and not yet answered, per lane (running or waiting for a worker)."""
        return {name: lane.admitted for name, lane in self._lanes.items()}

    def dispatch(self, method: str, path: str, body: bytes | bytearray, at_s: float, episode_token: str | None = None) -> Answer:
        """Serve one request (runs in a worker thread)."""
        route, args = match_route(method, path)
        app = self.direct.app
        if self.faults is not None and route == "tool" and args[1] in TOOL_ROUTES:
            try:
                payload = json.loads(body) if body else {}
            except (ValueError, RecursionError):
                payload = None
            denied = app.check_owner(args[0], episode_token)
            if isinstance(payload, dict) and denied is None:
                response = self.faults.handle(ToolRequest(args[0], args[1], payload, at_s=at_s))
                headers = {"content-type": "application/json"}
                if response.fault and "retry_after_s" in response.fault:
                    headers["retry-after"] = str(max(1, round(response.fault["retry_after_s"])))
                return response.status, json.dumps(response_body(response)).encode(), headers
        status, data, headers = app.handle_bytes(method, path, body, episode_token)
        if self.faults is not None and route == "open_episode" and status == 201:
            setup = json.loads(body)
            self.faults.start(setup["episode_id"], int(setup.get("seed") or 0))
        if self.faults is not None and route == "close_episode" and status == 204:
            self.faults.forget(args[0])
        return status, data, headers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        head = scope["method"] == "HEAD"
        if head:  # answered as GET is (status, headers, content-length, the token asked for), without the body
            scope = {**scope, "method": "GET"}
        # Kept up to one byte past the path's limit (the app answers 413 for that); the rest is drained.
        limit = self.direct.app.body_limit(scope["method"], scope["path"]) + 1
        body = bytearray()
        more = True
        while more:
            message = await receive()
            chunk = message.get("body", b"")
            if len(body) < limit:
                body += chunk[: limit - len(body)]
            more = message.get("more_body", False)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        status, data, out = await self._answer(scope, headers, body)
        raw_headers = [(k.encode(), v.encode()) for k, v in out.items()]
        raw_headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": b"" if head else data})

    async def _answer(self, scope: dict[str, Any], headers: dict[str, str], body: bytes | bytearray) -> Answer:
        method, path = scope["method"], scope["path"]
        if self._token is not None and (method, path) != ("GET", "/health") and not self._authorized(headers):
            return _error(
                401,
                "unauthorized",
                "this server wants a bearer token: send 'Authorization: Bearer <token>' "
                f"(the http backend reads it from ${TOKEN_ENV})",
                {"www-authenticate": 'Bearer realm="agentrl"'},
            )
        if (method, path) in _INLINE:
            return self.direct.app.handle_bytes(method, path, body)
        at_s = _virtual_time(headers.get(AT_HEADER.lower()))
        if at_s is None:
            return _error(
                400,
                "bad_request",
                f"the {AT_HEADER} header {headers[AT_HEADER.lower()][:40]!r} is not a virtual time: send the episode's "
                f"clock, a finite number of seconds from 0 to {MAX_AT_S:g}, or leave the header out",
                {},
            )
        lane = self._lanes[_lane_of(method, path)]
        client = str((scope.get("client") or ("",))[0])
        refused = self._refusal(lane, client, len(body))
        if refused is not None:
            self.busy_answers += 1
            after = self.limits.retry_after_s
            return _error(
                429,
                "server_busy",
                f"the server is at {refused}; retry after {after} s (see ServeLimits)",
                {"retry-after": str(after)},
                retry_after_s=after,
            )
        lane.admitted += 1
        self._per_client[client] += 1
        self._queued_bytes += len(body)
        try:
            loop = asyncio.get_running_loop()
            token = headers.get(EPISODE_TOKEN_HEADER.lower())
            answer, seconds = await loop.run_in_executor(lane.executor, self._timed_dispatch, method, path, body, at_s, token)
            lane.served(seconds)
            return answer
        finally:
            lane.admitted -= 1
            self._queued_bytes -= len(body)
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]

    def _refusal(self, lane: _Lane, client: str, size: int) -> str | None:
        """The bound a new call would pass, in words for its 429; None when it is admitted."""
        if self._per_client[client] >= self.limits.per_client:
            return f"this client's limit of {self.limits.per_client} calls in flight"
        if lane.admitted >= lane.limit:
            return f"the {lane.name} lane's limit of {lane.limit} calls in flight"
        if lane.expected_wait_s() > lane.max_wait_s:
            return f"the {lane.name} lane's limit: a call would wait ~{lane.expected_wait_s():.1f} s for a worker"
        if self._queued_bytes and self._queued_bytes + size > self.limits.max_queued_bytes:
            return f"its limit of {self.limits.max_queued_bytes:,} request body bytes in flight"
        return None

    def _timed_dispatch(
        self, method: str, path: str, body: bytes | bytearray, at_s: float, token: str | None
    ) -> tuple[Answer, float]:
        start = time.perf_counter()
        answer = self.dispatch(method, path, body, at_s, token)
        return answer, time.perf_counter() - start

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, value = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self._token is not None and hmac.compare_digest(value.strip().encode(), self._token)

    def close(self) -> None:
        """Stop the worker pools (calls in flight finish) and close the simulator."""
        for lane in self._lanes.values():
            lane.executor.shutdown(wait=False, cancel_futures=True)
        self.direct.close()


def _virtual_time(text: str | None) -> float | None:
    """The ``X-AgentRL-At`` header as seconds (0 when absent); None when it is no finite time in
    [0, ``MAX_AT_S``] (inf or nan would stay in a fault window's end and refuse every later call)."""
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= MAX_AT_S else None  # nan fails both comparisons


def _lane_of(method: str, path: str) -> str:
    route, args = match_route(method, path)
    tool = TOOL_ROUTES.get(args[1]) if route == "tool" else None
    return tool.lane if tool is not None else "control"


def _error(status: int, kind: str, message: str, headers: dict[str, str], **extra: Any) -> Answer:
    body = json.dumps({"ok": False, "error": {"type": kind, "message": message, **extra}}).encode()
    return status, body, {"content-type": "application/json", **headers}


def _check_token(token: str) -> None:
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or not token.isprintable() or " " in token:
        raise ConfigError(
            f"the bearer token must be at least {MIN_TOKEN_CHARS} printable ASCII characters without spaces; make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback ``host`` without a bearer token (:class:`ConfigError`)."""
    if token is not None:
        _check_token(token)
    elif not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {host!r} without a bearer token: any host that can reach it could run code and "
            f"change episodes. Set ${TOKEN_ENV} (or pass --token) to a secret, e.g. "
            f"export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))'), "
            "and give clients the same variable; or bind to 127.0.0.1"
        )
