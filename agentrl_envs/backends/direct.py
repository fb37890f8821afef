"""``backend="direct"``: the simulator called in process with no wire at all.

The fastest path, for benchmarks and for the server behind ``agentrl-envs serve``. The default
``sim`` backend speaks the JSON wire through ``httpx.MockTransport`` instead, so that what works
in process works over HTTP too.
"""

from __future__ import annotations

import base64
from typing import Any

from agentrl_envs.backends import wire
from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.backends.inprocess import InProcessSimulator, make_app
from agentrl_envs.backends.lazy import LazyEpisodes
from agentrl_envs.backends.wire import to_response
from agentrl_envs.errors import PermanentError
from simulators import SimulatorApp

__all__ = ["DirectBackend"]


class DirectBackend(InProcessSimulator, LazyEpisodes):
    """The simulator as Python calls. Episodes open at their first call (:mod:`~agentrl_envs.backends.lazy`).

    Args:
        app: a simulator to use (default: a new one with the given limits).
        sql_deadline_s: statement deadline of the simulated SQL service.
        python_timeout_s: wall deadline of one Python run.
        python_sandbox: run programs in the hardened sandbox (default) rather than a plain subprocess.
        allow_unsafe_sandbox: accept a sandbox that can only apply rlimits (tier UNSAFE).
        lazy_python: start the Python runner at the first Python run (or the first look at
            ``sandbox_tier`` / ``numpy_available``), not now: what envs without the python tool ask for.
    """

    def __init__(
        self,
        app: SimulatorApp | None = None,
        sql_deadline_s: float = 2.0,
        python_timeout_s: float = 5.0,
        python_sandbox: bool = True,
        allow_unsafe_sandbox: bool = False,
        lazy_python: bool = False,
    ) -> None:
        self.app = app or make_app(sql_deadline_s, python_timeout_s, python_sandbox, allow_unsafe_sandbox, lazy_python)

    def _open_now(self, setup: EpisodeSetup) -> None:
        def call(method: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
            status, reply = self.app.call(method, path, body)
            return status, str(reply)

        wire.open_episode(setup, call)

    def handle(self, request: ToolRequest) -> ToolResponse:
        self._ready(request.episode_id)
        status, reply = self.app.tool(request.episode_id, request.tool, dict(request.arguments))
        return to_response(status, reply)

    def close_episode(self, episode_id: str) -> None:
        if self._was_opened(episode_id):
            self.app.close_episode(episode_id)

    def close(self) -> None:
        self.app.close()

    # -- workspace files (used when another backend serves a tool of the same episode) ----------

    def put_file(self, episode_id: str, path: str, data: bytes) -> None:
        self._ready(episode_id)
        status, reply = self.app.put_file(episode_id, path, {"b64": base64.b64encode(data).decode()})
        if status != 204:
            raise PermanentError(f"could not write {path!r} to the workspace: {reply}")

    def get_file(self, episode_id: str, path: str) -> bytes | None:
        self._ready(episode_id)
        status, reply = self.app.get_file(episode_id, path)
        return _file_bytes(status, reply)


def _file_bytes(status: int, reply: Any) -> bytes | None:
    if status != 200 or not isinstance(reply, dict):
        return None
    try:
        return base64.b64decode(reply["result"]["b64"])
    except (KeyError, TypeError, ValueError):
        return None
