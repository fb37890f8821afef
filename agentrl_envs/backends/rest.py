"""``backend={"http": "https://gateway.internal"}``: the ``http`` tool against a real REST service.

Every call is checked as the simulator checks it (:func:`simulators.http.request.check_call`: a
path relative to the base URL, no dot segments, no control characters, bounded body and query),
then against this backend's allow-lists of methods and hosts: the URL actually sent is built from
the base URL and the path, and is refused unless its host is allowed. Redirects are never
followed, the agent sets no headers, and answers are read up to :data:`MAX_ANSWER_BYTES`. A
refused call is an error response (405 ``method_not_allowed``, 403 ``host_not_allowed``, 400
``bad_path``, ...) and nothing is sent. The service's answer becomes the same reply the simulator
gives (:func:`simulators.http.route.reply_of`); one that cannot be reached is a
``connection_reset`` / ``timeout`` fault of origin ``service``. Every call has one deadline,
``timeout_s``, for all of it (connect, send, headers, body), not one per read: a slow or dripping
upstream gives a ``timeout`` fault when it is spent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import httpx

from agentrl_envs.backends._deadline import OverBudget, Watchdog
from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.backends.wire import to_response
from agentrl_envs.errors import ConfigError
from simulators.http.request import METHODS, RequestError, check_call
from simulators.http.route import reply_of

__all__ = ["MAX_ANSWER_BYTES", "RESTBackend"]

#: The most bytes of one answer read from the service (past it: a 502 ``too_large``).
MAX_ANSWER_BYTES = 4 << 20


class RESTBackend:
    """Sends the ``http`` tool's calls to the REST service at ``url``.

    Args:
        url: the service's base URL (``http(s)://host[:port][/prefix]``); paths are appended to it.
        allow_hosts: hosts calls may go to (default: the base URL's host only); must include it.
        allow_methods: methods calls may use (default: GET, POST, PATCH, DELETE).
        timeout_s: the budget of one call, all of it: connecting, sending, the headers and the
            whole body (an upstream that answers a byte at a time is cut off when it is spent).
        transport: an httpx transport to send through (tests; default: the network).
    """

    def __init__(
        self,
        url: str,
        allow_hosts: Iterable[str] | None = None,
        allow_methods: Iterable[str] = METHODS,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ConfigError(f"backend['http']={str(url)[:200]!r}: expected a base URL http(s)://host[:port][/prefix]")
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise ConfigError(f"backend['http']={url[:200]!r}: the port is not a number in 0-65535") from None
        self.base = str(httpx.URL(url)).rstrip("/")
        self.allow_hosts = frozenset(h.lower() for h in (allow_hosts if allow_hosts is not None else (parts.hostname,)))
        if parts.hostname.lower() not in self.allow_hosts:
            raise ConfigError(
                f"backend['http']={url[:200]!r}: its host {parts.hostname!r} is not in allow_hosts; add it or use another URL"
            )
        methods = tuple(allow_methods)
        bad = [m for m in methods if m not in METHODS]
        if bad or not methods:
            raise ConfigError(f"allow_methods={methods!r}: use a non-empty subset of {', '.join(METHODS)}")
        self.allow_methods = methods
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False, transport=transport, trust_env=False)
        self.timeout_s = timeout_s
        # The connection last used per origin: the pool may hand it to the next call (see _exchange).
        self._streams: dict[tuple[str, str, int | None], Any] = {}

    def open_episode(self, setup: EpisodeSetup) -> None:
        """Nothing to prepare: the service keeps its own state."""

    def handle(self, request: ToolRequest) -> ToolResponse:
        if request.tool != "http":
            return ToolResponse(
                ok=False, status=404, error_type="unknown_tool", error=f"this backend serves http, not {request.tool!r}"
            )
        try:
            call = check_call(request.arguments, self.allow_methods)
        except RequestError as exc:
            return ToolResponse(ok=False, status=exc.status, error_type=exc.kind, error=exc.message)
        url = self.base + call.path
        try:
            target = httpx.URL(url, params=call.query or None)
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            return ToolResponse(ok=False, status=400, error_type="bad_path", error=f"not a valid URL: {str(exc)[:200]}")
        host = (target.host or "").lower()
        if host not in self.allow_hosts or not str(target).startswith(self.base + "/"):
            return ToolResponse(
                ok=False,
                status=403,
                error_type="host_not_allowed",
                error=f"host {host[:80]!r} is not in this backend's allow-list",
            )
        content = None if call.body is None else json.dumps(call.body, separators=(",", ":")).encode()
        headers = {"accept": "application/json"}
        if content is not None:
            headers["content-type"] = "application/json"
        try:
            status, data = self._exchange(call.method, target, content, headers)
        except OverBudget:
            return _unreachable(
                "timeout", 504, f"no complete answer from {self.base[:80]} within timeout_s={self.timeout_s:g} s (the whole call)"
            )
        except _TooLarge:
            return ToolResponse(
                ok=False, status=502, error_type="too_large", error=f"the answer is over {MAX_ANSWER_BYTES} bytes"
            )
        except httpx.TimeoutException:
            return _unreachable("timeout", 504, f"no answer from {self.base[:80]} within {self.timeout_s:g} s")
        except httpx.HTTPError as exc:
            return _unreachable("connection_reset", 599, f"cannot reach {self.base[:80]}: {type(exc).__name__}: {str(exc)[:200]}")
        body: object = None
        if data:
            try:
                body = json.loads(data)
            except (ValueError, RecursionError):
                body = data[:2000].decode("utf-8", "replace")
        if 300 <= status < 400:
            return ToolResponse(
                ok=False, status=status, error_type="redirect", error="the service answered a redirect; it is not followed"
            )
        reply_status, reply = reply_of(status, body)
        return to_response(reply_status, reply)

    def _exchange(self, method: str, target: httpx.URL, content: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of one request, all of it (connect, send, headers, body) within ``timeout_s``.

        httpx's timeouts are per operation, so an upstream that drips a byte a second would hold
        the call for ever; a :class:`~agentrl_envs.backends._deadline.Watchdog` shuts the connection down
        when the budget is spent. It watches the connections this request opens (its trace) and
        the ones kept alive from earlier calls, one of which the request may reuse.

        Raises:
            OverBudget: the budget ran out.
            _TooLarge: the body is over :data:`MAX_ANSWER_BYTES`.
            httpx.HTTPError: the transport failed.
        """
        watchdog = Watchdog(self.timeout_s)
        for stream in list(self._streams.values()):
            watchdog.watch(stream)
        try:
            with self._client.stream(
                method, target, content=content, headers=headers, extensions={"trace": watchdog.trace}
            ) as answer:
                stream = answer.extensions.get("network_stream")
                if stream is not None:
                    watchdog.watch(stream)
                    self._streams[(target.scheme, target.host, target.port)] = stream
                data = bytearray()
                for chunk in answer.iter_bytes():
                    if watchdog.spent():  # a transport without a socket to shut down
                        raise OverBudget
                    data += chunk
                    if len(data) > MAX_ANSWER_BYTES:
                        raise _TooLarge
                if watchdog.fired:  # a body that ends with the connection looks complete after a shutdown
                    raise OverBudget
                return answer.status_code, bytes(data)
        except httpx.TransportError:
            if watchdog.fired:
                raise OverBudget from None
            raise
        finally:
            watchdog.cancel()

    def close_episode(self, episode_id: str) -> None:
        """Nothing to release (the service's state is its own)."""

    def close(self) -> None:
        self._client.close()


class _TooLarge(Exception):
    """An answer over :data:`MAX_ANSWER_BYTES`."""


def _unreachable(kind: str, status: int, message: str) -> ToolResponse:
    return ToolResponse(
        ok=False, status=status, error_type=kind, error=message, fault={"type": kind, "status": status, "origin": "service"}
    )
