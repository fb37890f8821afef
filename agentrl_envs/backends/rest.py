"""``backend={"http": "https://gateway.internal"}``: the ``http`` tool against a real REST service.

Every call is checked as the simulator checks it (:func:`simulators.http.request.check_call`: a
path relative to the base URL, no dot segments, no control characters, bounded body and query),
then against this backend's allow-lists of methods and hosts: the URL actually sent is built from
the base URL and the path, and is refused unless its host is allowed. Redirects are never
followed, the agent sets no headers, and answers are read up to :data:`MAX_ANSWER_BYTES`. A
refused call is an error response (405 ``method_not_allowed``, 403 ``host_not_allowed``, 400
``bad_path``, ...) and nothing is sent. The service's answer becomes the same reply the simulator
gives (:func:`simulators.http.route.reply_of`); one that cannot be reached is a
``connection_reset`` / ``timeout`` fault of origin ``service``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx

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
        timeout_s: timeout of every network operation.
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
            with self._client.stream(call.method, target, content=content, headers=headers) as answer:
                data = b""
                for chunk in answer.iter_bytes():
                    data += chunk
                    if len(data) > MAX_ANSWER_BYTES:
                        return ToolResponse(
                            ok=False, status=502, error_type="too_large", error=f"the answer is over {MAX_ANSWER_BYTES} bytes"
                        )
                status = answer.status_code
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

    def close_episode(self, episode_id: str) -> None:
        """Nothing to release (the service's state is its own)."""

    def close(self) -> None:
        self._client.close()


def _unreachable(kind: str, status: int, message: str) -> ToolResponse:
    return ToolResponse(
        ok=False, status=status, error_type=kind, error=message, fault={"type": kind, "status": status, "origin": "service"}
    )
