"""``backend="http://host:port"``: the simulator API over real HTTP.

Talks to ``agentrl-envs serve`` or to any gateway that speaks the same API (``GET /openapi.json``).
Every network call has a timeout. A server that cannot be reached or dies mid-episode turns tool
calls into fault responses (``connection_reset`` / ``timeout``, origin ``service``), never an
exception or a hang; opening an episode on an unreachable server raises a clear
:class:`~agentrl_envs.errors.TransientError`.

A server started with a bearer token gets it from ``token=`` or ``$AGENTRL_SERVE_TOKEN``. A call the
server turns away because it is busy (429 ``server_busy``, its admission limits, not an injected
fault) is retried after its ``Retry-After``, a bounded number of times, so load on a shared
server does not change what the agent observes.

Several servers (``agentrl-envs serve --workers N`` prints their URLs): ``url`` may be a list of
base URLs or one string of them separated by commas. Each episode lives on one of them, chosen by
:func:`shard_of` from its id, and every call of that episode goes there, so the servers share no
state and every core serves episodes.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.backends.sim import WireClient
from agentrl_envs.errors import ConfigError, TransientError

__all__ = ["TOKEN_ENV", "HTTPBackend", "shard_of", "split_urls"]

#: the environment variable holding the bearer token of ``agentrl-envs serve`` (client and server)
TOKEN_ENV = "AGENTRL_SERVE_TOKEN"
BUSY_RETRIES = 8
MAX_RETRY_AFTER_S = 5.0
#: read timeout of a template database upload: the server parses, hashes and builds it before answering
UPLOAD_READ_TIMEOUT_S = 600.0


def shard_of(episode_id: str, shards: int) -> int:
    """Which of ``shards`` servers holds ``episode_id``: the CRC-32 of its id modulo ``shards``.

    Stable across processes, runs and machines, so any client (and ``benchmarks/bench_serve_scale.py``)
    sends an episode's calls to the server that opened it.
    """
    return zlib.crc32(episode_id.encode("utf-8", "surrogatepass")) % shards if shards > 1 else 0


def split_urls(url: str | Sequence[str]) -> list[str]:
    """The base URLs in ``url``: one URL, several separated by commas, or a list of them."""
    parts = url.split(",") if isinstance(url, str) else list(url)
    urls = [u.strip().rstrip("/") for u in parts if isinstance(u, str) and u.strip()]
    if not urls or len(urls) != len(parts) or not all(isinstance(u, str) for u in parts):
        raise ConfigError(f"backend URL {str(url)[:200]!r}: expected http://host:port, or several separated by commas")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"backend URLs {str(url)[:200]!r}: a server is listed twice; list each one once")
    for one in urls:
        parts_ = urlsplit(one)
        if parts_.scheme not in ("http", "https") or not parts_.hostname:
            raise ConfigError(f"backend URL {one[:200]!r}: expected http://host:port")
        try:
            parts_.port  # noqa: B018 - validates the port
        except ValueError:
            raise ConfigError(f"backend URL {one[:200]!r}: the port is not a number in 0-65535") from None
    return urls


class HTTPBackend:
    """The simulator API at ``url`` (one server, or several with episodes spread over them).

    Args:
        url: ``http://host:port`` (or ``https://``) of the server; or several, as a list or separated
            by commas (each episode goes to ``urls[shard_of(episode_id, len(urls))]``).
        python_timeout_s: the Python tool's wall limit; the read timeout leaves room for it.
        connect_timeout_s: how long to wait for a connection.
        token: the servers' bearer token (default: ``$AGENTRL_SERVE_TOKEN``; None sends none).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        python_timeout_s: float = 5.0,
        connect_timeout_s: float = 3.0,
        token: str | None = None,
        **_: object,
    ) -> None:
        self.urls = split_urls(url)
        self.url = ",".join(self.urls)
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        if token is not None and (not token.isascii() or not token.isprintable() or " " in token):
            raise ConfigError(f"the bearer token for {self.url} must be printable ASCII without spaces")
        timeout = httpx.Timeout(connect=connect_timeout_s, read=python_timeout_s + 15.0, write=10.0, pool=5.0)
        self._servers = [_Server(u, timeout, token) for u in self.urls]

    def _server(self, episode_id: str) -> _Server:
        return self._servers[shard_of(episode_id, len(self._servers))]

    @property
    def sandbox_tier(self) -> str | None:
        """The server's Python sandbox tier (from ``GET /health`` of the first server; None if it does not say)."""
        tier = self._servers[0].health().get("sandbox_tier")
        return tier[:16] if isinstance(tier, str) else None

    @property
    def numpy_available(self) -> bool:
        """Whether the server's Python offers numpy (from ``GET /health``; False if it does not say)."""
        return self._servers[0].health().get("numpy") is True

    def open_episode(self, setup: EpisodeSetup) -> None:
        self._server(setup.episode_id).open_episode(setup)

    def handle(self, request: ToolRequest) -> ToolResponse:
        return self._server(request.episode_id).handle(request)

    def close_episode(self, episode_id: str) -> None:
        self._server(episode_id).close_episode(episode_id)

    def put_file(self, episode_id: str, path: str, data: bytes) -> None:
        self._server(episode_id).put_file(episode_id, path, data)

    def get_file(self, episode_id: str, path: str) -> bytes | None:
        return self._server(episode_id).get_file(episode_id, path)

    def close(self) -> None:
        for server in self._servers:
            server.close()


class _Server(WireClient):
    """One server of an :class:`HTTPBackend`: its transport faults become fault responses."""

    def __init__(self, url: str, timeout: httpx.Timeout, token: str | None) -> None:
        self.url = url
        headers = {"authorization": f"Bearer {token}"} if token else {}
        super().__init__(httpx.Client(base_url=url, timeout=timeout, trust_env=False, headers=headers))

    def _send(self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: object) -> httpx.Response:
        if method == "PUT" and path.startswith("/v1/databases/"):
            kwargs["timeout"] = httpx.Timeout(
                connect=self._client.timeout.connect, read=UPLOAD_READ_TIMEOUT_S, write=UPLOAD_READ_TIMEOUT_S, pool=5.0
            )
        return super()._send(method, path, headers, **kwargs)

    def health(self) -> dict[str, object]:
        if not hasattr(self, "_health_result"):
            self._health_result: dict[str, object] = {}
            try:
                result = self._client.get("/health").json().get("result", {})
                self._health_result = result if isinstance(result, dict) else {}
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
        return self._health_result

    def open_episode(self, setup: EpisodeSetup) -> None:
        try:
            super().open_episode(setup)
        except httpx.TransportError as exc:
            raise TransientError(
                f"cannot reach the simulator at {self.url}: {type(exc).__name__}: {exc}. "
                "Start one with `agentrl-envs serve --port N` or check the URL."
            ) from None

    def handle(self, request: ToolRequest) -> ToolResponse:
        try:
            for _ in range(BUSY_RETRIES):
                response = super().handle(request)
                if response.status != 429 or response.error_type != "server_busy":
                    return response
                after = response.result.get("retry_after_s")
                time.sleep(min(MAX_RETRY_AFTER_S, float(after)) if isinstance(after, (int, float)) and after > 0 else 1.0)
            return response
        except httpx.TimeoutException as exc:
            return _transport_fault("timeout", 504, f"no answer from {self.url}: {type(exc).__name__}")
        except httpx.TransportError as exc:
            return _transport_fault("connection_reset", 599, f"connection to {self.url} failed: {type(exc).__name__}: {exc}")

    def close_episode(self, episode_id: str) -> None:
        try:
            super().close_episode(episode_id)
        except httpx.TransportError:
            pass  # the server is gone; so is the episode

    def put_file(self, episode_id: str, path: str, data: bytes) -> None:
        try:
            super().put_file(episode_id, path, data)
        except httpx.TransportError as exc:
            raise TransientError(f"could not write {path!r} to {self.url}: {exc}") from None

    def get_file(self, episode_id: str, path: str) -> bytes | None:
        try:
            return super().get_file(episode_id, path)
        except httpx.TransportError:
            return None


def _transport_fault(kind: str, status: int, message: str) -> ToolResponse:
    return ToolResponse(
        ok=False, status=status, error_type=kind, error=message, fault={"type": kind, "status": status, "origin": "service"}
    )
