"""Read-only SQL on a per-episode SQLite copy, behind SQLAlchemy.

A template database is built once per data set (keyed by a fingerprint) and kept as serialized
bytes; every episode gets its own copy through ``sqlite3.deserialize`` (~0.06 ms, a fresh build
costs ~28 ms). The agent's connection is read-only through an authorizer allow-list (``PRAGMA
query_only`` could be switched off by the agent), has a statement deadline enforced by a progress
handler, and SQLite length limits. Functions that burn CPU without yielding to the progress
handler (``printf('%.*c', 999999999, 'x')``) are not on the allow-list.
"""

from __future__ import annotations

import collections
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy
from sqlalchemy.pool import StaticPool

#: Functions an agent may call. Everything else (load_extension, printf/format, zeroblob,
#: randomblob, readfile, ...) is refused by the authorizer.
ALLOWED_FUNCTIONS = frozenset(
    """
    abs avg coalesce count date datetime group_concat ifnull iif instr julianday length like
    lower ltrim max min nullif replace round rtrim sign strftime substr substring sum time total
    trim typeof unicode upper glob hex quote char cast ceil ceiling floor exp ln log log10 log2 mod
    pow power sqrt pi string_agg row_number rank dense_rank percent_rank cume_dist ntile lag lead
    first_value last_value nth_value time unixepoch concat concat_ws likely unlikely
    """.split()
)

_AUTH = sqlite3
_ALLOWED_ACTIONS = frozenset({_AUTH.SQLITE_SELECT, _AUTH.SQLITE_READ, _AUTH.SQLITE_RECURSIVE})

MAX_QUERY_CHARS = 20_000
#: SQLite VM steps between deadline checks: often enough to stop a runaway query within
#: milliseconds, rare enough not to slow a normal one (each check is a call into Python).
PROGRESS_STEPS = 10_000
MAX_RESULT_ROWS = 10_000
MAX_VALUE_CHARS = 10_000


class SQLError(Exception):
    """A query was refused or failed; ``kind`` names why (``syntax``, ``denied``, ``timeout``, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class QueryResult:
    """Rows of one query; ``truncated`` when more than ``MAX_RESULT_ROWS`` matched."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    vm_steps: int = 0
    elapsed_s: float = 0.0


def build_database(tables: dict[str, dict[str, Any]]) -> bytes:
    """Build a SQLite database from ``{name: {"columns": [[name, type], ...], "rows": [[...]]}}``.

    Returns the serialized database, ready to be copied per episode.
    """
    if not isinstance(tables, dict) or not tables:
        raise ValueError("a database needs at least one table")
    conn = sqlite3.connect(":memory:")
    try:
        for name, table in tables.items():
            _check_identifier(name)
            if name.lower().startswith("sqlite_"):
                raise ValueError(f"table name {name!r} is reserved by SQLite")
            if not isinstance(table, dict) or not table.get("columns"):
                raise ValueError(f"table {name!r}: expected {{'columns': [[name, type], ...], 'rows': [...]}} with columns")
            _check_identifier(name)
            cols = table["columns"]
            for col_name, col_type in cols:
                _check_identifier(col_name)
                if col_type not in ("INTEGER", "REAL", "TEXT"):
                    raise ValueError(f"column {name}.{col_name}: unsupported type {col_type!r}")
            ddl = ", ".join(f'"{c}" {t}' for c, t in cols)
            conn.execute(f'CREATE TABLE "{name}" ({ddl})')
            marks = ", ".join("?" for _ in cols)
            conn.executemany(f'INSERT INTO "{name}" VALUES ({marks})', table.get("rows", []))
        conn.commit()
        return conn.serialize()
    except (sqlite3.Error, TypeError) as exc:
        raise ValueError(f"could not build the database: {exc}") from None
    finally:
        conn.close()


def _check_identifier(name: str) -> None:
    if not (isinstance(name, str) and name.isidentifier() and len(name) <= 64):
        raise ValueError(f"invalid table or column name {name!r}: use a Python-style identifier")


class TemplateCache:
    """Serialized template databases by fingerprint, least recently used evicted first."""

    def __init__(self, max_templates: int = 64) -> None:
        self._max = max_templates
        self._items: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, fingerprint: str) -> bool:
        with self._lock:
            return fingerprint in self._items

    def put(self, fingerprint: str, tables: dict[str, dict[str, Any]]) -> None:
        data = build_database(tables)
        with self._lock:
            self._items[fingerprint] = data
            self._items.move_to_end(fingerprint)
            while len(self._items) > self._max:
                self._items.popitem(last=False)

    def get(self, fingerprint: str) -> bytes | None:
        with self._lock:
            data = self._items.get(fingerprint)
            if data is not None:
                self._items.move_to_end(fingerprint)
            return data


@dataclass
class ReadOnlyDatabase:
    """One episode's private, read-only copy of a template database.

    Args:
        image: serialized template (from :func:`build_database`).
        deadline_s: wall-clock budget of one statement.
    """

    image: bytes
    deadline_s: float = 2.0
    _engine: sqlalchemy.Engine = field(init=False, repr=False)
    _raw: sqlite3.Connection = field(init=False, repr=False)
    _deadline: float = field(init=False, default=0.0, repr=False)
    _steps: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        raw = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        raw.deserialize(self.image)
        raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
        raw.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS * 4)
        raw.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 200)
        raw.setlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 50)
        raw.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        raw.setlimit(sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 16)
        raw.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 200)
        self._raw = raw
        self._engine = sqlalchemy.create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool)
        self._conn = self._engine.connect()
        # After SQLAlchemy's first-connect PRAGMAs, which the authorizer would refuse.
        raw.set_authorizer(_authorize)
        raw.set_progress_handler(self._progress, PROGRESS_STEPS)

    def _progress(self) -> int:
        self._steps += PROGRESS_STEPS
        return 1 if time.perf_counter() > self._deadline else 0

    def query(self, sql: str) -> QueryResult:
        """Run one read-only statement and fetch at most ``MAX_RESULT_ROWS`` rows."""
        if not isinstance(sql, str):
            raise SQLError("bad_request", "query must be a string")
        if not sql.strip():
            raise SQLError("bad_request", "query is empty")
        if len(sql) > MAX_QUERY_CHARS:
            raise SQLError("too_large", f"query is {len(sql)} characters; the limit is {MAX_QUERY_CHARS}")
        if "\x00" in sql:
            raise SQLError("bad_request", "query contains a NUL character")
        self._steps = 0
        start = time.perf_counter()
        self._deadline = start + self.deadline_s
        try:
            cursor = self._conn.exec_driver_sql(sql)
            columns = list(cursor.keys()) if cursor.returns_rows else []
            fetched = cursor.fetchmany(MAX_RESULT_ROWS + 1) if cursor.returns_rows else []
            cursor.close()
        except sqlalchemy.exc.DBAPIError as exc:
            raise _translate(exc.orig, time.perf_counter() - start, self.deadline_s) from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise SQLError("error", str(exc).splitlines()[0]) from None
        except (OverflowError, ValueError, MemoryError, RecursionError) as exc:
            raise SQLError("error", f"{type(exc).__name__}: {exc}") from None
        finally:
            self._rollback_quietly()
        rows = [tuple(_cap_value(v) for v in row) for row in fetched[:MAX_RESULT_ROWS]]
        return QueryResult(
            columns=[str(c) for c in columns],
            rows=rows,
            truncated=len(fetched) > MAX_RESULT_ROWS,
            vm_steps=self._steps,
            elapsed_s=time.perf_counter() - start,
        )

    def _rollback_quietly(self) -> None:
        try:
            self._conn.rollback()
        except sqlalchemy.exc.SQLAlchemyError:
            pass

    def close(self) -> None:
        self._conn.close()
        self._engine.dispose()
        self._raw.close()


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and arg2 is not None and arg2.lower() in ALLOWED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _translate(exc: BaseException | None, elapsed: float, deadline: float) -> SQLError:
    message = str(exc) if exc is not None else "database error"
    lowered = message.lower()
    if "interrupted" in lowered:
        return SQLError("timeout", f"query exceeded the {deadline:g} s statement deadline and was stopped")
    if "authoriz" in lowered or "prohibited" in lowered:
        return SQLError(
            "denied",
            f"{message}: only read-only SELECT statements and common functions are allowed",
        )
    if "syntax error" in lowered or "incomplete input" in lowered or "unrecognized token" in lowered:
        return SQLError("syntax", message)
    if "no such" in lowered:
        return SQLError("unknown_name", message)
    if "too big" in lowered or "too many" in lowered or "too large" in lowered or "too deep" in lowered:
        return SQLError("too_large", message)
    if "one statement at a time" in lowered:
        return SQLError("bad_request", "send one SQL statement per call")
    return SQLError("error", message)


def _cap_value(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.hex()
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS] + "...[truncated]"
    return value


def format_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV text of a result, as saved in the workspace and read by the Python tool."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()
