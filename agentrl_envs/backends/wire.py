"""The JSON wire format shared by the simulator API, ``sim``, ``http`` and ``agentrl-envs serve``.

A tool call is ``POST /v1/episodes/{id}/{tool}`` with the arguments as the JSON body and the
episode's virtual time in the ``X-AgentRL-At`` header. The answer is
``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": {"type", "message", ...}}``, with
optional ``latency_s`` and ``fault`` (set by a server-side fault profile).

Opening an episode answers an ``episode_token``; every later call on that episode carries it in the
``X-AgentRL-Episode-Token`` header (the server refuses other clients with 403). A server started
with a bearer token (``agentrl-envs serve --token``) also wants ``Authorization: Bearer <token>``
on every request (401 without it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError, PermanentError
from simulators.app import EPISODE_TOKEN_HEADER

__all__ = ["AT_HEADER", "EPISODE_TOKEN_HEADER", "episode_body", "open_episode", "response_body", "to_response"]

AT_HEADER = "X-AgentRL-At"


def episode_body(setup: EpisodeSetup) -> dict[str, Any]:
    return {
        "episode_id": setup.episode_id,
        "database": setup.database.fingerprint if setup.database else None,
        "files": setup.files,
        "sender": setup.sender,
        "seed": setup.seed,
        "mail_domains": list(setup.mail_domains) if setup.mail_domains is not None else None,
    }


def open_episode(setup: EpisodeSetup, call: Callable[[str, str, dict[str, Any]], tuple[int, str]]) -> str | None:
    """Open an episode: POST it, and on 409 (the server lacks the database) PUT the tables and retry.

    ``call(method, path, json_body)`` sends one request and answers (status, body text). Returns the
    episode's owner token (None from a server that does not issue them).
    """
    body = episode_body(setup)
    status, text = call("POST", "/v1/episodes", body)
    if status == 409 and setup.database is not None:
        put_status, put_text = call("PUT", f"/v1/databases/{setup.database.fingerprint}", {"tables": setup.database.tables})
        if put_status == 401:
            raise ConfigError(_UNAUTHORIZED)
        if put_status != 204:
            raise PermanentError(f"the simulator refused the episode database: {put_text[:500]}")
        status, text = call("POST", "/v1/episodes", body)
    if status == 401:
        raise ConfigError(_UNAUTHORIZED)
    if status != 201:
        raise PermanentError(f"the simulator refused to open the episode: HTTP {status} {text[:500]}")
    try:
        token = json.loads(text)["result"].get("episode_token")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return token if isinstance(token, str) else None


_UNAUTHORIZED = (
    "the simulator wants a bearer token (HTTP 401): set AGENTRL_SERVE_TOKEN (or pass token=) to the token "
    "`agentrl-envs serve` was started with"
)


def tool_path(request: ToolRequest) -> str:
    return f"/v1/episodes/{request.episode_id}/{request.tool}"


def to_response(status: int, payload: Any) -> ToolResponse:
    """A :class:`ToolResponse` from a decoded answer; a malformed one is a 502 ``bad_gateway``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("ok"), bool):
        return ToolResponse(ok=False, status=502, error_type="bad_gateway", error=f"malformed response (HTTP {status})")
    latency = payload.get("latency_s")
    latency_s = float(latency) if isinstance(latency, (int, float)) and latency >= 0 else 0.0
    fault = payload.get("fault") if isinstance(payload.get("fault"), dict) else None
    if payload["ok"]:
        result = payload.get("result")
        return ToolResponse(
            ok=True, status=status, result=result if isinstance(result, dict) else {}, latency_s=latency_s, fault=fault
        )
    raw = payload.get("error")
    err: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return ToolResponse(
        ok=False,
        status=status,
        result={k: v for k, v in err.items() if k not in ("type", "message")},
        error_type=str(err.get("type", "error")),
        error=str(err.get("message", "")),
        latency_s=latency_s,
        fault=fault,
    )


def response_body(response: ToolResponse) -> dict[str, Any]:
    """The wire form of a :class:`ToolResponse` (what ``serve`` answers)."""
    body: dict[str, Any]
    if response.ok:
        body = {"ok": True, "result": response.result}
    else:
        body = {"ok": False, "error": {"type": response.error_type, "message": response.error, **response.result}}
    if response.latency_s:
        body["latency_s"] = response.latency_s
    if response.fault is not None:
        body["fault"] = response.fault
    return body
