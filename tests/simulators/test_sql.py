"""The simulated SQL service: template images, read-only episode copies, limits and error kinds."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators.sql import MAX_RESULT_ROWS, ReadOnlyDatabase, SQLError, TemplateCache, build_database, format_rows
from simulators.sql.engine import (
    MAX_PATTERN_CHARS,
    MAX_QUERY_CHARS,
    MAX_RESULT_BYTES,
    MAX_RESULT_COLUMNS,
    MAX_STRING_BYTES,
    MAX_VALUE_CHARS,
)
from simulators.sql.watchdog import watchdog

TABLES: dict[str, dict[str, Any]] = {
    "customers": {
        "columns": [["id", "INTEGER"], ["name", "TEXT"], ["region", "TEXT"]],
        "rows": [[1, "Alice Smith", "north"], [2, "Bob Jones", "south"], [3, "Chloé Martin", "north"]],
    },
    "orders": {
        "columns": [["id", "INTEGER"], ["customer_id", "INTEGER"], ["amount", "REAL"], ["note", "TEXT"]],
        "rows": [
            [10, 1, 120.5, "first"],
            [11, 1, 30.0, None],
            [12, 2, 99.99, 'quote " and, comma'],
            [13, 3, 1000.0, "line\nbreak"],
        ],
    },
}

RUNAWAY_CTE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture(scope="module")
def image() -> bytes:
    return build_database(TABLES)


@pytest.fixture
def db(image: bytes):
    database = ReadOnlyDatabase(image, deadline_s=0.3)
    yield database
    database.close()


def _error(db: ReadOnlyDatabase, sql: Any) -> SQLError:
    with pytest.raises(SQLError) as info:
        db.query(sql)
    return info.value


# -- correct results ----------------------------------------------------------------------------


def test_select_returns_columns_and_rows(db: ReadOnlyDatabase) -> None:
    result = db.query("SELECT id, name FROM customers ORDER BY id")
    assert result.columns == ["id", "name"]
    assert result.rows == [(1, "Alice Smith"), (2, "Bob Jones"), (3, "Chloé Martin")]
    assert result.truncated is False
    assert result.elapsed_s >= 0


def test_join_aggregate_and_null(db: ReadOnlyDatabase) -> None:
    result = db.query(
        "SELECT c.name, round(sum(o.amount), 2) AS total, count(o.note) AS notes "
        "FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.id ORDER BY total DESC"
    )
    assert result.columns == ["name", "total", "notes"]
    assert result.rows == [("Chloé Martin", 1000.0, 1), ("Alice Smith", 150.5, 1), ("Bob Jones", 99.99, 1)]
    assert db.query("SELECT note FROM orders WHERE id = 11").rows == [(None,)]


def test_types_round_trip(db: ReadOnlyDatabase) -> None:
    row = db.query("SELECT id, amount, note FROM orders WHERE id = 12").rows[0]
    assert row == (12, 99.99, 'quote " and, comma')
    assert isinstance(row[0], int) and isinstance(row[1], float)


def test_allowed_functions_and_window_functions(db: ReadOnlyDatabase) -> None:
    result = db.query(
        "SELECT upper(name), length(name), rank() OVER (ORDER BY id DESC) FROM customers WHERE region = 'north' ORDER BY id"
    )
    # SQLite's upper() folds ASCII only.
    assert result.rows == [("ALICE SMITH", 11, 2), ("CHLOé MARTIN", 12, 1)]


def test_blobs_are_returned_as_hex(db: ReadOnlyDatabase) -> None:
    assert db.query("SELECT x'00ff'").rows == [("00ff",)]


def test_long_values_are_capped(db: ReadOnlyDatabase) -> None:
    n = MAX_VALUE_CHARS + 500
    value = db.query(f"SELECT x'{'ab' * (n // 2)}'").rows[0][0]
    assert value.endswith("...[truncated]")
    assert len(value) == MAX_VALUE_CHARS + len("...[truncated]")


def test_trailing_semicolon_and_comment_are_one_statement(db: ReadOnlyDatabase) -> None:
    assert db.query("SELECT 1;").rows == [(1,)]
    assert db.query("SELECT 1; -- done").rows == [(1,)]


def test_schema_is_readable(db: ReadOnlyDatabase) -> None:
    names = {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type = 'table'").rows}
    assert names == {"customers", "orders"}


# -- refused statements --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO customers VALUES (4, 'Eve', 'east')",
        "UPDATE orders SET amount = 0",
        "DELETE FROM orders",
        "REPLACE INTO customers VALUES (1, 'x', 'y')",
        "CREATE TABLE evil (a TEXT)",
        "CREATE TEMP TABLE evil (a TEXT)",
        "CREATE INDEX idx ON customers (name)",
        "CREATE VIEW v AS SELECT 1",
        "DROP TABLE customers",
        "ALTER TABLE customers ADD COLUMN x TEXT",
        "PRAGMA query_only = 0",
        "PRAGMA table_info(customers)",
        "SELECT * FROM pragma_table_info('customers')",
        "ATTACH DATABASE ':memory:' AS other",
        "ATTACH DATABASE '/tmp/agentrl-attack.db' AS other",
        "DETACH DATABASE main",
        "SELECT load_extension('/tmp/evil.so')",
        "SELECT printf('%.*c', 999999999, 'x')",
        "SELECT format('%d', 1)",
        "SELECT randomblob(1000000)",
        "SELECT zeroblob(1000000)",
        "SELECT hex(zeroblob(10))",
        "SELECT sqlite_version()",
        "BEGIN",
        "SAVEPOINT s",
        "VACUUM",
        "ANALYZE",
    ],
)
def test_writes_ddl_and_dangerous_functions_are_denied(db: ReadOnlyDatabase, sql: str) -> None:
    err = _error(db, sql)
    assert err.kind == "denied", (sql, err.kind, err.message)


def test_denied_statements_leave_the_data_unchanged(db: ReadOnlyDatabase) -> None:
    for sql in ("DELETE FROM orders", "DROP TABLE orders", "UPDATE orders SET amount = 0"):
        _error(db, sql)
    assert db.query("SELECT count(*), round(sum(amount), 2) FROM orders").rows == [(4, 1250.49)]


@pytest.mark.parametrize("sql", ["SELEC 1", "SELECT * FROM", "SELECT (1", "SELECT 1 +", "SELECT FROM customers WHERE"])
def test_syntax_errors(db: ReadOnlyDatabase, sql: str) -> None:
    assert _error(db, sql).kind == "syntax"


@pytest.mark.parametrize("sql", ["SELECT 'unterminated", 'SELECT "unterminated', "SELECT [x"])
def test_unrecognized_token_is_a_syntax_error(db: ReadOnlyDatabase, sql: str) -> None:
    assert _error(db, sql).kind == "syntax"


@pytest.mark.parametrize("sql", ["SELECT * FROM nope", "SELECT nope FROM customers", "SELECT c.nope FROM customers c"])
def test_unknown_names(db: ReadOnlyDatabase, sql: str) -> None:
    err = _error(db, sql)
    assert err.kind == "unknown_name"
    assert "nope" in err.message


@pytest.mark.parametrize("sql", ["SELECT 1; SELECT 2", "SELECT 1; DROP TABLE customers"])
def test_multiple_statements_are_a_bad_request(db: ReadOnlyDatabase, sql: str) -> None:
    assert _error(db, sql).kind == "bad_request"
    assert db.query("SELECT count(*) FROM customers").rows == [(3,)]


@pytest.mark.parametrize("sql", ["", "   ", "\n\t"])
def test_empty_query(db: ReadOnlyDatabase, sql: str) -> None:
    assert _error(db, sql).kind == "bad_request"


def test_nul_in_query(db: ReadOnlyDatabase) -> None:
    assert _error(db, "SELECT 1\x00; DROP TABLE customers").kind == "bad_request"


@pytest.mark.parametrize("sql", [None, b"SELECT 1", 1, ["SELECT 1"], {"query": "SELECT 1"}])
def test_non_str_query(db: ReadOnlyDatabase, sql: Any) -> None:
    assert _error(db, sql).kind == "bad_request"


def test_query_length_limit(db: ReadOnlyDatabase) -> None:
    at_limit = "SELECT 1" + " " * (MAX_QUERY_CHARS - len("SELECT 1"))
    assert len(at_limit) == MAX_QUERY_CHARS
    assert db.query(at_limit).rows == [(1,)]
    err = _error(db, at_limit + " ")
    assert err.kind == "too_large"
    assert str(MAX_QUERY_CHARS) in err.message


def test_huge_query_is_refused_quickly(db: ReadOnlyDatabase) -> None:
    huge = "SELECT '" + "x" * (1 << 20) + "'"
    start = time.perf_counter()
    assert _error(db, huge).kind == "too_large"
    assert time.perf_counter() - start < 5.0  # refused before SQLite sees it: no parse of 1 MiB


def test_errors_stringify_to_their_message(db: ReadOnlyDatabase) -> None:
    err = _error(db, "SELECT * FROM nope")
    assert str(err) == err.message
    assert err.args[0] == "unknown_name"


# -- deadline --------------------------------------------------------------------------------------


def test_runaway_recursive_cte_times_out_near_the_deadline(db: ReadOnlyDatabase) -> None:
    start = time.perf_counter()
    err = _error(db, RUNAWAY_CTE)
    elapsed = time.perf_counter() - start
    assert err.kind == "timeout"
    assert "0.3" in err.message
    assert 0.3 <= elapsed < 5.0  # stopped by the deadline, not by running to completion
    # The connection is usable again and the next statement gets a fresh deadline.
    assert db.query("SELECT count(*) FROM customers").rows == [(3,)]
    assert _error(db, RUNAWAY_CTE).kind == "timeout"


def test_bounded_recursive_cte_runs_and_counts_steps(db: ReadOnlyDatabase) -> None:
    result = db.query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000) SELECT sum(x) FROM c")
    assert result.rows == [(5000 * 5001 // 2,)]
    assert result.vm_steps > 0


# -- row cap ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_image() -> bytes:
    n = MAX_RESULT_ROWS + 25
    return build_database({"big": {"columns": [["n", "INTEGER"], ["label", "TEXT"]], "rows": [[i, f"r{i}"] for i in range(n)]}})


def test_row_cap_truncates(big_image: bytes) -> None:
    db = ReadOnlyDatabase(big_image)
    try:
        assert db.query("SELECT count(*) FROM big").rows == [(MAX_RESULT_ROWS + 25,)]
        result = db.query("SELECT n, label FROM big ORDER BY n")
        assert result.truncated is True
        assert len(result.rows) == MAX_RESULT_ROWS
        assert result.rows[0] == (0, "r0")
        assert result.rows[-1] == (MAX_RESULT_ROWS - 1, f"r{MAX_RESULT_ROWS - 1}")
        exact = db.query(f"SELECT n FROM big ORDER BY n LIMIT {MAX_RESULT_ROWS}")
        assert exact.truncated is False
        assert len(exact.rows) == MAX_RESULT_ROWS
    finally:
        db.close()


# -- isolation -------------------------------------------------------------------------------------


def test_episodes_are_isolated(image: bytes) -> None:
    first, second = ReadOnlyDatabase(image), ReadOnlyDatabase(image)
    try:
        # Change the first copy behind the authorizer's back: the second copy and new copies of the
        # same image must not see it.
        raw: sqlite3.Connection = first._raw
        raw.set_authorizer(None)
        raw.execute("DELETE FROM orders")
        raw.execute("INSERT INTO customers VALUES (99, 'Mallory', 'west')")
        assert first.query("SELECT count(*) FROM orders").rows == [(0,)]
        assert second.query("SELECT count(*) FROM orders").rows == [(4,)]
        assert second.query("SELECT count(*) FROM customers WHERE id = 99").rows == [(0,)]
        third = ReadOnlyDatabase(image)
        try:
            assert third.query("SELECT count(*) FROM orders").rows == [(4,)]
        finally:
            third.close()
    finally:
        first.close()
    # Closing one copy leaves the other working.
    try:
        assert second.query("SELECT count(*) FROM customers").rows == [(3,)]
    finally:
        second.close()


def test_timeout_in_one_copy_does_not_affect_another(image: bytes) -> None:
    slow, other = ReadOnlyDatabase(image, deadline_s=0.2), ReadOnlyDatabase(image, deadline_s=5.0)
    try:
        assert _error(slow, RUNAWAY_CTE).kind == "timeout"
        assert other.query("SELECT count(*) FROM orders").rows == [(4,)]
    finally:
        slow.close()
        other.close()


# -- build_database --------------------------------------------------------------------------------


def test_build_database_returns_a_reusable_image(image: bytes) -> None:
    assert isinstance(image, bytes) and image[:16] == b"SQLite format 3\x00"
    assert build_database(TABLES) == image  # deterministic


@pytest.mark.parametrize(
    "name",
    ["1x", "a b", 'x"; DROP TABLE t; --', "", "a-b", "a.b", "x" * 65, "t\x00", "tab\n", 5, None],
)
def test_build_database_refuses_invalid_table_names(name: Any) -> None:
    with pytest.raises(ValueError):
        build_database({name: {"columns": [["a", "TEXT"]], "rows": []}})


@pytest.mark.parametrize("name", ["1x", 'a" TEXT, "b', "", "x" * 65, "a b", 3])
def test_build_database_refuses_invalid_column_names(name: Any) -> None:
    with pytest.raises(ValueError):
        build_database({"t": {"columns": [[name, "TEXT"]], "rows": []}})


@pytest.mark.parametrize("col_type", ["BLOB", "text", "INTEGER PRIMARY KEY", "TEXT); DROP TABLE t; --", None])
def test_build_database_refuses_unsupported_types(col_type: Any) -> None:
    with pytest.raises(ValueError):
        build_database({"t": {"columns": [["a", col_type]], "rows": []}})


def test_build_database_accepts_identifiers_and_keywords() -> None:
    image = build_database({"select": {"columns": [["from", "TEXT"], ["x" * 64, "INTEGER"]], "rows": [["a", 1]]}})
    db = ReadOnlyDatabase(image)
    try:
        assert db.query('SELECT "from", ' + "x" * 64 + ' FROM "select"').rows == [("a", 1)]
    finally:
        db.close()


@pytest.mark.parametrize(
    "tables",
    [
        {"sqlite_x": {"columns": [["a", "TEXT"]], "rows": []}},
        {"T": {"columns": [["a", "TEXT"]], "rows": []}, "t": {"columns": [["a", "TEXT"]], "rows": []}},
        {"t": {"columns": [["a", "TEXT"], ["A", "TEXT"]], "rows": []}},
        {"t": {"columns": [], "rows": []}},
        {"t": {"columns": [["a", "TEXT"]], "rows": [[1, 2]]}},
        {"t": {"columns": [["a", "TEXT"]], "rows": [[[1]]]}},
        {},
    ],
    ids=["reserved-name", "duplicate-table", "duplicate-column", "no-columns", "row-arity", "nested-value", "no-tables"],
)
def test_build_database_reports_bad_definitions_as_value_error(tables: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        build_database(tables)


# -- TemplateCache ---------------------------------------------------------------------------------


def _one_table(value: int) -> dict[str, Any]:
    return {"t": {"columns": [["v", "INTEGER"]], "rows": [[value]]}}


def test_template_cache_get_and_contains() -> None:
    cache = TemplateCache(max_templates=4)
    assert cache.get("a") is None and "a" not in cache
    cache.put("a", _one_table(1))
    assert "a" in cache
    data = cache.get("a")
    assert data is not None
    db = ReadOnlyDatabase(data)
    try:
        assert db.query("SELECT v FROM t").rows == [(1,)]
    finally:
        db.close()


def test_template_cache_evicts_least_recently_used() -> None:
    cache = TemplateCache(max_templates=2)
    cache.put("a", _one_table(1))
    cache.put("b", _one_table(2))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("c", _one_table(3))
    assert "b" not in cache
    assert "a" in cache and "c" in cache
    cache.put("a", _one_table(10))  # re-putting refreshes and replaces
    cache.put("d", _one_table(4))
    assert "c" not in cache
    assert "a" in cache and "d" in cache
    data = cache.get("a")
    assert data is not None
    db = ReadOnlyDatabase(data)
    try:
        assert db.query("SELECT v FROM t").rows == [(10,)]
    finally:
        db.close()


def test_template_cache_put_refuses_bad_tables_and_keeps_old_entries() -> None:
    cache = TemplateCache(max_templates=2)
    cache.put("a", _one_table(1))
    with pytest.raises(ValueError):
        cache.put("bad", {"1x": {"columns": [["v", "INTEGER"]], "rows": []}})
    assert "bad" not in cache and "a" in cache


# -- format_rows -----------------------------------------------------------------------------------


def test_format_rows_is_csv(db: ReadOnlyDatabase) -> None:
    result = db.query("SELECT id, amount, note FROM orders ORDER BY id")
    text = format_rows(result.columns, result.rows)
    assert text == ('id,amount,note\n10,120.5,first\n11,30.0,\n12,99.99,"quote "" and, comma"\n13,1000.0,"line\nbreak"\n')
    assert format_rows(["a"], []) == "a\n"


# -- quadratic string functions: same results as SQLite's, linear cost -----------------------------

_PLAIN = sqlite3.connect(":memory:")
_VALUES: list[Any] = [
    None,
    "",
    "abc",
    "aabbcc",
    "  pad  ",
    "xyx",
    "é-ü-é",
    "日本語日本",
    "a\x00b",
    0,
    12300,
    -5,
    1.0,
    0.1,
    1e20,
    2.5e-7,
]
_VALUES += [b"", b"ab", b"\xc3\xa9a"]


def _same(sql: str, *args: Any) -> None:
    db = ReadOnlyDatabase(build_database(TABLES))
    try:
        params = ", ".join(_literal(a) for a in args)
        expected = _PLAIN.execute(f"SELECT {sql.format(params)}, typeof({sql.format(params)})").fetchone()
        got = db.query(f"SELECT {sql.format(params)}, typeof({sql.format(params)})").rows[0]
        if isinstance(expected[0], bytes):
            expected = (expected[0].hex(), expected[1])
        assert got == expected, (sql, args)
    finally:
        db.close()


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"x'{value.hex()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''").replace("\x00", "' || char(0) || '") + "'"
    return repr(value)


@pytest.mark.parametrize("fn", ["ltrim", "rtrim", "trim"])
@pytest.mark.parametrize("chars", [None, "", "a", "ab", "x", " ", "é", "日", 0, 1.0, b"a"])
def test_trim_family_matches_sqlite(fn: str, chars: Any) -> None:
    for value in _VALUES:
        if value == "a\x00b":
            continue  # SQLite's text functions stop at NUL; the agent cannot send one anyway
        _same(f"{fn}({{}})", value, chars)


@pytest.mark.parametrize("needle", [None, "", "a", "b", "bc", "é", "本", 0, 3, 0.1, b"b", b""])
def test_instr_matches_sqlite(needle: Any) -> None:
    for value in _VALUES:
        if value == "a\x00b":
            continue
        _same("instr({})", value, needle)


@pytest.mark.parametrize("pattern", [None, "", "a", "ab", "x", "é", "0", 0, 1.0, b"a"])
@pytest.mark.parametrize("replacement", [None, "", "Z", "éé", 7])
def test_replace_matches_sqlite(pattern: Any, replacement: Any) -> None:
    for value in _VALUES:
        if value == "a\x00b":
            continue
        _same("replace({})", value, pattern, replacement)


@settings(max_examples=150, deadline=None)
@given(
    st.text(alphabet="ab é日\t", max_size=12),
    st.text(alphabet="ab é日", max_size=4),
    st.text(alphabet="xé", max_size=3),
)
def test_string_functions_match_sqlite_on_random_text(value: str, other: str, third: str) -> None:
    for fn in ("ltrim({})", "rtrim({})", "trim({})", "instr({})"):
        _same(fn, value, other)
    _same("replace({})", value, other, third)


def _repeat_sql(n: int) -> str:
    """SQL for an ``n``-character string of x, built cheaply inside SQLite."""
    expr, size = "'x'", 1
    while size * 10 <= n:
        expr, size = f"replace({expr}, 'x', 'xxxxxxxxxx')", size * 10
    return f"substr({' || '.join([expr] * -(-n // size))}, 1, {n})"


HALF = MAX_STRING_BYTES // 2
LONG = _repeat_sql(MAX_STRING_BYTES)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # Built in, each of these is ~10^10 comparisons in one C call (minutes); here, linear.
        (f"SELECT length(ltrim(substr({LONG}, 1, {HALF}), replace(substr({LONG}, 1, {HALF - 1}), 'x', 'y') || 'x'))", 0),
        (f"SELECT length(rtrim(substr({LONG}, 1, {HALF}), replace(substr({LONG}, 1, {HALF - 1}), 'x', 'y') || 'x'))", 0),
        (f"SELECT length(trim(substr({LONG}, 1, {HALF}), replace(substr({LONG}, 1, {HALF - 1}), 'x', 'y') || 'x'))", 0),
        (f"SELECT instr({LONG}, substr({LONG}, 1, {HALF - 1}) || 'y')", 0),
        (f"SELECT length(replace({LONG}, substr({LONG}, 1, {HALF - 1}) || 'y', ''))", MAX_STRING_BYTES),
        (f"SELECT instr(substr({LONG}, 1, {MAX_STRING_BYTES - 1}) || 'y', substr({LONG}, 1, {HALF}) || 'y')", HALF),
    ],
    ids=["ltrim", "rtrim", "trim", "instr-miss", "replace-miss", "instr-hit"],
)
def test_worst_case_string_functions_finish_with_the_right_answer(image: bytes, sql: str, expected: int) -> None:
    db = ReadOnlyDatabase(image, deadline_s=5.0)
    try:
        assert db.query(sql).rows == [(expected,)]
    finally:
        db.close()


@pytest.fixture(scope="module")
def rows_image() -> bytes:
    return build_database({"t": {"columns": [["n", "INTEGER"]], "rows": [[i] for i in range(1000)]}})


@pytest.mark.parametrize(
    "cond",
    [
        "(s || n) GLOB '*' || replace(substr(s, 1, 32), 'x', '[x]') || 'y'",
        "(s || n) LIKE '%' || substr(s, 1, 97) || 'y%'",
        "instr(s || n, substr(s, 1, 50000) || 'y') > 0",
        "substr(s || n, 99990 - n % 7, 1) = 'y'",
        "length(rtrim(s || n, '0123456789')) < 0",
    ],
    ids=["glob", "like", "instr", "substr", "rtrim"],
)
def test_scans_of_expensive_calls_stop_at_the_deadline(rows_image: bytes, cond: str) -> None:
    # 1,000 rows are fewer VM steps than one progress-handler period, and each row costs up to
    # 0.2 s in one C call (GLOB): only the watchdog's interrupt stops the scan. Without it the
    # GLOB scan ran 122 s; the per-test timeout would fail this test.
    db = ReadOnlyDatabase(rows_image, deadline_s=0.3)
    try:
        sql = f"WITH b(s) AS (SELECT {_repeat_sql(MAX_STRING_BYTES - 12)}) SELECT count(*) FROM t, b WHERE {cond}"
        for _ in range(2):
            try:
                assert db.query(sql).rows == [(0,)]
            except SQLError as exc:
                assert exc.kind == "timeout", exc.message
        assert db.query("SELECT count(*) FROM t").rows == [(1000,)]
    finally:
        db.close()


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        (f"SELECT length({LONG} || 'y')", f"{MAX_STRING_BYTES:,} bytes"),
        (f"SELECT length(replace({LONG}, 'x', 'xy'))", "replace()"),
        (f"SELECT length(replace(substr({LONG}, 1, 1000), 'x', {LONG}))", "replace()"),
        (f"SELECT length(hex({LONG}))", f"{MAX_STRING_BYTES:,} bytes"),
        (f"SELECT length(group_concat(s)) FROM (SELECT {LONG} AS s UNION ALL SELECT 'y')", f"{MAX_STRING_BYTES:,} bytes"),
        (f"SELECT 'x' LIKE '%' || substr({LONG}, 1, {MAX_PATTERN_CHARS})", f"{MAX_PATTERN_CHARS} characters"),
        (f"SELECT 'x' GLOB substr({LONG}, 1, {MAX_PATTERN_CHARS + 1})", f"{MAX_PATTERN_CHARS} characters"),
        ("SELECT " + ", ".join(f"{i}" for i in range(MAX_RESULT_COLUMNS + 1)), f"{MAX_RESULT_COLUMNS} columns"),
    ],
    ids=["concat", "replace-grow", "replace-huge", "hex", "group_concat", "like-pattern", "glob-pattern", "columns"],
)
def test_limits_refuse_with_a_message_naming_the_limit(db: ReadOnlyDatabase, sql: str, needle: str) -> None:
    err = _error(db, sql)
    assert err.kind == "too_large", err.message
    assert needle in err.message
    assert db.query("SELECT count(*) FROM customers").rows == [(3,)]


def test_values_at_the_limits_still_work(db: ReadOnlyDatabase) -> None:
    assert db.query(f"SELECT length({LONG})").rows == [(MAX_STRING_BYTES,)]
    assert db.query("SELECT 'x' LIKE '%' || 'x' || substr('" + "%" * 200 + f"', 1, {MAX_PATTERN_CHARS - 2})").rows == [(1,)]
    result = db.query("SELECT " + ", ".join(f"{i} AS c{i}" for i in range(MAX_RESULT_COLUMNS)))
    assert len(result.columns) == MAX_RESULT_COLUMNS


# -- result byte cap -------------------------------------------------------------------------------


def _csv_bytes(result: Any) -> int:
    return len(result.csv_text.encode("utf-8"))


@pytest.mark.parametrize(
    "sql",
    [
        # many columns of long cells, in a 10,000-row cross join
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000), b(s) AS (SELECT {w}) "
        "SELECT " + ", ".join(f"s || i AS c{k}" for k in range(60)) + " FROM c, b",
        # one column, long concatenations
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000) SELECT {w} || {w} || i FROM c",
        # cross join of the same table with itself, wide
        "SELECT a.*, b.*, c.*, {w} FROM customers a, customers b, customers c, customers d, customers e, customers f, "
        "customers g, customers h",
        # multibyte text: the cap counts UTF-8 bytes, not characters
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000) SELECT replace({w}, 'x', 'é日'), i FROM c",
        # quotes that CSV doubles
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000) SELECT replace({w}, 'x', '\"'), i FROM c",
    ],
    ids=["wide-cross-join", "long-concat", "self-cross-join", "multibyte", "quotes"],
)
def test_results_are_cut_at_the_byte_cap(db: ReadOnlyDatabase, sql: str) -> None:
    db.deadline_s = 30.0
    result = db.query(sql.format(w=_repeat_sql(3000)))
    assert result.truncated and result.truncated_by == "bytes"
    assert 0 < _csv_bytes(result) <= MAX_RESULT_BYTES
    # Nearly full: the next row would not have fitted.
    assert _csv_bytes(result) > MAX_RESULT_BYTES - len(format_rows([], result.rows[-1:]).encode()) - 1
    assert result.csv_text == format_rows(result.columns, result.rows)
    assert db.query("SELECT count(*) FROM customers").rows == [(3,)]


def test_small_results_are_whole_and_exact(db: ReadOnlyDatabase) -> None:
    result = db.query("SELECT id, amount, note FROM orders ORDER BY id")
    assert not result.truncated and result.truncated_by is None
    assert result.csv_text == format_rows(result.columns, result.rows)


def test_row_cap_reports_rows(big_image: bytes) -> None:
    db = ReadOnlyDatabase(big_image)
    try:
        result = db.query("SELECT n FROM big")
        assert result.truncated_by == "rows"
        assert _csv_bytes(result) <= MAX_RESULT_BYTES
    finally:
        db.close()


def test_long_text_cells_are_cut_before_they_reach_python(db: ReadOnlyDatabase) -> None:
    for text_sql in (LONG, f"replace(substr({LONG}, 1, 30000), 'x', '日')"):
        value = db.query(f"SELECT {text_sql}").rows[0][0]
        assert value.endswith("...[truncated]")
        assert len(value) == MAX_VALUE_CHARS + len("...[truncated]")
    blob = db.query(f"SELECT CAST({LONG} AS BLOB)").rows[0][0]
    assert blob == "78" * (MAX_VALUE_CHARS // 2) + "...[truncated]"


def test_invalid_utf8_text_shows_replacement_characters(db: ReadOnlyDatabase) -> None:
    assert db.query("SELECT CAST(x'61ff62' AS TEXT)").rows == [("a\ufffdb",)]


# -- the watchdog --------------------------------------------------------------------------------


def test_watchdog_interrupts_at_the_deadline_and_never_after_disarm() -> None:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        token = watchdog.arm(conn, time.perf_counter() + 0.05)
        with pytest.raises(sqlite3.OperationalError, match="interrupt"):
            conn.execute(RUNAWAY_CTE).fetchall()
        watchdog.disarm(token)
        # Disarmed long before its deadline passes: later statements run to the end.
        for _ in range(3):
            token = watchdog.arm(conn, time.perf_counter() + 0.05)
            assert conn.execute("SELECT 1").fetchall() == [(1,)]
            watchdog.disarm(token)
        time.sleep(0.1)
        assert conn.execute(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) SELECT count(*) FROM c"
        ).fetchall() == [(100000,)]
    finally:
        conn.close()


def test_build_database_refuses_values_queries_could_not_read() -> None:
    with pytest.raises(ValueError, match=f"{MAX_STRING_BYTES:,} bytes"):
        build_database({"t": {"columns": [["a", "TEXT"]], "rows": [["é" * (MAX_STRING_BYTES // 2 + 1)]]}})
    image = build_database({"t": {"columns": [["a", "TEXT"]], "rows": [["x" * MAX_STRING_BYTES]]}})
    db = ReadOnlyDatabase(image)
    try:
        assert db.query("SELECT length(a) FROM t").rows == [(MAX_STRING_BYTES,)]
    finally:
        db.close()


# -- through the simulator app and the env ---------------------------------------------------------


@pytest.fixture
def app_episode(tmp_path: Any):
    from simulators import SimulatorApp
    from simulators.app import template_fingerprint

    app = SimulatorApp(sql_deadline_s=30.0, python_sandbox=False, workspace_root=str(tmp_path))
    fp = template_fingerprint("fp", TABLES)
    assert app.put_database(fp, {"tables": TABLES})[0] == 204
    status, reply = app.open_episode({"episode_id": "e1", "database": fp})
    assert status == 201
    app.test_token = reply["result"]["episode_token"]
    yield app
    app.close()


def _post(app: Any, tool: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import json

    status, body, _ = app.handle_bytes("POST", f"/v1/episodes/e1/{tool}", json.dumps(payload).encode(), app.test_token)
    return status, json.loads(body)


WIDE = (
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000), b(s) AS (SELECT {w}) SELECT "
    + ", ".join(f"s || i AS c{k}" for k in range(40))
    + " FROM c, b"
)


def test_wide_query_through_the_app_keeps_reply_and_csv_bounded(app_episode: Any) -> None:
    import os

    status, reply = _post(app_episode, "sql", {"query": WIDE.format(w=_repeat_sql(3000))})
    assert status == 200, reply
    result = reply["result"]
    assert result["truncated"] is True and result["truncated_by"] == "bytes"
    assert 0 < result["row_count"] < 10_000
    path = os.path.join(app_episode.workspace_of("e1"), result["csv_path"])
    assert os.path.getsize(path) <= MAX_RESULT_BYTES
    with open(path, encoding="utf-8", newline="") as f:
        assert f.read() == format_rows(result["columns"], result["rows"])
    status, reply = _post(app_episode, "sql", {"query": "SELECT count(*) FROM orders"})
    assert (status, reply["result"]["rows"]) == (200, [[4]])


def test_pending_results_are_written_out_before_they_pile_up(app_episode: Any) -> None:
    from simulators.app import MAX_PENDING_BYTES

    episode = app_episode._episodes["e1"]
    query = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000) SELECT {w} || i FROM c"
    for _ in range(2 * MAX_PENDING_BYTES // MAX_RESULT_BYTES + 2):
        status, reply = _post(app_episode, "sql", {"query": query.format(w=_repeat_sql(2000))})
        assert status == 200 and reply["result"]["truncated_by"] == "bytes"
        assert episode.pending_bytes <= MAX_PENDING_BYTES
    assert episode._path is not None  # the workspace was created to take them


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("boom"), KeyError("x")])
def test_any_exception_in_a_handler_is_an_error_reply(app_episode: Any, monkeypatch: Any, error: Exception) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(ReadOnlyDatabase, "query", fail)
    status, reply = _post(app_episode, "sql", {"query": "SELECT 1"})
    assert reply["ok"] is False
    if isinstance(error, MemoryError):
        assert (status, reply["error"]["type"]) == (507, "out_of_memory")
        assert "LIMIT" in reply["error"]["message"]
    else:
        assert (status, reply["error"]["type"]) == (500, "internal")
    # Direct callers (DirectBackend) get the same answer instead of an exception.
    assert app_episode.tool("e1", "sql", {"query": "SELECT 1"})[0] == status
    assert app_episode.call("POST", "/v1/episodes/e1/sql", {"query": "SELECT 1"}, app_episode.test_token)[0] == status
    monkeypatch.undo()
    assert _post(app_episode, "sql", {"query": "SELECT 1"})[0] == 200


def test_memory_error_while_encoding_the_reply_is_an_error_reply(app_episode: Any, monkeypatch: Any) -> None:
    import json

    import simulators.app

    real = json.dumps
    calls = {"n": 0}

    def dumps(obj: Any, **kwargs: Any) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError
        return real(obj, **kwargs)

    monkeypatch.setattr(simulators.app.json, "dumps", dumps)
    status, body, _ = app_episode.handle_bytes("POST", "/v1/episodes/e1/sql", b'{"query": "SELECT 1"}')
    monkeypatch.undo()
    assert status == 507 and json.loads(body)["error"]["type"] == "out_of_memory"


def test_env_survives_a_huge_query_and_the_oracle_still_solves() -> None:
    import json

    import gymnasium as gym

    import agentrl_envs  # noqa: F401
    from agentrl_envs.agents import OracleAgent

    env = gym.make("AgentRL/SQL-v0", backend="direct")
    try:
        obs, info = env.reset(seed=3)
        action = json.dumps({"name": "sql", "arguments": {"query": WIDE.format(w=_repeat_sql(3000))}})
        env.unwrapped._backend.app.sql_deadline_s = 30.0  # type: ignore[attr-defined]
        obs, reward, terminated, truncated, info = env.step(action)
        assert "size limit" in obs, obs[-300:]
        assert not (terminated or truncated)
        agent = OracleAgent(env)
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
            done = terminated or truncated
        assert info["success"] is True
    finally:
        env.close()
