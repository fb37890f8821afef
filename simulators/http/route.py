"""The ``http`` tool's route: one call to the episode's company REST service (:mod:`simulators.http.service`).

The service is built from the episode's database on the first call and kept with the episode, so
writes (a ticket opened, closed, reassigned) last until the episode closes. A call is checked by
:func:`simulators.http.request.check_call` (the same check real backends apply) and answered by
:func:`reply_of`: ``ok({"status", "body"})`` for a 2xx, ``err(status, type, message)`` otherwise.
"""

from __future__ import annotations

from typing import Any

from simulators.http.request import METHODS, RequestError, check_call
from simulators.http.service import CompanyAPI
from simulators.routes import Reply, ToolRoute, err, ok

__all__ = ["ROUTE", "reply_of"]


def reply_of(status: int, body: Any) -> Reply:
    """The tool reply for the company service's answer ``(status, JSON body)``.

    A 2xx is ``ok({"status": status, "body": body})`` (the envelope's own status stays 200, so a
    204 can carry it); anything else is ``err(status, type, message)`` with the body's
    ``{"error": {"type", "message"}}`` when it has one, else ``http_<status>`` and the raw body.
    """
    if 200 <= status < 300:
        return ok({"status": status, "body": body})
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str):
        return err(status, error["type"][:64], error["message"][:2000])
    text = body if isinstance(body, str) else "" if body is None else repr(body)
    return err(status, f"http_{status}", f"the service answered HTTP {status}: {text[:500]}")


def handle(app: Any, episode: Any, payload: dict[str, Any]) -> Reply:
    """Send one call to the episode's company service (built from its database on first use)."""
    try:
        call = check_call(payload)
    except RequestError as exc:
        return err(exc.status, exc.kind, exc.message)
    if episode.services is None:
        episode.services = {}
    api = episode.services.get("http")
    if api is None:
        if episode.database is None:
            return err(404, "no_service", "this episode has no company service (it has no database)")
        api = episode.services["http"] = CompanyAPI.from_database(episode.database)
    return reply_of(*api.handle(call))


ROUTE = ToolRoute(
    name="http",
    summary="one call to the company's REST service (CRM and ticketing; GET /openapi.json describes it)",
    handler=handle,
    request={
        "type": "object",
        "required": ["method", "path"],
        "properties": {
            "method": {"enum": list(METHODS)},
            "path": {"type": "string"},
            "body": {"type": "object"},
            "query": {"type": "object"},
        },
    },
    result={"status": {"type": "integer"}, "body": {}},
    result_name="HTTPResult",
    errors=(400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 503),
)
