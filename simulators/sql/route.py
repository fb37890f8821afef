"""The ``sql`` tool's route: one read-only statement on the episode's database copy."""

from __future__ import annotations

from typing import Any

from simulators.routes import Reply, ToolRoute, err, ok
from simulators.sql.engine import SQLError

__all__ = ["MAX_PENDING_BYTES", "ROUTE"]

#: Bytes of query results an episode may hold in memory before they are written to its workspace.
MAX_PENDING_BYTES = 8 << 20

_STATUS = {"timeout": 408, "denied": 403, "too_large": 413, "syntax": 400, "unknown_name": 400}


def handle(app: Any, episode: Any, payload: dict[str, Any]) -> Reply:
    """Run the query; keep its CSV as ``results/qN.csv`` (written to the workspace when it is needed)."""
    if episode.database is None:
        return err(404, "no_database", "this episode has no database")
    query = payload.get("query")
    if not isinstance(query, str):
        return err(422, "bad_arguments", "'query' must be a string")
    try:
        result = episode.database.query(query)
    except SQLError as exc:
        return err(_STATUS.get(exc.kind, 400), exc.kind, exc.message)
    episode.queries += 1
    csv_path = f"results/q{episode.queries}.csv"
    data = result.csv_text.encode("utf-8", "surrogatepass")  # bytes: not tracked by the cycle collector
    episode.pending.add(episode.queries, data)
    if episode.pending_bytes > MAX_PENDING_BYTES:
        episode.workspace  # noqa: B018 (writes the pending results out)
    reply: dict[str, Any] = {
        "columns": result.columns,
        "rows": [list(r) for r in result.rows],
        "row_count": len(result.rows),
        "truncated": result.truncated,
        "csv_path": csv_path,
        "vm_steps": result.vm_steps,
    }
    if result.truncated_by is not None:
        reply["truncated_by"] = result.truncated_by
    return ok(reply)


ROUTE = ToolRoute(
    name="sql",
    summary="run one read-only SQL statement; the result is also saved as results/qN.csv",
    handler=handle,
    request={"type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}},
    result={
        "columns": {"type": "array", "items": {"type": "string"}},
        "rows": {"type": "array"},
        "row_count": {"type": "integer"},
        "truncated": {"type": "boolean"},
        "csv_path": {"type": "string"},
        "vm_steps": {"type": "integer"},
    },
    result_name="SQLResult",
    errors=(400, 401, 403, 404, 408, 413, 422, 429, 500, 503),
    lane="sql",
)
