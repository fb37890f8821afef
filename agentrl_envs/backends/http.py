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
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit

import httpx

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.backends.sim import WireClient
from agentrl_envs.errors import ConfigError, TransientError

__all__ = ["TOKEN_ENV", "HTTPBackend"]

#: the environment variable holding the bearer token of ``agentrl-envs serve`` (client and server)
TOKEN_ENV = "AGENTRL_SERVE_TOKEN"
BUSY_RETRIES = 8
MAX_RETRY_AFTER_S = 5.0


class HTTPBackend(WireClient):
    """The simulator API at ``url``.

    Args:
        url: ``http://host:port`` (or ``https://``) of the server.
        python_timeout_s: the Python tool's wall limit; the read timeout leaves room for it.
        connect_timeout_s: how long to wait for a connection.
        token: the server's bearer token (default: ``$AGENTRL_SERVE_TOKEN``; None sends none).
    """

    def __init__(
        self,
        url: str,
        python_timeout_s: float = 5.0,
        connect_timeout_s: float = 3.0,
        token: str | None = None,
        **_: object,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"backend URL {url[:200]!r}: expected http://host:port")
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise ConfigError(f"backend URL {url[:200]!r}: the port is not a number in 0-65535") from None
        self.url = url.rstrip("/")
        timeout = httpx.Timeout(connect=connect_timeout_s, read=python_timeout_s + 15.0, write=10.0, pool=5.0)
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        if token is not None and (not token.isascii() or not token.isprintable() or " " in token):
            raise ConfigError(f"the bearer token for {self.url} must be printable ASCII without spaces")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        super().__init__(httpx.Client(base_url=self.url, timeout=timeout, trust_env=False, headers=headers))

    @property
    def sandbox_tier(self) -> str | None:
        """The server's Python sandbox tier (from ``GET /health``; None if it does not say)."""
        tier = self._health().get("sandbox_tier")
        return tier[:16] if isinstance(tier, str) else None

    @property
    def numpy_available(self) -> bool:
        """Whether the server's Python offers numpy (from ``GET /health``; False if it does not say)."""
        return self._health().get("numpy") is True

    def _health(self) -> dict[str, object]:
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
