"""The simulated SQL service: template images, read-only episode copies, limits and error kinds."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest

from simulators.sql import MAX_RESULT_ROWS, ReadOnlyDatabase, SQLError, TemplateCache, build_database, format_rows
from simulators.sql.engine import MAX_QUERY_CHARS, MAX_VALUE_CHARS

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
