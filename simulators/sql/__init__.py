"""Simulated SQL service: read-only queries on a per-episode SQLite copy."""

from simulators.sql.engine import (
    MAX_RESULT_BYTES,
    MAX_RESULT_ROWS,
    QueryResult,
    ReadOnlyDatabase,
    SQLError,
    TemplateCache,
    build_database,
    collect_rows,
    format_rows,
    table_keys,
)

__all__ = [
    "MAX_RESULT_BYTES",
    "MAX_RESULT_ROWS",
    "QueryResult",
    "ReadOnlyDatabase",
    "SQLError",
    "TemplateCache",
    "build_database",
    "collect_rows",
    "format_rows",
    "table_keys",
]
