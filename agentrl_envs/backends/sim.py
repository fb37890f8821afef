"""The default backend: the simulator in process, through ``httpx.MockTransport``.

Requests and responses are real ``httpx`` objects with JSON bodies, the same wire format as
``agentrl-envs serve`` over HTTP, but nothing leaves the process and nothing sleeps.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import PermanentError
from simulators import SimulatorApp
from simulators.python import RunLimits

__all__ = ["SimBackend"]


class SimBackend:
    """In-process simulator backend.

    Args:
        sql_deadline_s: statement deadline of the simulated SQL service.
        python_timeout_s: wall deadline of one Python run.
    """

    def __init__(self, sql_deadline_s: float = 2.0, python_timeout_s: float = 5.0) -> None:
        limits = RunLimits(wall_s=python_timeout_s, cpu_s=max(1, int(python_timeout_s + 0.999)))
        self.app = SimulatorApp(sql_deadline_s=sql_deadline_s, python_limits=limits)
        self._client = httpx.Client(transport=httpx.MockTransport(self.app.handle), base_url="http://agentrl.sim")

    def open_episode(self, setup: EpisodeSetup) -> None:
        body: dict[str, Any] = {
            "episode_id": setup.episode_id,
            "database": setup.database.fingerprint if setup.database else None,
            "files": setup.files,
            "sender": setup.sender,
        }
        response = self._client.post("/v1/episodes", json=body)
        if response.status_code == 409 and setup.database is not None:
            put = self._client.put(f"/v1/databases/{setup.database.fingerprint}", json={"tables": setup.database.tables})
            if put.status_code != 204:
                raise PermanentError(f"the simulator refused the episode database: {put.text[:500]}")
            response = self._client.post("/v1/episodes", json=body)
        if response.status_code != 201:
            raise PermanentError(f"the simulator refused to open the episode: {response.text[:500]}")

    def handle(self, request: ToolRequest) -> ToolResponse:
        response = self._client.post(f"/v1/episodes/{request.episode_id}/{request.tool}", json=request.arguments)
        return parse_response(response)

    def close_episode(self, episode_id: str) -> None:
        self._client.delete(f"/v1/episodes/{episode_id}")

    def close(self) -> None:
        self._client.close()
        self.app.close()


def parse_response(response: httpx.Response) -> ToolResponse:
    """Turn a wire response into a :class:`ToolResponse` (a malformed body is a 502)."""
    try:
        payload = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if not isinstance(payload, dict) or "ok" not in payload:
        return ToolResponse(
            ok=False, status=502, error_type="bad_gateway", error=f"malformed response (HTTP {response.status_code})"
        )
    if payload["ok"]:
        return ToolResponse(ok=True, status=response.status_code, result=payload.get("result") or {})
    err = payload.get("error") or {}
    return ToolResponse(
        ok=False,
        status=response.status_code,
        result={k: v for k, v in err.items() if k not in ("type", "message")},
        error_type=str(err.get("type", "error")),
        error=str(err.get("message", "")),
    )
