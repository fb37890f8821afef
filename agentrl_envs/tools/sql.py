"""The ``sql`` tool: one read-only query on the episode's database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.tools.base import Tool, render_error
from agentrl_envs.tools.text import cell

__all__ = ["SQLTool"]


@dataclass(frozen=True)
class SQLTool(Tool):
    """Read-only SQL. The observation shows up to ``max_rows`` rows; all rows go to a CSV file."""

    name: ClassVar[str] = "sql"
    description: ClassVar[str] = (
        "Run one read-only SQL SELECT on the episode's database (SQLite dialect). The full result "
        "is saved as a CSV file in the workspace (results/qN.csv), where the python tool can read it."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "one SQL SELECT statement"}},
        "required": ["query"],
    }
    max_rows: int = 20

    def render(self, response: ToolResponse) -> str:
        if not response.ok:
            return render_error(self.name, response)
        r = response.result
        columns: list[str] = r.get("columns", [])
        rows: list[list[Any]] = r.get("rows", [])
        lines = [
            f"sql ok: {len(rows)}{'+' if r.get('truncated') else ''} row(s) x {len(columns)} column(s), "
            f"saved to {r.get('csv_path')}"
        ]
        # Right under the header, so the note survives when a wide result's observation is clipped.
        if r.get("truncated_by") == "bytes":
            lines.append("[the result was cut at the service's size limit: select fewer or narrower columns, or add LIMIT]")
        elif r.get("truncated"):
            lines.append("[the result was cut at the service's row limit]")
        lines.append(",".join(cell(c) for c in columns))
        for row in rows[: self.max_rows]:
            lines.append(",".join(cell(v) for v in row))
        if len(rows) > self.max_rows:
            lines.append(f"[showing {self.max_rows} of {len(rows)} rows; all rows are in {r.get('csv_path')}]")
        return "\n".join(lines)
