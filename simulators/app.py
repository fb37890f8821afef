"""The simulator's REST API: one handler from ``httpx.Request`` to ``httpx.Response``.

Routes (JSON bodies; every error is ``{"ok": false, "error": {"type", "message"}}``)::

    PUT    /v1/databases/{fingerprint}      {"tables": {...}}            store a template database
    POST   /v1/episodes                     {"episode_id", "database", "files", "sender"}
    DELETE /v1/episodes/{episode_id}
    POST   /v1/episodes/{episode_id}/sql    {"query"}
    POST   /v1/episodes/{episode_id}/python {"code"}
    POST   /v1/episodes/{episode_id}/smtp   {"to", "subject", "body", "cc"?, "attachments"?}

``backend="sim"`` calls :meth:`SimulatorApp.handle` through ``httpx.MockTransport``, so the wire
format is exercised even in process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from simulators.python import PythonRunner, RunLimits
from simulators.smtp import Mailbox, SMTPError
from simulators.sql import ReadOnlyDatabase, SQLError, TemplateCache, format_rows

MAX_REQUEST_BYTES = 8 << 20
_EPISODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

_SQL_STATUS = {"timeout": 408, "denied": 403, "too_large": 413, "syntax": 400, "unknown_name": 400}


@dataclass
class _Episode:
    workspace: str
    database: ReadOnlyDatabase | None
    mailbox: Mailbox
    queries: int = 0


class SimulatorApp:
    """In-memory simulator of the SQL, Python and SMTP services.

    Args:
        sql_deadline_s: statement deadline of the SQL service.
        python_limits: resource limits of the Python service.
        workspace_root: where episode workspaces are created (default: the system temp dir).
    """

    def __init__(
        self,
        sql_deadline_s: float = 2.0,
        python_limits: RunLimits | None = None,
        workspace_root: str | None = None,
    ) -> None:
        self.sql_deadline_s = sql_deadline_s
        self.templates = TemplateCache()
        self.runner = PythonRunner(python_limits)
        self.workspace_root = workspace_root
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()

    # -- HTTP surface -------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Serve one request. Never raises: every failure is a JSON error response."""
        try:
            body = request.read()
            if len(body) > MAX_REQUEST_BYTES:
                return _error(413, "too_large", f"request body over {MAX_REQUEST_BYTES} bytes")
            payload = json.loads(body) if body else {}
            if not isinstance(payload, dict):
                return _error(400, "bad_request", "the request body must be a JSON object")
            return self._route(request.method, request.url.path, payload)
        except (ValueError, RecursionError) as exc:
            return _error(400, "bad_request", f"malformed JSON body: {type(exc).__name__}")
        except Exception as exc:
            return _error(500, "internal", f"{type(exc).__name__}: {exc}")

    def _route(self, method: str, path: str, payload: dict[str, Any]) -> httpx.Response:
        parts = [p for p in path.split("/") if p]
        if len(parts) == 3 and parts[:2] == ["v1", "databases"] and method == "PUT":
            return self._put_database(parts[2], payload)
        if parts == ["v1", "episodes"] and method == "POST":
            return self._open_episode(payload)
        if len(parts) == 3 and parts[:2] == ["v1", "episodes"] and method == "DELETE":
            self.close_episode(parts[2])
            return httpx.Response(204)
        if len(parts) == 4 and parts[:2] == ["v1", "episodes"] and method == "POST":
            episode = self._episodes.get(parts[2])
            if episode is None:
                return _error(404, "unknown_episode", f"no open episode {parts[2][:64]!r}")
            tool = parts[3]
            if tool == "sql":
                return self._sql(episode, payload)
            if tool == "python":
                return self._python(episode, payload)
            if tool == "smtp":
                return self._smtp(episode, payload)
            return _error(404, "unknown_tool", f"no tool {tool[:64]!r}; tools are sql, python, smtp")
        if parts == ["health"]:
            return _ok({"episodes": len(self._episodes)})
        return _error(404, "not_found", f"no route {method} {path[:100]}")

    # -- episodes -----------------------------------------------------------------------------

    def _put_database(self, fingerprint: str, payload: dict[str, Any]) -> httpx.Response:
        tables = payload.get("tables")
        if not isinstance(tables, dict):
            return _error(400, "bad_request", "expected {'tables': {name: {columns, rows}}}")
        try:
            self.templates.put(fingerprint, tables)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "bad_database", str(exc))
        return httpx.Response(204)

    def _open_episode(self, payload: dict[str, Any]) -> httpx.Response:
        episode_id = payload.get("episode_id")
        if not isinstance(episode_id, str) or not _EPISODE_ID.fullmatch(episode_id):
            return _error(400, "bad_request", "episode_id must match [A-Za-z0-9_.-]{1,64}")
        files = payload.get("files") or {}
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return _error(400, "bad_request", "files must be an object of {relative path: text}")
        fingerprint = payload.get("database")
        database = None
        if fingerprint is not None:
            image = self.templates.get(str(fingerprint))
            if image is None:
                return _error(409, "unknown_database", f"no template database {str(fingerprint)[:64]!r}; PUT it first")
            database = ReadOnlyDatabase(image, deadline_s=self.sql_deadline_s)
        workspace = tempfile.mkdtemp(prefix="agentrl-ws-", dir=self.workspace_root)
        try:
            os.makedirs(os.path.join(workspace, "results"))
            for rel, text in files.items():
                full = os.path.realpath(os.path.join(workspace, rel))
                if not rel or "\x00" in rel or not full.startswith(os.path.realpath(workspace) + os.sep):
                    raise ValueError(f"file {rel[:64]!r} is outside the workspace")
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
        except (OSError, ValueError, UnicodeError) as exc:
            shutil.rmtree(workspace, ignore_errors=True)
            if database is not None:
                database.close()
            return _error(400, "bad_request", f"could not set up the workspace: {exc}")
        sender = str(payload.get("sender") or "agent@agentrl.example")
        with self._lock:
            self.close_episode(episode_id)
            self._episodes[episode_id] = _Episode(workspace, database, Mailbox(sender, "msg"))
        return _ok({"episode_id": episode_id}, status=201)

    def close_episode(self, episode_id: str) -> None:
        """Drop an episode's database, workspace and mailbox (no error if it is not open)."""
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            return
        if episode.database is not None:
            episode.database.close()
        shutil.rmtree(episode.workspace, ignore_errors=True)

    def close(self) -> None:
        for episode_id in list(self._episodes):
            self.close_episode(episode_id)
        self.runner.close()

    # -- tools --------------------------------------------------------------------------------

    def _sql(self, episode: _Episode, payload: dict[str, Any]) -> httpx.Response:
        if episode.database is None:
            return _error(404, "no_database", "this episode has no database")
        query = payload.get("query")
        if not isinstance(query, str):
            return _error(422, "bad_arguments", "'query' must be a string")
        try:
            result = episode.database.query(query)
        except SQLError as exc:
            return _error(_SQL_STATUS.get(exc.kind, 400), exc.kind, exc.message)
        episode.queries += 1
        csv_path = f"results/q{episode.queries}.csv"
        with open(os.path.join(episode.workspace, csv_path), "w", encoding="utf-8", newline="") as f:
            f.write(format_rows(result.columns, result.rows))
        return _ok(
            {
                "columns": result.columns,
                "rows": [list(r) for r in result.rows],
                "row_count": len(result.rows),
                "truncated": result.truncated,
                "csv_path": csv_path,
                "vm_steps": result.vm_steps,
            }
        )

    def _python(self, episode: _Episode, payload: dict[str, Any]) -> httpx.Response:
        code = payload.get("code")
        if not isinstance(code, str):
            return _error(422, "bad_arguments", "'code' must be a string")
        if len(code) > 100_000:
            return _error(413, "too_large", f"code is {len(code)} characters; the limit is 100000")
        if "\x00" in code:
            return _error(400, "bad_request", "code contains a NUL character")
        result = self.runner.run(code, episode.workspace)
        return _ok(
            {
                "exit_code": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "timed_out": result.timed_out,
                "output_truncated": result.output_truncated,
            }
        )

    def _smtp(self, episode: _Episode, payload: dict[str, Any]) -> httpx.Response:
        unknown = set(payload) - {"to", "subject", "body", "cc", "attachments"}
        if unknown:
            return _error(422, "bad_arguments", f"unknown fields {sorted(unknown)}")
        try:
            delivery = episode.mailbox.send(
                episode.workspace,
                payload.get("to"),
                payload.get("subject"),
                payload.get("body"),
                cc=payload.get("cc"),
                attachments=payload.get("attachments"),
            )
        except SMTPError as exc:
            return _error(422, exc.kind, exc.message, smtp_code=exc.code)
        return _ok(delivery.as_dict())


def _ok(result: dict[str, Any], status: int = 200) -> httpx.Response:
    return httpx.Response(status, json={"ok": True, "result": result})


def _error(status: int, kind: str, message: str, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"ok": False, "error": {"type": kind, "message": message, **extra}})
