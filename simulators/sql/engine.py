"""Read-only SQL on a per-episode SQLite copy.

A template database is built once per data set (keyed by a fingerprint) and kept as serialized
bytes; every episode gets its own copy through ``sqlite3.deserialize`` (~0.06 ms, a fresh build
costs ~28 ms). The agent's connection is read-only through an authorizer allow-list (``PRAGMA
query_only`` could be switched off by the agent), has a statement deadline enforced by a progress
handler backed by an interrupt from a watchdog thread, and SQLite length limits. Functions that burn
CPU without yielding to the progress handler (``printf('%.*c', 999999999, 'x')``) are not on the
allow-list; the quadratic string functions (``ltrim``/``rtrim``/``trim`` with a character set,
``instr``, ``replace``) are replaced by linear-time versions (:mod:`simulators.sql.functions`); the
rest cost at most O(length x pattern) per call, which the length limits keep far below the deadline.

Worst cases measured on a 2-core machine shared with other jobs (``python
benchmarks/bench_sql_limits.py``; deadline 2 s): before, one ``instr`` took 7.5-25 s, one ``ltrim``
10-23 s, and a scan of 1,000 rows with one ``GLOB`` each ran 122 s (it never reaches the progress
handler: fewer than ``PROGRESS_STEPS`` opcodes in all); after, the trims and ``instr`` take
milliseconds, the slowest call left (``GLOB '*[x][x]...'`` at the 100-character pattern limit on a
100 kB string) ~0.1-0.2 s, and the scan ends with a timeout at 2.0 s.

Each episode's copy is a bare ``sqlite3`` connection, with no SQLAlchemy engine on top: an engine
and its connection cost ~100 objects the cycle collector tracks, and reference cycles that outlive
``close`` until a full collection (measured: 102 tracked objects per open database, 71 per closed
one left for the collector; with 4,096 open episodes a full collection stopped a server for
hundreds of milliseconds). The bare connection is 1 tracked object plus its callbacks, and
:meth:`ReadOnlyDatabase.close` drops the callbacks, so closing frees everything at once. The
statement cache is kept small (``CACHED_STATEMENTS``) for the same reason: an agent seldom sends
one query twice, and each cached statement is tracked too.

Results are streamed row by row into their CSV text and cut at ``MAX_RESULT_BYTES`` (the CSV the
workspace gets) or ``MAX_RESULT_ROWS``, whichever comes first; a cell shows at most
``MAX_VALUE_CHARS`` characters and a result at most ``MAX_RESULT_COLUMNS`` columns, so a wide or
long query costs bounded memory (one row of at most 100 columns x 100 kB in flight).
"""

from __future__ import annotations

import collections
import csv
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulators.sql import functions
from simulators.sql.watchdog import watchdog

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
#: Prepared statements kept per episode connection (``sqlite3.connect(cached_statements=...)``).
CACHED_STATEMENTS = 4
#: SQLite VM steps between deadline checks: often enough to stop a runaway query within
#: milliseconds, rare enough not to slow a normal one (each check is a call into Python).
PROGRESS_STEPS = 10_000
MAX_RESULT_ROWS = 10_000
#: Bytes of CSV text (header included) one result may hold; rows past it are left out.
MAX_RESULT_BYTES = 1 << 20
MAX_RESULT_COLUMNS = 100
MAX_VALUE_CHARS = 10_000
#: Longest string or BLOB SQL may build (SQLITE_LIMIT_LENGTH), and longest LIKE/GLOB pattern:
#: a LIKE/GLOB call costs up to length x pattern steps in one C call.
MAX_STRING_BYTES = 100_000
MAX_PATTERN_CHARS = 100


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
    """Rows of one query and their CSV text.

    ``truncated`` when rows were left out; ``truncated_by`` says which limit cut them: ``"rows"``
    (``MAX_RESULT_ROWS``) or ``"bytes"`` (``MAX_RESULT_BYTES`` of CSV), None when nothing was.
    """

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    vm_steps: int = 0
    elapsed_s: float = 0.0
    csv_text: str = ""
    truncated_by: str | None = None


def build_database(tables: dict[str, dict[str, Any]]) -> bytes:
    """Build a SQLite database from ``{name: {"columns": [[name, type], ...], "rows": [[...]], ...}}``.

    A table may also declare ``"primary_key": [column, ...]`` and ``"indexes": [[column, ...], ...]``
    (part of the schema, so a real database built from the same tables gets them too). An
    ``INTEGER`` primary key of one column is SQLite's rowid: point lookups on it are one B-tree
    search, and scans still return rows in key order. Returns the serialized database, ready to
    be copied per episode.
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
            cols = _columns(name, table["columns"])
            primary_key, indexes = table_keys(name, table)
            ddl = ", ".join(f'"{c}" {t}' for c, t in cols)
            if primary_key:
                ddl += ", PRIMARY KEY (" + ", ".join(f'"{c}"' for c in primary_key) + ")"
            conn.execute(f'CREATE TABLE "{name}" ({ddl})')
            marks = ", ".join("?" for _ in cols)
            rows = table.get("rows", [])
            _check_rows(name, cols, rows)
            conn.executemany(f'INSERT INTO "{name}" VALUES ({marks})', rows)
            for i, columns in enumerate(indexes):
                conn.execute(f'CREATE INDEX "{name}_ix{i}" ON "{name}" (' + ", ".join(f'"{c}"' for c in columns) + ")")
        conn.commit()
        return conn.serialize()
    except sqlite3.IntegrityError as exc:
        raise ValueError(f"could not build the database: {exc} (primary key values must be unique and not NULL)") from None
    except (sqlite3.Error, TypeError, OverflowError) as exc:
        raise ValueError(f"could not build the database: {exc}") from None
    finally:
        conn.close()


#: Most indexes one table may declare, and most columns in one key.
MAX_INDEXES = 16
MAX_KEY_COLUMNS = 8


def table_keys(name: str, table: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """A table's declared ``primary_key`` and ``indexes``, checked against its columns.

    Raises:
        ValueError: a key names a column the table does not have, or is not a list of names.
    """
    names = {c for c, _ in table["columns"]}

    def key(value: Any, what: str) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_KEY_COLUMNS:
            raise ValueError(f"table {name!r}: {what} must be a list of 1-{MAX_KEY_COLUMNS} column names, got {str(value)[:80]}")
        for column in value:
            if not isinstance(column, str) or column not in names:
                raise ValueError(
                    f"table {name!r}: {what} names {str(column)[:64]!r}, which is not a column; columns: {sorted(names)}"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"table {name!r}: {what} names a column twice")
        return tuple(value)

    raw_pk = table.get("primary_key")
    primary_key = key(raw_pk, "primary_key") if raw_pk is not None else ()
    raw_ix = table.get("indexes") or ()
    if not isinstance(raw_ix, (list, tuple)) or len(raw_ix) > MAX_INDEXES:
        raise ValueError(f"table {name!r}: indexes must be a list of at most {MAX_INDEXES} column lists")
    return primary_key, tuple(key(ix, f"index {i}") for i, ix in enumerate(raw_ix))


def _columns(table: str, cols: Any) -> list[tuple[str, str]]:
    """A table's ``columns`` as (name, type) pairs, or a ValueError naming the table and the entry."""
    if not isinstance(cols, (list, tuple)):
        raise ValueError(f'table {table!r}: columns must be a list of [name, type] pairs such as ["id", "INTEGER"]')
    pairs = []
    for i, col in enumerate(cols):
        if not isinstance(col, (list, tuple)) or len(col) != 2:
            raise ValueError(
                f'table {table!r}: columns[{i}] must be a [name, type] pair such as ["id", "INTEGER"], got {str(col)[:80]}'
            )
        col_name, col_type = col
        _check_identifier(col_name)
        if col_type not in ("INTEGER", "REAL", "TEXT"):
            raise ValueError(f"column {table}.{col_name}: unsupported type {str(col_type)[:40]!r}; use INTEGER, REAL or TEXT")
        pairs.append((col_name, col_type))
    return pairs


#: What SQLite's INTEGER holds: a signed 64-bit integer.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _check_rows(table: str, cols: list[tuple[str, str]], rows: Any) -> None:
    """Refuse rows SQLite would refuse or store wrongly, naming the table, row and column: not a list
    of lists with one value per column, a value that is not null, a number or a string, an integer
    past 64 bits, or a string longer than episode connections can read (``MAX_STRING_BYTES``)."""
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"table {table!r}: rows must be a list of rows (lists of values), got {type(rows).__name__}")
    width = len(cols)
    for r, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != width:
            got = f"{len(row)} values" if isinstance(row, (list, tuple)) else type(row).__name__
            raise ValueError(f"table {table!r}: rows[{r}] must be a list of {width} values, one per column; got {got}")
        for c, value in enumerate(row):
            if value is None or isinstance(value, float):
                continue
            if isinstance(value, int):
                if not INT64_MIN <= value <= INT64_MAX:
                    raise ValueError(
                        f"table {table!r}: rows[{r}] column {cols[c][0]!r}: an integer of {value.bit_length()} bits does "
                        "not fit SQLite's 64-bit INTEGER; store it as TEXT or REAL"
                    )
            elif isinstance(value, str):
                if len(value) * 4 > MAX_STRING_BYTES and len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
                    raise ValueError(
                        f"table {table!r}: a value is longer than {MAX_STRING_BYTES:,} bytes, the longest a query can read"
                    )
            else:
                raise ValueError(
                    f"table {table!r}: rows[{r}] column {cols[c][0]!r}: a {type(value).__name__} is not a value; "
                    "use null, a number or a string"
                )


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

    def put(self, fingerprint: str, tables: dict[str, dict[str, Any]], digest: str | None = None) -> None:
        """Store ``tables`` under ``fingerprint``. With ``digest`` (the SHA-256 of their canonical JSON,
        checked by the caller) an image another cache of the process built is reused, not rebuilt."""
        data = _built(digest, tables)
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


#: Serialized images by content digest, shared by every simulator of the process (images are
#: immutable bytes; each episode deserializes its own copy): N envs build a template once, not N times.
_IMAGES: collections.OrderedDict[str, bytes] = collections.OrderedDict()
_IMAGES_LOCK = threading.Lock()
_MAX_SHARED_IMAGES = 64


def _built(digest: str | None, tables: dict[str, dict[str, Any]]) -> bytes:
    if digest is None:
        return build_database(tables)
    with _IMAGES_LOCK:
        data = _IMAGES.get(digest)
        if data is not None:
            _IMAGES.move_to_end(digest)
            return data
    data = build_database(tables)
    with _IMAGES_LOCK:
        _IMAGES[digest] = data
        while len(_IMAGES) > _MAX_SHARED_IMAGES:
            _IMAGES.popitem(last=False)
    return data


@dataclass(slots=True, weakref_slot=True)
class ReadOnlyDatabase:
    """One episode's private, read-only copy of a template database.

    Args:
        image: serialized template (from :func:`build_database`).
        deadline_s: wall-clock budget of one statement.
    """

    image: bytes
    deadline_s: float = 2.0
    _raw: sqlite3.Connection = field(init=False, repr=False)
    _deadline: float = field(init=False, default=0.0, repr=False)
    _steps: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        raw = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None, cached_statements=CACHED_STATEMENTS)
        raw.deserialize(self.image)
        raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_STRING_BYTES)
        raw.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_RESULT_COLUMNS)
        raw.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS * 4)
        raw.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 200)
        raw.setlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 50)
        raw.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        raw.setlimit(sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 16)
        raw.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_PATTERN_CHARS)
        # TEXT cells arrive already cut to what a result can show (a 100 kB value is not copied
        # whole into Python), and invalid UTF-8 shows as U+FFFD instead of failing the query.
        raw.text_factory = _decode_text
        functions.register(raw, MAX_STRING_BYTES)
        raw.set_authorizer(_authorize)
        raw.set_progress_handler(self._progress, PROGRESS_STEPS)
        self._raw = raw

    def _progress(self) -> int:
        self._steps += PROGRESS_STEPS
        return 1 if time.perf_counter() > self._deadline else 0

    def query(self, sql: str) -> QueryResult:
        """Run one read-only statement; keep at most ``MAX_RESULT_ROWS`` rows and ``MAX_RESULT_BYTES`` of CSV.

        The statement goes straight to the ``sqlite3`` connection: SQLAlchemy's ``exec_driver_sql``
        added ~0.1 ms per call and an engine per episode (~0.3 ms) for nothing this class used
        (``benchmarks/bench_env.py`` section 1).
        """
        if not isinstance(sql, str):
            raise SQLError("bad_request", "query must be a string")
        if not sql.strip():
            raise SQLError("bad_request", "query is empty")
        if len(sql) > MAX_QUERY_CHARS:
            raise SQLError("too_large", f"query is {len(sql)} characters; the limit is {MAX_QUERY_CHARS}")
        if "\x00" in sql:
            raise SQLError("bad_request", "query contains a NUL character")
        self._steps = 0
        functions.take_refusal()  # none left over from a statement before
        start = time.perf_counter()
        self._deadline = start + self.deadline_s
        token = watchdog.arm(self._raw, self._deadline)
        cursor = self._raw.cursor()
        try:
            cursor.execute(sql)
            if cursor.description is not None:
                columns = [str(c[0]) for c in cursor.description]
                rows, csv_text, truncated_by = collect_rows(columns, cursor)
            else:
                columns, rows, csv_text, truncated_by = [], [], "", None
        except sqlite3.Warning:  # "You can only execute one statement at a time."
            raise SQLError("bad_request", "send one SQL statement per call") from None
        except sqlite3.Error as exc:
            refusal = functions.take_refusal()
            if refusal is not None:
                raise SQLError("too_large", refusal) from None
            raise _translate(exc, time.perf_counter() - start, self.deadline_s) from None
        except (OverflowError, ValueError, MemoryError, RecursionError) as exc:
            raise SQLError("error", f"{type(exc).__name__}: {exc}") from None
        finally:
            cursor.close()
            watchdog.disarm(token)
            self._rollback_quietly()  # the authorizer refuses BEGIN; this is belt and braces
        return QueryResult(
            columns=columns,
            rows=rows,
            truncated=truncated_by is not None,
            vm_steps=self._steps,
            elapsed_s=time.perf_counter() - start,
            csv_text=csv_text,
            truncated_by=truncated_by,
        )

    def _rollback_quietly(self) -> None:
        try:
            if self._raw.in_transaction:
                self._raw.rollback()
        except sqlite3.Error:
            pass

    def close(self) -> None:
        """Close the copy and drop its callbacks (they point back here: no cycle outlives it)."""
        raw = self._raw
        try:
            raw.set_progress_handler(None, 0)
            raw.set_authorizer(None)
        except sqlite3.Error:
            pass
        raw.close()


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
    if "too many columns" in lowered:
        return SQLError("too_large", f"{message}: a result may have at most {MAX_RESULT_COLUMNS} columns")
    if "string or blob too big" in lowered:
        return SQLError("too_large", f"{message}: strings and BLOBs are limited to {MAX_STRING_BYTES:,} bytes")
    if "pattern too complex" in lowered:
        return SQLError("too_large", f"{message}: LIKE and GLOB patterns are limited to {MAX_PATTERN_CHARS} characters")
    if "too big" in lowered or "too many" in lowered or "too large" in lowered or "too deep" in lowered:
        return SQLError("too_large", message)
    if "one statement at a time" in lowered:
        return SQLError("bad_request", "send one SQL statement per call")
    return SQLError("error", message)


def _decode_text(data: bytes) -> str:
    """The connection's text factory: UTF-8 (bad bytes as U+FFFD), cut past what a cell can show."""
    if len(data) > 4 * MAX_VALUE_CHARS + 4:
        # 4 bytes per character at most: the prefix still holds more than MAX_VALUE_CHARS
        # characters, so _cap_value marks it truncated.
        data = data[: 4 * MAX_VALUE_CHARS + 4]
    return data.decode("utf-8", "replace")


def _cap_value(value: Any) -> Any:
    # Exact class checks: this runs for every cell, and sqlite3 gives only int, float, str, bytes, None.
    if value.__class__ is str:
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "...[truncated]"
    if value.__class__ is bytes:
        if 2 * len(value) > MAX_VALUE_CHARS:
            return value[: MAX_VALUE_CHARS // 2].hex() + "...[truncated]"
        return value.hex()
    return value


class _Budget:
    """The file a ``csv.writer`` writes to: keeps lines while they fit in ``limit`` UTF-8 bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[str] = []
        self.full = False

    def write(self, line: str) -> int:
        size = len(line) if line.isascii() else len(line.encode("utf-8", "surrogatepass"))
        if self.size + size > self.limit:
            self.full = True
            return 0
        self.parts.append(line)
        self.size += size
        return len(line)


def collect_rows(
    columns: Sequence[str], cursor: Iterable[Sequence[Any]], max_bytes: int = MAX_RESULT_BYTES
) -> tuple[list[tuple[Any, ...]], str, str | None]:
    """Stream rows from a DBAPI cursor into capped cells and their CSV text.

    Rows are read one at a time and kept while the CSV (header included) stays within
    ``max_bytes`` and there are at most ``MAX_RESULT_ROWS`` of them. Returns the rows, the CSV text
    (exactly :func:`format_rows` of those rows) and which limit cut the result (``"rows"``,
    ``"bytes"`` or None).
    """
    budget = _Budget(1 << 62)
    writer = csv.writer(budget, lineterminator="\n")
    writer.writerow(columns)  # the header always goes in (the SQL length limit keeps it small)
    budget.limit = max_bytes
    rows: list[tuple[Any, ...]] = []
    truncated_by: str | None = None
    writerow, append = writer.writerow, rows.append
    for raw in cursor:
        if len(rows) == MAX_RESULT_ROWS:
            truncated_by = "rows"
            break
        row = tuple(map(_cap_value, raw))
        writerow(row)
        if budget.full:
            truncated_by = "bytes"
            break
        append(row)
    return rows, "".join(budget.parts), truncated_by


def format_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV text of a result, as saved in the workspace and read by the Python tool."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()
