"""The OpenAPI 3.1 document of the simulator API (served at ``GET /openapi.json``).

The episode, file and database routes are written here; each tool's path and result schema come
from its :class:`~simulators.routes.ToolRoute` declaration (:data:`simulators.tools.TOOL_ROUTES`).
"""

from __future__ import annotations

from typing import Any

from simulators.routes import ToolRoute
from simulators.tools import TOOL_ROUTES

__all__ = ["OPENAPI", "tool_paths"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _success(**result: Any) -> dict[str, Any]:
    """A successful answer: ``{"ok": true, "result": {...}, "latency_s"?}``."""
    return {
        "type": "object",
        "properties": {
            "ok": {"const": True},
            "result": {"type": "object", "properties": result},
            "latency_s": {"type": "number"},
        },
    }


def _answers(result: str, *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": "the call was carried out", **_json(_ref(result))}}
    for status in errors:
        out[str(status)] = {"description": "the call failed; the body says why", **_json(_ref("Error"))}
    return out


_EPISODE = {
    "name": "episode_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
}
_FILE = {
    "name": "path",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "a path inside the workspace",
}
_OWNER = {
    "name": "X-AgentRL-Episode-Token",
    "in": "header",
    "required": True,
    "schema": {"type": "string"},
    "description": "the episode_token its POST /v1/episodes answered; other clients get 403",
}
_FORBIDDEN = {"description": "the episode belongs to another client (wrong or missing token)", **_json(_ref("Error"))}
_AT = {
    "name": "X-AgentRL-At",
    "in": "header",
    "required": False,
    "schema": {"type": "number", "minimum": 0, "maximum": 1e9},
    "description": "the episode's virtual time in seconds when the call goes out (used by server-side fault profiles); "
    "0 when absent; anything but a finite number from 0 to 1e9 is answered 400",
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "agentrl simulator",
        "version": "1",
        "description": "Simulated SQL, Python, SMTP and company REST (http) services for tool-using agents. Each episode has its own "
        "read-only database copy, workspace directory and mailbox, owned by the client that opened it. "
        "A server started with a bearer token answers 401 to requests without 'Authorization: Bearer <token>' "
        "(all but /health); a busy server answers 429 server_busy with Retry-After. "
        "A gateway to real services may speak this API too.",
    },
    "paths": {
        "/health": {"get": {"summary": "liveness", "responses": {"200": {"description": "alive"}}}},
        "/v1/databases/{fingerprint}": {
            "put": {
                "summary": "store a template database, copied per episode",
                "parameters": [
                    {
                        "name": "fingerprint",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^([A-Za-z0-9_.-]{0,100}-)?[0-9a-f]{16,64}$"},
                        "description": "<label>-<digest>: the digest starts the SHA-256 of json.dumps(tables, sort_keys=True)",
                    }
                ],
                "requestBody": {"required": True, **_json(_ref("Tables"))},
                "responses": {
                    "204": {"description": "stored"},
                    "400": {"description": "invalid tables", **_json(_ref("Error"))},
                    "422": {"description": "the tables do not hash to the fingerprint", **_json(_ref("Error"))},
                },
            }
        },
        "/v1/episodes": {
            "post": {
                "summary": "open an episode (replacing an open one of that id needs its owner's token)",
                "requestBody": {"required": True, **_json(_ref("EpisodeSetup"))},
                "responses": {
                    "201": {
                        "description": "opened; send episode_token with every later call on it",
                        **_json(_success(episode_id={"type": "string"}, episode_token={"type": "string"})),
                    },
                    "403": _FORBIDDEN,
                    "400": {"description": "invalid setup", **_json(_ref("Error"))},
                    "409": {"description": "unknown database fingerprint: PUT it first", **_json(_ref("Error"))},
                },
            }
        },
        "/v1/episodes/{episode_id}": {
            "delete": {
                "summary": "close an episode and delete its workspace",
                "parameters": [_EPISODE, _OWNER],
                "responses": {"204": {"description": "closed"}, "403": _FORBIDDEN},
            }
        },
        "/v1/episodes/{episode_id}/files/{path}": {
            "put": {
                "summary": "write a workspace file",
                "parameters": [_EPISODE, _OWNER, _FILE],
                "requestBody": {
                    "required": True,
                    **_json({"type": "object", "properties": {"text": {"type": "string"}, "b64": {"type": "string"}}}),
                },
                "responses": {
                    "204": {"description": "written"},
                    "400": {"description": "bad path or body", **_json(_ref("Error"))},
                    "403": _FORBIDDEN,
                },
            },
            "get": {
                "summary": "read a workspace file (base64)",
                "parameters": [_EPISODE, _OWNER, _FILE],
                "responses": {
                    "200": {"description": "the file", **_json(_ref("File"))},
                    "403": _FORBIDDEN,
                    "404": {"description": "no such file", **_json(_ref("Error"))},
                },
            },
        },
    },
    "components": {
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["ok", "error"],
                "properties": {
                    "ok": {"const": False},
                    "error": {
                        "type": "object",
                        "required": ["type", "message"],
                        "properties": {
                            "type": {"type": "string"},
                            "message": {"type": "string"},
                            "retry_after_s": {"type": "number"},
                        },
                    },
                    "latency_s": {"type": "number"},
                    "fault": {"type": ["object", "null"]},
                },
            },
            "Tables": {
                "type": "object",
                "required": ["tables"],
                "properties": {
                    "tables": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {
                                "columns": {
                                    "type": "array",
                                    "items": {
                                        "type": "array",
                                        "prefixItems": [{"type": "string"}, {"enum": ["INTEGER", "REAL", "TEXT"]}],
                                    },
                                },
                                "rows": {"type": "array", "items": {"type": "array"}},
                            },
                        },
                    }
                },
            },
            "EpisodeSetup": {
                "type": "object",
                "required": ["episode_id"],
                "properties": {
                    "episode_id": {"type": "string"},
                    "database": {"type": ["string", "null"], "description": "fingerprint of a stored template database"},
                    "files": {"type": "object", "additionalProperties": {"type": "string"}},
                    "sender": {"type": "string"},
                },
            },
            "File": {
                "type": "object",
                "properties": {
                    "ok": {"const": True},
                    "result": {"type": "object", "properties": {"path": {"type": "string"}, "b64": {"type": "string"}}},
                },
            },
        }
    },
}


def _tool_path(route: ToolRoute) -> dict[str, Any]:
    return {
        "post": {
            "summary": route.summary,
            "parameters": [_EPISODE, _OWNER, _AT],
            "requestBody": {"required": True, **_json(route.request)},
            "responses": _answers(route.result_name, *route.errors),
        }
    }


def tool_paths(routes: dict[str, ToolRoute]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The OpenAPI paths and component schemas of ``routes`` (one POST path and one result each)."""
    paths = {f"/v1/episodes/{{episode_id}}/{name}": _tool_path(route) for name, route in routes.items()}
    schemas = {route.result_name: _success(**route.result) for route in routes.values()}
    return paths, schemas


_paths, _schemas = tool_paths(TOOL_ROUTES)
OPENAPI["paths"].update(_paths)
OPENAPI["components"]["schemas"].update(_schemas)
