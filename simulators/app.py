"""The simulator's REST API, served in process (``httpx.MockTransport``) or over HTTP.

Routes (JSON bodies; every error is ``{"ok": false, "error": {"type", "message"}}``; the full
OpenAPI document is served at ``GET /openapi.json``)::

    GET    /openapi.json                                  the OpenAPI 3.1 document
    GET    /health                                        {"ok": true, "result": {"episodes": n}}
    PUT    /v1/databases/{fingerprint}                    {"tables": {...}}: store a template database
    POST   /v1/episodes                                   {"episode_id", "database", "files", "sender"}
    DELETE /v1/episodes/{episode_id}
    POST   /v1/episodes/{episode_id}/sql                  {"query"}
    POST   /v1/episodes/{episode_id}/python               {"code"}
    POST   /v1/episodes/{episode_id}/smtp                 {"to", "subject", "body", "cc"?, "attachments"?}
    PUT    /v1/episodes/{episode_id}/files/{path}         {"text"} or {"b64"}: write a workspace file
    GET    /v1/episodes/{episode_id}/files/{path}         {"ok": true, "result": {"path", "b64"}}

:class:`SimulatorApp` has the same operations as Python methods (``open_episode``, ``tool``, ...)
for callers that skip the wire, and :meth:`SimulatorApp.handle` / :meth:`handle_bytes` for those
that speak it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from simulators.python import PythonRunner, RunLimits
from simulators.python.sandbox import SandboxRunner
from simulators.smtp import Mailbox, SMTPError
from simulators.sql import ReadOnlyDatabase, SQLError, TemplateCache

MAX_REQUEST_BYTES = 8 << 20
MAX_FILE_BYTES = 2 << 20
#: Bytes of query results an episode may hold in memory before they are written to its workspace.
MAX_PENDING_BYTES = 8 << 20

#: (HTTP status, JSON body or None for an empty body)
Reply = tuple[int, "dict[str, Any] | None"]
_EPISODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

_SQL_STATUS = {"timeout": 408, "denied": 403, "too_large": 413, "syntax": 400, "unknown_name": 400}


@dataclass
class _Episode:
    """One open episode. Its workspace directory is created on first use (a Python run, a mail
    attachment, a file read or write): an episode that only queries never touches the disk."""

    root: str | None
    files: dict[str, str]
    database: ReadOnlyDatabase | None
    mailbox: Mailbox
    queries: int = 0
    # One call at a time per episode: its SQLite connection and mailbox are not thread-safe, and
    # an HTTP client may send concurrent calls for the same episode.
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Query results (CSV text) not yet written to the workspace (see ``workspace``).
    pending: dict[str, str] = field(default_factory=dict)
    pending_bytes: int = 0
    _path: str | None = None

    @property
    def workspace(self) -> str:
        """The workspace directory, created with the setup files and every query result so far."""
        if self._path is None:
            path = tempfile.mkdtemp(prefix="agentrl-ws-", dir=self.root)
            try:
                os.makedirs(os.path.join(path, "results"))
                for rel, text in self.files.items():
                    full = os.path.join(path, rel)
                    os.makedirs(os.path.dirname(full), exist_ok=True)
                    with open(full, "w", encoding="utf-8", newline="") as f:
                        f.write(text)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            self._path = path
        if self.pending:
            for rel, text in self.pending.items():
                with open(os.path.join(self._path, rel), "w", encoding="utf-8", newline="") as f:
                    f.write(text)
            self.pending.clear()
            self.pending_bytes = 0
        return self._path

    def discard(self) -> None:
        if self.database is not None:
            self.database.close()
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)


class SimulatorApp:
    """In-memory simulator of the SQL, Python and SMTP services.

    Args:
        sql_deadline_s: statement deadline of the SQL service.
        python_limits: resource limits of the Python service.
        workspace_root: where episode workspaces are created (default: the system temp dir).
        python_sandbox: run programs in the hardened sandbox (default) rather than a plain
            subprocess with rlimits.
        allow_unsafe_sandbox: accept a sandbox that can only apply rlimits (tier UNSAFE).
    """

    def __init__(
        self,
        sql_deadline_s: float = 2.0,
        python_limits: RunLimits | None = None,
        workspace_root: str | None = None,
        python_sandbox: bool = True,
        allow_unsafe_sandbox: bool = False,
    ) -> None:
        self.sql_deadline_s = sql_deadline_s
        self.templates = TemplateCache()
        self.runner: PythonRunner | SandboxRunner
        if python_sandbox:
            self.runner = SandboxRunner(python_limits, allow_unsafe=allow_unsafe_sandbox)
        else:
            self.runner = PythonRunner(python_limits)
        #: FULL / REDUCED / UNSAFE for the hardened sandbox, BASIC for the plain subprocess runner
        self.sandbox_tier: str = getattr(self.runner, "tier", "BASIC")
        self.workspace_root = workspace_root
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()

    # -- HTTP surface -------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Serve one ``httpx`` request (the ``MockTransport`` handler). Never raises."""
        status, body, headers = self.handle_bytes(request.method, request.url.path, request.read())
        return httpx.Response(status, content=body, headers=headers)

    def handle_bytes(self, method: str, path: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        """Serve one request given as bytes; answer (status, JSON bytes, headers). Never raises."""
        try:
            if len(body) > MAX_REQUEST_BYTES:
                status, reply = _err(413, "too_large", f"request body over {MAX_REQUEST_BYTES} bytes")
            else:
                payload = json.loads(body) if body else {}
                if not isinstance(payload, dict):
                    status, reply = _err(400, "bad_request", "the request body must be a JSON object")
                else:
                    status, reply = self.call(method, path, payload)
        except (ValueError, RecursionError) as exc:
            status, reply = _err(400, "bad_request", f"malformed JSON body: {type(exc).__name__}")
        except Exception as exc:  # a server answers 500, it does not crash
            status, reply = _failure(exc)
        if reply is None:
            return status, b"", {}
        try:
            data = json.dumps(reply, separators=(",", ":")).encode()
        except Exception as exc:  # MemoryError included: the encoding is part of the answer
            del reply
            status, failure = _failure(exc)
            data = json.dumps(failure, separators=(",", ":")).encode()
        return status, data, {"content-type": "application/json"}

    def call(self, method: str, path: str, payload: dict[str, Any]) -> Reply:
        """Route one request already decoded from JSON; answer (status, JSON object or None). Never raises."""
        try:
            return self._route(method, path, payload)
        except Exception as exc:  # MemoryError included: every call gets an answer
            return _failure(exc)

    def _route(self, method: str, path: str, payload: dict[str, Any]) -> Reply:
        parts = [p for p in path.split("/") if p]
        if parts == ["openapi.json"] and method == "GET":
            from simulators.openapi import OPENAPI

            return 200, OPENAPI
        if parts == ["health"] and method == "GET":
            return _okr({"episodes": len(self._episodes), "sandbox_tier": self.sandbox_tier})
        if len(parts) == 3 and parts[:2] == ["v1", "databases"] and method == "PUT":
            return self.put_database(parts[2], payload)
        if parts == ["v1", "episodes"] and method == "POST":
            return self.open_episode(payload)
        if len(parts) == 3 and parts[:2] == ["v1", "episodes"] and method == "DELETE":
            self.close_episode(parts[2])
            return 204, None
        if len(parts) >= 5 and parts[:2] == ["v1", "episodes"] and parts[3] == "files" and method in ("PUT", "GET"):
            rel = "/".join(parts[4:])
            return self.put_file(parts[2], rel, payload) if method == "PUT" else self.get_file(parts[2], rel)
        if len(parts) == 4 and parts[:2] == ["v1", "episodes"] and method == "POST":
            return self.tool(parts[2], parts[3], payload)
        return _err(404, "not_found", f"no route {method} {path[:100]}")

    def tool(self, episode_id: str, tool: str, payload: dict[str, Any]) -> Reply:
        """Carry out one tool call of an open episode."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            return _err(404, "unknown_episode", f"no open episode {episode_id[:64]!r}")
        handler = {"sql": self._sql, "python": self._python, "smtp": self._smtp}.get(tool)
        if handler is None:
            return _err(404, "unknown_tool", f"no tool {tool[:64]!r}; tools are sql, python, smtp")
        with episode.lock:
            try:
                return handler(episode, payload)
            except Exception as exc:  # MemoryError included: every call gets an answer
                return _failure(exc)

    # -- workspace files ----------------------------------------------------------------------

    def put_file(self, episode_id: str, rel: str, payload: dict[str, Any]) -> Reply:
        """Write a file into an episode's workspace (``{"text": ...}`` or ``{"b64": ...}``)."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            return _err(404, "unknown_episode", f"no open episode {episode_id[:64]!r}")
        with episode.lock:
            full = _inside(episode.workspace, rel)
        if full is None:
            return _err(400, "bad_request", f"file {rel[:64]!r} is outside the workspace")
        try:
            if isinstance(payload.get("text"), str):
                data = payload["text"].encode("utf-8")
            elif isinstance(payload.get("b64"), str):
                data = base64.b64decode(payload["b64"], validate=True)
            else:
                return _err(400, "bad_request", "expected {'text': str} or {'b64': str}")
            if len(data) > MAX_FILE_BYTES:
                return _err(413, "too_large", f"file over {MAX_FILE_BYTES} bytes")
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
        except (OSError, ValueError) as exc:
            return _err(400, "bad_request", f"could not write {rel[:64]!r}: {exc}")
        return 204, None

    def get_file(self, episode_id: str, rel: str) -> Reply:
        """Read a workspace file as ``{"b64": ...}`` (at most ``MAX_FILE_BYTES``)."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            return _err(404, "unknown_episode", f"no open episode {episode_id[:64]!r}")
        with episode.lock:
            full = _inside(episode.workspace, rel)
        if full is None:
            return _err(400, "bad_request", f"file {rel[:64]!r} is outside the workspace")
        if not os.path.isfile(full):
            return _err(404, "no_such_file", f"no file {rel[:64]!r} in the workspace")
        if os.path.getsize(full) > MAX_FILE_BYTES:
            return _err(413, "too_large", f"file {rel[:64]!r} is larger than {MAX_FILE_BYTES} bytes")
        with open(full, "rb") as f:
            return _okr({"path": rel, "b64": base64.b64encode(f.read()).decode()})

    # -- episodes -----------------------------------------------------------------------------

    def put_database(self, fingerprint: str, payload: dict[str, Any]) -> Reply:
        tables = payload.get("tables")
        if not isinstance(tables, dict):
            return _err(400, "bad_request", "expected {'tables': {name: {columns, rows}}}")
        try:
            self.templates.put(fingerprint, tables)
        except (ValueError, KeyError, TypeError) as exc:
            return _err(400, "bad_database", str(exc))
        return 204, None

    def open_episode(self, payload: dict[str, Any]) -> Reply:
        episode_id = payload.get("episode_id")
        if not isinstance(episode_id, str) or not _EPISODE_ID.fullmatch(episode_id):
            return _err(400, "bad_request", "episode_id must match [A-Za-z0-9_.-]{1,64}")
        seed = payload.get("seed")
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**64):
            # A server-side fault profile draws from it: refuse it here, not with a 500 there.
            return _err(400, "bad_request", f"seed must be an integer in [0, 2**64) or null, got {str(seed)[:40]!r}")
        files = payload.get("files") or {}
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return _err(400, "bad_request", "files must be an object of {relative path: text}")
        fingerprint = payload.get("database")
        database = None
        if fingerprint is not None:
            image = self.templates.get(str(fingerprint))
            if image is None:
                return _err(409, "unknown_database", f"no template database {str(fingerprint)[:64]!r}; PUT it first")
            database = ReadOnlyDatabase(image, deadline_s=self.sql_deadline_s)
        for rel in files:
            norm = os.path.normpath(rel) if rel and "\x00" not in rel and len(rel) <= 255 else ""
            if not norm or norm.startswith("..") or os.path.isabs(norm) or norm.startswith("results" + os.sep):
                if database is not None:
                    database.close()
                return _err(400, "bad_request", f"could not set up the workspace: file {rel[:64]!r} is outside the workspace")
        sender = str(payload.get("sender") or "agent@agentrl.example")
        domains = payload.get("mail_domains")
        if domains is not None and not (isinstance(domains, list) and all(isinstance(d, str) and d for d in domains)):
            if database is not None:
                database.close()
            return _err(400, "bad_request", "mail_domains must be a list of domain names or null")
        allowed = tuple(d.lower() for d in domains) if domains is not None else None
        with self._lock:
            self.close_episode(episode_id)
            mailbox = Mailbox(sender, "msg", allowed_domains=allowed)
            self._episodes[episode_id] = _Episode(self.workspace_root, dict(files), database, mailbox)
        return _okr({"episode_id": episode_id}, status=201)

    def close_episode(self, episode_id: str) -> None:
        """Drop an episode's database, workspace and mailbox (no error if it is not open)."""
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            return
        episode.discard()

    def close(self) -> None:
        for episode_id in list(self._episodes):
            self.close_episode(episode_id)
        self.runner.close()

    # -- tools --------------------------------------------------------------------------------

    def _sql(self, episode: _Episode, payload: dict[str, Any]) -> Reply:
        if episode.database is None:
            return _err(404, "no_database", "this episode has no database")
        query = payload.get("query")
        if not isinstance(query, str):
            return _err(422, "bad_arguments", "'query' must be a string")
        try:
            result = episode.database.query(query)
        except SQLError as exc:
            return _err(_SQL_STATUS.get(exc.kind, 400), exc.kind, exc.message)
        episode.queries += 1
        csv_path = f"results/q{episode.queries}.csv"
        episode.pending[csv_path] = result.csv_text
        episode.pending_bytes += len(result.csv_text)
        if episode.pending_bytes > MAX_PENDING_BYTES:
            episode.workspace  # noqa: B018 (writes the pending results out)
        reply: dict[str, Any] = {
            "columns": result.columns,
            "rows": [list(r) for r in result.rows],
            "row_count": len(result.rows),
            "truncated": result.truncated,
            "csv_path": csv_path,
            "vm_steps": result.vm_steps,
        }
        if result.truncated_by is not None:
            reply["truncated_by"] = result.truncated_by
        return _okr(reply)

    def workspace_of(self, episode_id: str) -> str | None:
        """The directory of an open episode's workspace (created if needed), for tests and tools."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            return None
        with episode.lock:
            return episode.workspace

    def _python(self, episode: _Episode, payload: dict[str, Any]) -> Reply:
        code = payload.get("code")
        if not isinstance(code, str):
            return _err(422, "bad_arguments", "'code' must be a string")
        if len(code) > 100_000:
            return _err(413, "too_large", f"code is {len(code)} characters; the limit is 100000")
        if "\x00" in code:
            return _err(400, "bad_request", "code contains a NUL character")
        result = self.runner.run(code, episode.workspace)
        return _okr(
            {
                "exit_code": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "timed_out": result.timed_out,
                "output_truncated": result.output_truncated,
                "sandbox_tier": self.sandbox_tier,
            }
        )

    def _smtp(self, episode: _Episode, payload: dict[str, Any]) -> Reply:
        unknown = set(payload) - {"to", "subject", "body", "cc", "attachments"}
        if unknown:
            return _err(422, "bad_arguments", f"unknown fields {sorted(unknown)}")
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
            return _err(422, exc.kind, exc.message, smtp_code=exc.code)
        return _okr(delivery.as_dict())


def _okr(result: dict[str, Any], status: int = 200) -> Reply:
    return status, {"ok": True, "result": result}


def _err(status: int, kind: str, message: str, **extra: Any) -> Reply:
    return status, {"ok": False, "error": {"type": kind, "message": message, **extra}}


def _failure(exc: Exception) -> Reply:
    """The answer to a call that raised: 507 when memory ran out (the call asked for too much),
    else 500 (a bug or a broken service)."""
    if isinstance(exc, MemoryError):
        return _err(507, "out_of_memory", "the service ran out of memory on this call; ask for less data (LIMIT, fewer columns)")
    return _err(500, "internal", f"{type(exc).__name__}: {str(exc)[:300]}")


def _inside(workspace: str, rel: str) -> str | None:
    """The absolute path of ``rel`` if it stays inside ``workspace`` (symlinks resolved), else None."""
    if not rel or "\x00" in rel or len(rel) > 255:
        return None
    root = os.path.realpath(workspace)
    full = os.path.realpath(os.path.join(root, rel))
    return full if full.startswith(root + os.sep) else None
