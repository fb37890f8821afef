"""The ``sql`` tool: one read-only query on the episode's database."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agentrl_envs.backends.base import Backend, ToolResponse
from agentrl_envs.tasks.base import SubTask, Task, normalize_rows
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.state import StepState
from agentrl_envs.text.observation import cell
from agentrl_envs.tools.base import Tool, pick, render_error
from agentrl_envs.tools.perturb import each, shift_month, swap_words

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
    aux_term: ClassVar[float | None] = 0.3
    log_names: ClassVar[tuple[str, ...]] = ("sql", "query", "db")
    backend_schemes: ClassVar[tuple[str, ...]] = ("postgresql://", "postgres://", "postgresql+psycopg://")
    component: ClassVar[str | None] = "queried"
    max_rows: int = 20

    def observe(
        self, subs: Sequence[SubTask], states: Sequence[StepState], arguments: dict[str, Any], response: ToolResponse
    ) -> list[int]:
        """A query that returned rows completes the first sub-task still waiting for one; a result
        holding a sub-task's gold rows is remembered as the file its program should read."""
        moved: list[int] = []
        if response.ok and response.result.get("rows"):
            rows = normalize_rows(response.result["rows"])
            for sub, st in zip(subs, states):
                if sub.gold_rows is not None and rows == sub.gold_rows:
                    st.gold_csv = response.result.get("csv_path")
            for i, (sub, st) in enumerate(zip(subs, states)):
                if self.name in sub.steps and not st.done[self.name]:
                    st.done[self.name] = True
                    moved.append(i)
                    break
        return moved

    def gold_call(self, sub: SubTask, state: StepState) -> dict[str, Any] | None:
        from agentrl_envs.tools import TOOLS

        # Query again when a later step still needs the saved gold result and no file holds it.
        needs_csv = state.gold_csv is None and any(TOOLS[t].reads_query_csv and not state.done[t] for t in sub.steps)
        return {"query": sub.gold_sql} if not state.done[self.name] or needs_csv else None

    def details(self, response: ToolResponse) -> dict[str, Any]:
        r = response.result
        return {
            "row_count": r.get("row_count"),
            "columns": r.get("columns"),
            "csv_path": r.get("csv_path"),
            "truncated": r.get("truncated"),
        }

    def work_latency_s(self, response: ToolResponse, faults: Any) -> float:
        """SQLite VM steps times the profile's ``sql_s_per_mstep``."""
        steps = response.result.get("vm_steps") if response.ok else None
        if isinstance(steps, (int, float)):
            return float(steps) / 1e6 * faults.sql_s_per_mstep
        return 0.0

    def perturb(self, task: Task, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """Another filter value, another aggregate, no filter, the wrong table."""
        domain = DOMAINS[task.domain]
        query = arguments["query"]
        out: list[str] = []
        for old in re.findall(r"'([^']*)'", query):
            pool = domain.units if old in domain.units else domain.categories if old in domain.categories else ()
            for other in pool:
                if other != old:
                    out.append(query.replace(f"'{old}'", f"'{other}'", 1))
                    break
        for a, b in (("SUM(", "AVG("), ("AVG(", "SUM("), ("COUNT(*)", "SUM(1) + 1"), ("DESC", "ASC")):
            if a in query:
                out.append(query.replace(a, b, 1))
        if " WHERE " in query:
            out.append(query.split(" WHERE ")[0])
        out.append(query.replace(f" {domain.fact}", f" {domain.entity}", 1))
        return [{"query": q} for q in out]

    def perturb_hard(self, task: Task, arguments: dict[str, Any], context: str) -> list[dict[str, Any]]:
        """A wrong aggregate or column, a flipped comparison or order, an off-by-one month, a dropped filter."""
        domain = DOMAINS[task.domain]
        query = arguments["query"]
        variants = [
            swap_words(query, [("SUM(", "AVG("), ("AVG(", "SUM("), ("AVG(", "MAX("), ("SUM(", "MAX(")]),
            swap_words(query, [("COUNT(DISTINCT ", "COUNT(ALL "), ("COUNT(*)", f"COUNT(DISTINCT {domain.entity_key})")]),
            swap_words(query, [(f"({domain.measure})", f"({domain.count})"), (f"(f.{domain.measure})", f"(f.{domain.count})")]),
            swap_words(query, [(" DESC", " ASC"), ("LIMIT 1", "LIMIT 1 OFFSET 1"), (" > ", " <= "), (" > ", " < ")]),
            each(query, r"(\w+) = '", lambda m: f"{m.group(1)} != '"),
            each(query, r"'(\d{4})-(\d{2})'", lambda m: f"'{shift_month(m.group(1), m.group(2), 1)}'"),
            each(query, r"'(\d{4})-(\d{2})'", lambda m: f"'{shift_month(m.group(1), m.group(2), -1)}'"),
            each(query, r" AND [^']*'[^']*'", lambda m: ""),
        ]
        if " BETWEEN '2025-01-01' AND '2025-06-30'" in query:
            variants.append([query.replace("'2025-01-01' AND '2025-06-30'", "'2025-07-01' AND '2025-12-31'")])
        elif " BETWEEN '2025-07-01' AND '2025-12-31'" in query:
            variants.append([query.replace("'2025-07-01' AND '2025-12-31'", "'2025-01-01' AND '2025-06-30'")])
        return [{"query": v} for vs in variants for v in vs]

    def random_arguments(self, task: Task | None, rng: np.random.Generator, number: float) -> dict[str, Any]:
        domain = DOMAINS[task.domain] if task is not None else DOMAINS["retail"]
        table = pick(rng, [domain.fact, domain.entity, "staff"])
        query = pick(
            rng,
            [
                f"SELECT * FROM {table} LIMIT {int(rng.integers(1, 20))}",
                f"SELECT COUNT(*) FROM {table}",
                f"SELECT {domain.unit}, SUM({domain.measure}) FROM {domain.fact} GROUP BY {domain.unit}",
                f"SELECT * FROM {table} WHERE {domain.unit} = '{pick(rng, domain.units)}'",
            ],
        )
        return {"query": query}

    def guess(self, task: Task) -> dict[str, Any] | None:
        return {"query": f"SELECT * FROM {DOMAINS[task.domain].fact} LIMIT 5"}

    def real_backend(self, url: str, **options: Any) -> Backend:
        from agentrl_envs.backends.postgres import PostgresBackend

        return PostgresBackend(url, sql_deadline_s=options.get("sql_deadline_s", 2.0))

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
