"""``backend={"sql": "postgresql://user:password@host:port/dbname"}``: SQL on a real PostgreSQL.

Each episode gets its own schema, written by the env from a per-backend template schema
(``CREATE TABLE ... AS TABLE``, never re-inserting the data), and its own login role that can only
``SELECT`` in that schema: no write rights, no other episode's data, no ``TEMP`` tables, no
superuser functions (``COPY ... TO PROGRAM``, ``pg_read_file``). The role carries
``statement_timeout``, ``idle_in_transaction_session_timeout`` and ``default_transaction_read_only``;
since an agent can ``SET statement_timeout = 0``, the deadline is also enforced client-side by
cancelling the query.

The URL's user needs ``CREATEROLE`` and the right to create schemas in the database; it need not be
a superuser. It owns every schema and table the backend makes; each episode role is granted to it
(so it may end that role's sessions and ``DROP OWNED BY`` it on PostgreSQL 15 and later), and the
role itself owns nothing. A cleanup that fails anyway is reported with a :class:`CleanupWarning`,
never swallowed, and :func:`sweep` (``agentrl-envs pg-sweep URL``) removes what killed processes
left behind: names carry the backend's token, and the admin session of a live backend advertises
it as its ``application_name``.

Results come back like the simulator's (floats for numerics, ISO text for dates), saved as
``results/qN.csv`` in the episode's workspace.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import re
import secrets
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError, PermanentError, TransientError
from simulators.sql import MAX_RESULT_ROWS, format_rows, table_keys

__all__ = ["CleanupWarning", "PostgresBackend", "SweepReport", "sweep"]

MAX_QUERY_CHARS = 20_000
_TYPES = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "TEXT": "TEXT"}
#: ``application_name`` prefix of a live backend's admin session; the backend's token follows.
APP_PREFIX = "agentrl-backend-"
_EPISODE_PREFIX = "agentrl_ep_"
_TEMPLATE_PREFIX = "agentrl_tpl_"
# What the backend names things (episodes: token + digest; older versions: digest only).
_NAME = re.compile(r"agentrl_ep_(?:(?P<ep>[0-9a-f]{8})_)?[0-9a-f]{20}|agentrl_tpl_(?P<tpl>[0-9a-f]{8})_[0-9a-f]{16}")


class CleanupWarning(RuntimeWarning):
    """A schema or role the backend made could not be dropped; ``agentrl-envs pg-sweep URL`` removes it."""


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
        #: Cleanup failures so far, one message each (also issued as :class:`CleanupWarning`).
        self.cleanup_errors: list[str] = []
        self._admin = self._connect(dict(self._info, application_name=APP_PREFIX + self._token))
        self._dbname = self._admin.info.dbname
        with self._admin.transaction():
            # Agents may not create temporary tables anywhere in this database. Only the database's
            # owner can revoke that from PUBLIC (for anyone else it is a no-op), so check it held:
            # an agent can switch its session to read-write and the privilege is all that is left.
            self._admin.execute(f"REVOKE TEMPORARY ON DATABASE {_ident(self._dbname)} FROM PUBLIC")
            row = self._admin.execute("SELECT has_database_privilege('public', current_database(), 'TEMPORARY')").fetchone()
        if row is not None and row[0]:
            self._admin.close()
            raise ConfigError(
                f"PUBLIC may create temporary tables in database {self._dbname!r}, so agents could too; as the "
                f"database's owner run: REVOKE TEMPORARY ON DATABASE {_ident(self._dbname)} FROM PUBLIC"
            )

    def _connect(self, info: dict[str, Any]) -> Any:
        info.setdefault("connect_timeout", max(1, int(self.connect_timeout_s)))
        try:
            return self._psycopg.connect(autocommit=True, **info)
        except self._psycopg.OperationalError as exc:
            raise _connect_error(info, exc) from None

    # -- episodes -------------------------------------------------------------------------------

    def open_episode(self, setup: EpisodeSetup) -> None:
        if setup.database is None:
            return
        tables = setup.database.tables
        template = self._template(setup.database.fingerprint, tables)
        digest = hashlib.sha256(f"{self._token}:{setup.episode_id}".encode()).hexdigest()[:20]
        name = f"{_EPISODE_PREFIX}{self._token}_{digest}"
        password = secrets.token_urlsafe(24)
        s, r = _ident(name), _ident(name)
        deadline_ms = int(self.deadline_s * 1000)
        with self._lock, self._admin.transaction():
            ex = self._admin.execute
            ex(f"CREATE SCHEMA {s}")
            for table in tables:
                # LIKE ... INCLUDING ALL: the template's primary key and indexes come along.
                ex(f"CREATE TABLE {s}.{_ident(table)} (LIKE {_ident(template)}.{_ident(table)} INCLUDING ALL)")
                ex(f"INSERT INTO {s}.{_ident(table)} SELECT * FROM {_ident(template)}.{_ident(table)}")
            ex(
                f"CREATE ROLE {r} LOGIN PASSWORD {_literal(password)} NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION CONNECTION LIMIT 3"
            )
            # Membership of the episode role (never the reverse): without it a CREATEROLE admin on
            # PostgreSQL 15+ may neither end the role's sessions nor DROP OWNED BY it.
            ex(f"GRANT {r} TO CURRENT_USER")
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
        name = f"{_TEMPLATE_PREFIX}{self._token}_" + hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
        if name in self._templates:
            return name
        try:
            keys = {table: table_keys(table, spec) for table, spec in tables.items()}
        except ValueError as exc:
            raise ConfigError(f"the episode database's schema is invalid: {exc}") from None
        with self._lock, self._admin.transaction():
            self._admin.execute(f"CREATE SCHEMA {_ident(name)}")
            for table, spec in tables.items():
                primary_key, indexes = keys[table]
                cols = ", ".join(f"{_ident(c)} {_TYPES[t]}" for c, t in spec["columns"])
                if primary_key:
                    cols += ", PRIMARY KEY (" + ", ".join(_ident(c) for c in primary_key) + ")"
                self._admin.execute(f"CREATE TABLE {_ident(name)}.{_ident(table)} ({cols})")
                col_list = ", ".join(_ident(c) for c, _ in spec["columns"])
                with self._admin.cursor().copy(f"COPY {_ident(name)}.{_ident(table)} ({col_list}) FROM STDIN") as copy:
                    for row in spec["rows"]:
                        copy.write_row(row)
                for columns in indexes:
                    on = ", ".join(_ident(c) for c in columns)
                    self._admin.execute(f"CREATE INDEX ON {_ident(name)}.{_ident(table)} ({on})")
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
                _drop_objects(self._admin, name, role=role)
            except self._psycopg.Error as exc:
                message = (
                    f"PostgreSQL cleanup of {'schema and role' if role else 'schema'} {name} failed: {_first_line(exc)}; "
                    "it is left in the database: remove leftovers with `agentrl-envs pg-sweep URL`"
                )
                self.cleanup_errors.append(message)
                warnings.warn(message, CleanupWarning, stacklevel=3)

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


def _drop_objects(conn: Any, name: str, role: bool) -> None:
    """Drop schema ``name`` and, with ``role``, the login role of the same name, in one transaction."""
    with conn.transaction():
        if role:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(f"DROP SCHEMA IF EXISTS {_ident(name)} CASCADE")
        if role and conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            # DROP OWNED also revokes what was granted to the role (CONNECT on the database).
            conn.execute(f"DROP OWNED BY {_ident(name)} CASCADE")
            conn.execute(f"DROP ROLE {_ident(name)}")


# -- sweeping up after killed processes ----------------------------------------------------------


@dataclass
class SweepReport:
    """What :func:`sweep` found and did.

    Attributes:
        schemas: leftover ``agentrl_*`` schemas dropped (a dry run: that would be dropped).
        roles: leftover ``agentrl_ep_*`` roles dropped (a dry run: that would be dropped).
        kept: names that belong to a live backend or a connected episode, left alone.
        errors: ``(name, message)`` for each leftover that could not be dropped.
    """

    schemas: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)


def sweep(url: str, dry_run: bool = False, connect_timeout_s: float = 5.0) -> SweepReport:
    """Drop the ``agentrl_*`` schemas and roles of PostgreSQL backends that are gone.

    A name is kept while its backend lives (its admin session's ``application_name`` carries the
    token in the name) or while a session of the episode role is connected. Run it as the account
    the backends use (or one with the same rights); it needs no superuser.

    Args:
        url: ``postgresql://user:password@host:port/dbname``.
        dry_run: only report what would be dropped.
        connect_timeout_s: how long to wait for the connection.

    Raises:
        ConfigError: for a malformed URL. TransientError: when the server cannot be reached.
        PermanentError: when the server refuses the account (see :func:`_connect_error`).
    """
    import psycopg

    try:
        info: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(url.replace("postgresql+psycopg://", "postgresql://", 1))
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"PostgreSQL URL {url[:200]!r}: {str(exc)[:300]}") from None  # libpq quotes all of it
    info.setdefault("connect_timeout", max(1, int(connect_timeout_s)))
    try:
        conn = psycopg.connect(autocommit=True, **info)
    except psycopg.OperationalError as exc:
        raise _connect_error(info, exc) from None
    report = SweepReport()
    with conn:
        live_tokens = {
            str(row[0])[len(APP_PREFIX) :]
            for row in conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE starts_with(application_name, %s)", (APP_PREFIX,)
            )
        }
        connected = {str(row[0]) for row in conn.execute("SELECT usename FROM pg_stat_activity WHERE usename IS NOT NULL")}
        like = "agentrl\\_%"
        schemas = sorted(str(r[0]) for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (like,)))
        roles = sorted(str(r[0]) for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (like,)))

        for name in sorted(set(schemas) | set(roles)):
            match = _NAME.fullmatch(name)
            if match is None:  # not a name this backend makes: not ours to drop
                continue
            if (match["ep"] or match["tpl"]) in live_tokens or name in connected:
                report.kept.append(name)
                continue
            is_role = name in roles and name.startswith(_EPISODE_PREFIX)
            if not dry_run:
                try:
                    if is_role:
                        # A role left by an older version, or by an admin that lost the grant.
                        has = conn.execute("SELECT pg_has_role(current_user, %s, 'USAGE')", (name,)).fetchone()
                        if not (has and has[0]):
                            conn.execute(f"GRANT {_ident(name)} TO CURRENT_USER")
                    _drop_objects(conn, name, role=is_role)
                except psycopg.Error as exc:
                    report.errors.append((name, _first_line(exc)))
                    continue
            if name in schemas:
                report.schemas.append(name)
            if is_role:
                report.roles.append(name)
    return report


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


#: What the server says when it refuses the account or database itself: retrying with the same URL
#: cannot succeed. libpq gives no SQLSTATE for a failed connection (psycopg's ``sqlstate`` is None),
#: so the server's message is matched; an unknown message stays transient, as before.
_REFUSALS = (
    "authentication failed",  # 28P01 password, and ident / peer / GSSAPI / SSPI / LDAP / RADIUS / cert
    "no pg_hba.conf entry",  # 28000: this host, user or database is not allowed in
    "is not permitted to log in",  # 28000: a NOLOGIN role
    "does not exist",  # 3D000 database, 28000 role
    "no password supplied",  # the server asks for a password the URL does not hold
    "permission denied for database",  # 42501: no CONNECT privilege
)


def _connect_error(info: dict[str, Any], exc: BaseException) -> TransientError | PermanentError:
    """The error for a failed connection: PermanentError if the server refused the account, else TransientError.

    A wrong password was reported as transient, so callers retried it with backoff; a refused
    account needs a different URL, which the message says.
    """
    host = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}"
    reason = str(exc).strip()[:300]
    if any(marker in reason for marker in _REFUSALS):
        return PermanentError(
            f"PostgreSQL at {host} refused the connection: {reason}; "
            "check the user, password and database name in the backend URL (retrying will not help)"
        )
    return TransientError(f"cannot connect to PostgreSQL at {host}: {reason}")


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
