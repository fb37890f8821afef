"""What a simulated tool declares: its route, its handler and the schemas of its OpenAPI entry.

Each ``simulators/<tool>/route.py`` defines one :class:`ToolRoute`; :data:`simulators.tools.TOOL_ROUTES`
finds them (no registration line). :class:`~simulators.app.SimulatorApp` dispatches ``POST /v1/episodes/{id}/<tool>`` to
the declared handler and :mod:`simulators.openapi` writes each tool's path and result schema from
the declaration, so neither is written per tool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Reply", "ToolRoute", "err", "ok"]

#: (HTTP status, JSON body or None for an empty body)
Reply = tuple[int, "dict[str, Any] | None"]


def ok(result: dict[str, Any], status: int = 200) -> Reply:
    """A successful answer: ``{"ok": true, "result": result}``."""
    return status, {"ok": True, "result": result}


def err(status: int, kind: str, message: str, **extra: Any) -> Reply:
    """A failed answer: ``{"ok": false, "error": {"type", "message", ...}}``."""
    return status, {"ok": False, "error": {"type": kind, "message": message, **extra}}


@dataclass(frozen=True)
class ToolRoute:
    """One tool of the simulator.

    Attributes:
        name: the tool's name, the last segment of ``POST /v1/episodes/{episode_id}/<name>``.
        summary: one line for the OpenAPI document.
        handler: ``handler(app, episode, payload) -> Reply``; ``app`` is the
            :class:`~simulators.app.SimulatorApp`, ``episode`` its open episode (locked for the call).
        request: JSON schema of the request body.
        result: JSON schema properties of a successful answer's ``result``.
        result_name: the name of the result's schema in the document's components.
        errors: the HTTP statuses the call may fail with (listed in the OpenAPI document).
        lane: the server's worker pool for the call: ``python`` and ``sql`` have their own (slow
            programs must not hold up queries), every other tool shares ``control``.
    """

    name: str
    summary: str
    handler: Callable[[Any, Any, dict[str, Any]], Reply]
    request: dict[str, Any]
    result: dict[str, Any]
    result_name: str
    errors: tuple[int, ...] = (401, 403, 404, 422, 429, 500, 503)
    lane: str = "control"
