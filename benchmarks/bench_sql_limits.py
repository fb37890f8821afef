"""Worst-case SQL calls against the statement deadline, and peak memory of a wide result.

For each family of expensive string functions, the same query runs (a) on a plain SQLite
connection with the limits the engine had before (1,000,000-byte strings, 200-character patterns,
built-in functions, progress handler only), in a child process stopped after ``--cap`` seconds,
and (b) on the hardened episode connection (:class:`simulators.sql.ReadOnlyDatabase`). It prints
how long each took and how it ended; the hardened column must never be far past the deadline.
Then it runs one wide query (many columns x long cells x 10,000 rows) through the simulator app in
a child process and prints the peak RSS and the CSV size.

    python benchmarks/bench_sql_limits.py [--deadline 2] [--cap 30] [--no-baseline]

Measured on the 2-core shared dev machine (Dec 2026; load varies, so read the outcomes), deadline
2 s, cap 30 s; sizes are string lengths (100,000 is the hardened limit, 1,000,000 the old one)::

    family        size       baseline (old limits)   hardened
    ltrim         100,000    10.5-22.7 s ok           0.00 s ok       (also rtrim, trim: ~10 s -> 0.00 s)
    instr         1,000,000  7.5-25.2 s ok            0.00 s too_large
    glob          1,000,000  1.2-2.9 s ok             0.00 s too_large  (100,000: 0.09 s -> 0.08 s)
    glob scan     100,000    > 30 s (killed)          2.03 s timeout  (1,000 rows x one GLOB each)
    like scan     100,000    16.3 s / > 30 s          2.00 s timeout
    wide query, 20 columns x 3,000 chars x 10,000 rows, through the simulator app:
        before: HTTP 200, peak RSS 47 -> 2,371 MB, reply 601 MB, CSV 601 MB (30 columns under a
        2 GB address-space cap: MemoryError out of handle_bytes)
        after:  HTTP 200, 17 rows kept (cut by bytes), peak RSS 51 -> 53 MB, reply 1.0 MB, CSV 1.0 MB
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simulators.sql import ReadOnlyDatabase, SQLError, build_database
from simulators.sql.engine import MAX_PATTERN_CHARS, MAX_STRING_BYTES


def _repeat(n: int) -> str:
    """SQL for an ``n``-character string of x (nested replace: cheap to build, short to write)."""
    expr, size = "'x'", 1
    while size * 10 <= n:
        expr, size = f"replace({expr}, 'x', 'xxxxxxxxxx')", size * 10
    copies = -(-n // size)
    return f"substr({' || '.join([expr] * copies)}, 1, {n})"


def attacks(length: int, pattern: int) -> dict[str, str]:
    """Worst-case query per family for strings of ``length`` and patterns of ``pattern`` chars."""
    half = length // 2
    s = _repeat(length)
    like = f"'%' || substr({s}, 1, {pattern - 3}) || 'y%'"
    glob = f"'*' || replace(substr({s}, 1, {(pattern - 2) // 3}), 'x', '[x]') || 'y'"
    scan = "WITH b(s) AS (SELECT {s}) SELECT count(*) FROM t, b WHERE {cond}"
    loop = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c), b(s) AS (SELECT {s}) SELECT count(*) FROM c, b WHERE {cond}"
    return {
        "ltrim": f"SELECT length(ltrim(substr({s}, 1, {half}), replace(substr({s}, 1, {half - 1}), 'x', 'y') || 'x'))",
        "rtrim": f"SELECT length(rtrim(substr({s}, 1, {half}), replace(substr({s}, 1, {half - 1}), 'x', 'y') || 'x'))",
        "trim": f"SELECT length(trim(substr({s}, 1, {half}), replace(substr({s}, 1, {half - 1}), 'x', 'y') || 'x'))",
        "instr": f"SELECT instr({s}, substr({s}, 1, {half - 1}) || 'y')",
        "replace": f"SELECT length(replace({s}, substr({s}, 1, {half - 1}) || 'y', ''))",
        "like": f"SELECT {s} LIKE {like}",
        "glob": f"SELECT {s} GLOB {glob}",
        "like loop": loop.format(s=f"substr({s}, 1, {length - 12})", cond=f"(s || i) LIKE {like}"),
        "glob loop": loop.format(s=f"substr({s}, 1, {length - 12})", cond=f"(s || i) GLOB {glob}"),
        "instr loop": loop.format(s=f"substr({s}, 1, {length - 12})", cond=f"instr(s || i, substr(s, 1, {half}) || 'y') > 0"),
        "substr loop": loop.format(s=f"substr({s}, 1, {length - 12})", cond=f"substr(s, {length - 12} - (i % 7), 1) = 'y'"),
        # A scan of a 1,000-row table runs fewer than PROGRESS_STEPS opcodes in all: only the
        # watchdog's interrupt stops it at the deadline.
        "glob scan": scan.format(s=f"substr({s}, 1, {length - 12})", cond=f"(s || n) GLOB {glob}"),
        "like scan": scan.format(s=f"substr({s}, 1, {length - 12})", cond=f"(s || n) LIKE {like}"),
    }


def _baseline(sql: str, deadline: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (n INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 200)
    stop = time.perf_counter() + deadline
    conn.set_progress_handler(lambda: 1 if time.perf_counter() > stop else 0, 10_000)
    start = time.perf_counter()
    try:
        conn.execute(sql).fetchall()
        outcome = "ok"
    except sqlite3.Error as exc:
        outcome = "timeout" if "interrupt" in str(exc) else f"error: {str(exc)[:40]}"
    out.put((time.perf_counter() - start, outcome))


def run_baseline(sql: str, deadline: float, cap: float) -> str:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_baseline, args=(sql, deadline, out))
    proc.start()
    proc.join(cap)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return f"> {cap:.0f} s (killed)"
    elapsed, outcome = out.get()
    return f"{elapsed:.2f} s {outcome}"


def run_hardened(db: ReadOnlyDatabase, sql: str) -> str:
    start = time.perf_counter()
    try:
        db.query(sql)
        outcome = "ok"
    except SQLError as exc:
        outcome = exc.kind
    return f"{time.perf_counter() - start:.2f} s {outcome}"


def _wide(cols: int, width: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from simulators.app import SimulatorApp

    app = SimulatorApp(python_sandbox=False, sql_deadline_s=60.0)
    app.put_database("fp", {"tables": {"t": {"columns": [["a", "INTEGER"]], "rows": [[1]]}}})
    app.open_episode({"episode_id": "e", "database": "fp"})
    sql = (
        f"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000), b(s) AS (SELECT {_repeat(width)}) "
        "SELECT " + ", ".join(f"s || i AS c{k}" for k in range(cols)) + " FROM c, b"
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status, body, _ = app.handle_bytes("POST", "/v1/episodes/e/sql", json.dumps({"query": sql}).encode())
    workspace = app.workspace_of("e")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    path = os.path.join(workspace or "", "results", "q1.csv")
    size = os.path.getsize(path) if os.path.exists(path) else 0
    result = json.loads(body).get("result", {})
    app.close()
    out.put((status, result.get("row_count"), result.get("truncated_by"), len(body), size, before, after))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=float, default=2.0, help="statement deadline in seconds (default 2)")
    parser.add_argument("--cap", type=float, default=30.0, help="stop a baseline run after this many seconds (default 30)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unhardened runs")
    parser.add_argument("--only", default="", help="comma-separated families to run (default all)")
    args = parser.parse_args()
    table = {"t": {"columns": [["n", "INTEGER"]], "rows": [[i] for i in range(1000)]}}
    db = ReadOnlyDatabase(build_database(table), deadline_s=args.deadline)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    print(f"deadline {args.deadline:g} s; hardened limits: strings {MAX_STRING_BYTES:,} bytes, patterns {MAX_PATTERN_CHARS}")
    print(f"{'family':<14}{'size':>10}  {'baseline (old limits)':<26}{'hardened':<22}")
    for length, pattern in ((MAX_STRING_BYTES, MAX_PATTERN_CHARS), (1_000_000, 200)):
        for name, sql in attacks(length, pattern).items():
            if only and name not in only:
                continue
            base = "skipped" if args.no_baseline else run_baseline(sql, args.deadline, args.cap)
            print(f"{name:<14}{length:>10,}  {base:<26}{run_hardened(db, sql):<22}", flush=True)
    db.close()
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_wide, args=(20, 3000, out))
    proc.start()
    proc.join()
    status, rows, cut, body, csv_size, before, after = out.get()
    print(
        f"wide query 20 cols x 3000 chars x 10,000 rows: HTTP {status}, {rows} rows kept (cut by {cut}), "
        f"reply {body / 1e6:.1f} MB, CSV {csv_size / 1e6:.2f} MB, peak RSS {before / 1024:.0f} -> {after / 1024:.0f} MB"
    )


if __name__ == "__main__":
    main()
