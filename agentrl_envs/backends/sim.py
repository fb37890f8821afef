"""The default backend: the simulator in process, over its JSON wire.

Requests and responses are the same bytes as ``agentrl-envs serve`` sends over HTTP (method, path,
JSON body, owner token), served by :meth:`SimulatorApp.handle_bytes`, but nothing leaves the
process and nothing sleeps. Tool calls, opens and closes hand the bytes over directly: building
``httpx`` request and response objects around them (``httpx.MockTransport``) cost ~0.3 ms per
call, more than the SQL point lookup itself (``benchmarks/bench_env.py`` section 1b). Workspace
file transfers still go through an ``httpx.Client`` on a ``MockTransport``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from agentrl_envs.backends import wire
from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.backends.inprocess import InProcessSimulator, make_app
from agentrl_envs.backends.lazy import LazyEpisodes
from agentrl_envs.backends.wire import AT_HEADER, EPISODE_TOKEN_HEADER, to_response, tool_path
from agentrl_envs.errors import PermanentError

__all__ = ["SimBackend", "WireClient"]


class WireClient:
    """A backend that speaks the simulator API through an ``httpx.Client`` (in process or HTTP).

    Keeps the owner token of each episode it opened and sends it with every call on that episode.
    """

    def __init__(self, client: httpx.Client) -> None:
        self._client = client
        self._tokens: dict[str, str] = {}

    def open_episode(self, setup: EpisodeSetup) -> None:
        def call(method: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
            response = self._send(method, path, self._owner(setup.episode_id), json=body)
            return response.status_code, response.text

        token = wire.open_episode(setup, call)
        if token is not None:
            self._tokens[setup.episode_id] = token

    def handle(self, request: ToolRequest) -> ToolResponse:
        headers = {AT_HEADER: repr(request.at_s), **self._owner(request.episode_id)}
        response = self._client.post(tool_path(request), json=request.arguments, headers=headers)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        return to_response(response.status_code, payload)

    def close_episode(self, episode_id: str) -> None:
        headers = self._owner(episode_id)
        self._tokens.pop(episode_id, None)
        self._send("DELETE", f"/v1/episodes/{episode_id}", headers)

    def close(self) -> None:
        self._client.close()

    def put_file(self, episode_id: str, path: str, data: bytes) -> None:
        body = {"b64": base64.b64encode(data).decode()}
        response = self._send("PUT", f"/v1/episodes/{episode_id}/files/{path}", self._owner(episode_id), json=body)
        if response.status_code != 204:
            raise PermanentError(f"could not write {path!r} to the workspace: HTTP {response.status_code} {response.text[:300]}")

    def get_file(self, episode_id: str, path: str) -> bytes | None:
        try:
            response = self._send("GET", f"/v1/episodes/{episode_id}/files/{path}", self._owner(episode_id))
        except httpx.InvalidURL:  # a name no URL can carry (control characters) names no file
            return None
        if response.status_code != 200:
            return None
        try:
            return base64.b64decode(response.json()["result"]["b64"])
        except (KeyError, TypeError, ValueError):
            return None

    def _owner(self, episode_id: str) -> dict[str, str]:
        token = self._tokens.get(episode_id)
        return {EPISODE_TOKEN_HEADER: token} if token is not None else {}

    def _send(self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: object) -> httpx.Response:
        return self._client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]


class SimBackend(InProcessSimulator, LazyEpisodes, WireClient):
    """In-process simulator backend. Episodes open at their first call (:mod:`~agentrl_envs.backends.lazy`).

    Args:
        sql_deadline_s: statement deadline of the simulated SQL service.
        python_timeout_s: wall deadline of one Python run.
        python_sandbox: run programs in the hardened sandbox (default) rather than a plain subprocess.
        allow_unsafe_sandbox: accept a sandbox that can only apply rlimits (tier UNSAFE).
        lazy_python: start the Python runner at the first Python run (or the first look at
            ``sandbox_tier`` / ``numpy_available``), not now: what envs without the python tool ask for.
    """

    def __init__(
        self,
        sql_deadline_s: float = 2.0,
        python_timeout_s: float = 5.0,
        python_sandbox: bool = True,
        allow_unsafe_sandbox: bool = False,
        lazy_python: bool = False,
    ) -> None:
        self.app = make_app(sql_deadline_s, python_timeout_s, python_sandbox, allow_unsafe_sandbox, lazy_python)
        super().__init__(httpx.Client(transport=httpx.MockTransport(self.app.handle), base_url="http://agentrl.sim"))

    def _bytes(self, method: str, path: str, episode_id: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        """One request on the wire, as bytes in and out (``ensure_ascii`` keeps any str encodable)."""
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        status, out, _ = self.app.handle_bytes(method, path, data, self._tokens.get(episode_id))
        return status, out

    def _open_now(self, setup: EpisodeSetup) -> None:
        def call(method: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
            status, out = self._bytes(method, path, setup.episode_id, body)
            return status, out.decode("utf-8", "replace")

        token = wire.open_episode(setup, call)
        if token is not None:
            self._tokens[setup.episode_id] = token

    def handle(self, request: ToolRequest) -> ToolResponse:
        self._ready(request.episode_id)
        status, out = self._bytes("POST", tool_path(request), request.episode_id, request.arguments)
        try:
            payload = json.loads(out) if out else None
        except ValueError:
            payload = None
        return to_response(status, payload)

    def close_episode(self, episode_id: str) -> None:
        if self._was_opened(episode_id):
            self._bytes("DELETE", f"/v1/episodes/{episode_id}", episode_id, None)
            self._tokens.pop(episode_id, None)

    def put_file(self, episode_id: str, path: str, data: bytes) -> None:
        self._ready(episode_id)
        super().put_file(episode_id, path, data)

    def get_file(self, episode_id: str, path: str) -> bytes | None:
        self._ready(episode_id)
        return super().get_file(episode_id, path)

    def close(self) -> None:
        super().close()
        self.app.close()
