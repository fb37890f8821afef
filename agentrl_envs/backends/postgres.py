"""``backend={"sql": "postgresql://user:password@host:port/dbname"}``: SQL on a real PostgreSQL.

Each episode gets its own schema, written by the env from a per-backend template schema
(``CREATE TABLE ... AS TABLE``, never re-inserting the data), and its own login role that can only
``SELECT`` in that schema: no write rights, no other episode's data, no ``TEMP`` tables, no
superuser functions (``COPY ... TO PROGRAM``, ``pg_read_file``). The role carries
``statement_timeout``, ``idle_in_transaction_session_timeout`` and ``default_transaction_read_only``;
since an agent can ``SET statement_timeout = 0``, the deadline is also enforced client-side by
cancelling the query.

The URL's user needs ``CREATEROLE`` and the right to create schemas in the database. Results come
back like the simulator's (floats for numerics, ISO text for dates), saved as ``results/qN.csv``
in the episode's workspace.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError, PermanentError, TransientError
from simulators.sql import MAX_RESULT_ROWS, format_rows

__all__ = ["PostgresBackend"]

MAX_QUERY_CHARS = 20_000
_TYPES = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "TEXT": "TEXT"}


@dataclass
class _Episode:
    schema: str
    password: str
    conn: Any
    queries: int = 0


class PostgresBackend:
    """Read-only SQL for agents on a PostgreSQL database.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` of an account with CREATEROLE.
        sql_deadline_s: statement deadline (server-side and client-side).
        idle_timeout_s: ``idle_in_transaction_session_timeout`` of the agent's sessions.
        connect_timeout_s: how long to wait for a connection.
    """

    def __init__(
        self, url: str, sql_deadline_s: float = 2.0, idle_timeout_s: float = 10.0, connect_timeout_s: float = 5.0
    ) -> None:
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency
            raise ConfigError("the PostgreSQL backend needs psycopg: pip install 'psycopg[binary]'") from None
        self._psycopg = psycopg
        try:
            self._info = psycopg.conninfo.conninfo_to_dict(url.replace("postgresql+psycopg://", "postgresql://", 1))
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"backend URL {url[:200]!r}: {exc}") from None
        self.deadline_s = sql_deadline_s
        self.idle_timeout_s = idle_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._token = secrets.token_hex(4)
        self._templates: set[str] = set()
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()
        self._admin = self._connect(dict(self._info))
        self._dbname = self._admin.info.dbname
        with self._admin.transaction():
            # Agents may not create temporary tables anywhere in this database.
            self._admin.execute(f"REVOKE TEMPORARY ON DATABASE {_ident(self._dbname)} FROM PUBLIC")

    def _connect(self, info: dict[str, Any]) -> Any:
        info.setdefault("connect_timeout", max(1, int(self.connect_timeout_s)))
        try:
            return self._psycopg.connect(autocommit=True, **info)
        except self._psycopg.OperationalError as exc:
            host = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}"
            raise TransientError(f"cannot connect to PostgreSQL at {host}: {str(exc).strip()[:300]}") from None

    # -- episodes -------------------------------------------------------------------------------

    def open_episode(self, setup: EpisodeSetup) -> None:
        if setup.database is None:
            return
        tables = setup.database.tables
        template = self._template(setup.database.fingerprint, tables)
        name = "agentrl_ep_" + hashlib.sha256(f"{self._token}:{setup.episode_id}".encode()).hexdigest()[:20]
        password = secrets.token_urlsafe(24)
        s, r = _ident(name), _ident(name)
        deadline_ms = int(self.deadline_s * 1000)
        with self._lock, self._admin.transaction():
            ex = self._admin.execute
            ex(f"CREATE SCHEMA {s}")
            for table in tables:
                ex(f"CREATE TABLE {s}.{_ident(table)} AS TABLE {_ident(template)}.{_ident(table)}")
            ex(
                f"CREATE ROLE {r} LOGIN PASSWORD {_literal(password)} NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION CONNECTION LIMIT 3"
            )
            ex(f"ALTER ROLE {r} SET search_path = {s}")
            ex(f"ALTER ROLE {r} SET statement_timeout = {deadline_ms}")
            ex(f"ALTER ROLE {r} SET idle_in_transaction_session_timeout = {int(self.idle_timeout_s * 1000)}")
            ex(f"ALTER ROLE {r} SET default_transaction_read_only = on")
            ex(f"GRANT CONNECT ON DATABASE {_ident(self._dbname)} TO {r}")
            ex(f"GRANT USAGE ON SCHEMA {s} TO {r}")
            ex(f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {r}")
        info = dict(self._info, user=name, password=password)
        self._episodes[setup.episode_id] = _Episode(name, password, self._connect(info))

    def _template(self, fingerprint: str, tables: dict[str, dict[str, Any]]) -> str:
        name = f"agentrl_tpl_{self._token}_" + hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
        if name in self._templates:
            return name
        with self._lock, self._admin.transaction():
            self._admin.execute(f"CREATE SCHEMA {_ident(name)}")
            for table, spec in tables.items():
                cols = ", ".join(f"{_ident(c)} {_TYPES[t]}" for c, t in spec["columns"])
                self._admin.execute(f"CREATE TABLE {_ident(name)}.{_ident(table)} ({cols})")
                col_list = ", ".join(_ident(c) for c, _ in spec["columns"])
                with self._admin.cursor().copy(f"COPY {_ident(name)}.{_ident(table)} ({col_list}) FROM STDIN") as copy:
                    for row in spec["rows"]:
                        copy.write_row(row)
        self._templates.add(name)
        return name

    def close_episode(self, episode_id: str) -> None:
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            return
        try:
            episode.conn.close()
        except self._psycopg.Error:
            pass
        self._drop(episode.schema, role=True)

    def _drop(self, name: str, role: bool) -> None:
        with self._lock:
            try:
                with self._admin.transaction():
                    if role:
                        self._admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
                        self._admin.execute(f"DROP OWNED BY {_ident(name)} CASCADE")
                    self._admin.execute(f"DROP SCHEMA IF EXISTS {_ident(name)} CASCADE")
                    if role:
                        self._admin.execute(f"DROP ROLE IF EXISTS {_ident(name)}")
            except self._psycopg.Error:
                pass  # best effort: the database may be gone

    def close(self) -> None:
        for episode_id in list(self._episodes):
            self.close_episode(episode_id)
        for name in list(self._templates):
            self._drop(name, role=False)
        self._templates.clear()
        try:
            self._admin.close()
        except self._psycopg.Error:
            pass

    # -- queries --------------------------------------------------------------------------------

    def handle(self, request: ToolRequest) -> ToolResponse:
        episode = self._episodes.get(request.episode_id)
        if request.tool != "sql":
            return _error(404, "unknown_tool", f"this backend serves sql, not {request.tool!r}")
        if episode is None:
            return _error(404, "unknown_episode", f"no open episode {request.episode_id[:64]!r}")
        query = request.arguments.get("query")
        if not isinstance(query, str):
            return _error(422, "bad_arguments", "'query' must be a string")
        if not query.strip():
            return _error(400, "bad_request", "query is empty")
        if len(query) > MAX_QUERY_CHARS:
            return _error(413, "too_large", f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
        if "\x00" in query:
            return _error(400, "bad_request", "query contains a NUL character")
        pg = self._psycopg
        if episode.conn.closed:  # e.g. ended by idle_in_transaction_session_timeout
            try:
                episode.conn = self._connect(dict(self._info, user=episode.schema, password=episode.password))
            except TransientError as exc:
                return ToolResponse(
                    ok=False,
                    status=503,
                    error_type="http_503",
                    error=str(exc),
                    fault={"type": "http_503", "status": 503, "origin": "service"},
                )
        cancel = getattr(episode.conn, "cancel_safe", None) or episode.conn.cancel
        timer = threading.Timer(self.deadline_s + 0.25, cancel)
        timer.start()
        try:
            # A binary cursor uses the extended protocol, which refuses several statements in one call.
            cur = episode.conn.cursor(binary=True)
            cur.execute(query)
            columns = [d.name for d in cur.description] if cur.description else []
            fetched = cur.fetchmany(MAX_RESULT_ROWS + 1) if cur.description else []
        except pg.errors.QueryCanceled:
            return _error(408, "timeout", f"query exceeded the {self.deadline_s:g} s statement deadline and was stopped")
        except pg.errors.InsufficientPrivilege as exc:
            return _error(403, "denied", f"{_first_line(exc)}: only read-only SELECT statements are allowed")
        except pg.errors.ReadOnlySqlTransaction as exc:
            return _error(403, "denied", f"{_first_line(exc)}: only read-only SELECT statements are allowed")
        except pg.errors.SyntaxError as exc:
            if "cannot insert multiple commands" in str(exc):
                return _error(400, "bad_request", "send one SQL statement per call")
            return _error(400, "syntax", _first_line(exc))
        except (pg.errors.UndefinedTable, pg.errors.UndefinedColumn, pg.errors.UndefinedFunction) as exc:
            return _error(400, "unknown_name", _first_line(exc))
        except pg.errors.ProgramLimitExceeded as exc:
            return _error(413, "too_large", _first_line(exc))
        except pg.OperationalError as exc:
            return ToolResponse(
                ok=False,
                status=503,
                error_type="http_503",
                error=f"database connection failed: {_first_line(exc)}",
                fault={"type": "http_503", "status": 503, "origin": "service"},
            )
        except pg.Error as exc:
            if "cannot insert multiple commands" in str(exc):
                return _error(400, "bad_request", "send one SQL statement per call")
            return _error(400, "error", _first_line(exc))
        finally:
            timer.cancel()
            _rollback(episode.conn, pg)
        rows = [tuple(_plain(v) for v in row) for row in fetched[:MAX_RESULT_ROWS]]
        episode.queries += 1
        csv_path = f"results/q{episode.queries}.csv"
        return ToolResponse(
            ok=True,
            status=200,
            result={
                "columns": columns,
                "rows": [list(r) for r in rows],
                "row_count": len(rows),
                "truncated": len(fetched) > MAX_RESULT_ROWS,
                "csv_path": csv_path,
                "vm_steps": 0,
                "csv_text": format_rows(columns, rows),
            },
        )


def _rollback(conn: Any, pg: Any) -> None:
    """Leave no transaction open after a call (an agent may send BEGIN)."""
    try:
        if conn.info.transaction_status != pg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
    except pg.Error:
        pass


def _plain(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return str(value)


def _ident(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
        raise PermanentError(f"refusing to use {name!r} as a PostgreSQL identifier")
    return f'"{name}"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _error(status: int, kind: str, message: str) -> ToolResponse:
    return ToolResponse(ok=False, status=status, error_type=kind, error=message)
