"""The simulator's REST API, served in process (``httpx.MockTransport``) or over HTTP.

Routes (JSON bodies; every error is ``{"ok": false, "error": {"type", "message"}}``; the full
OpenAPI document is served at ``GET /openapi.json``)::

    GET    /openapi.json                                  the OpenAPI 3.1 document
    GET    /health                                        {"ok": true, "result": {"episodes": n}}
    PUT    /v1/databases/{fingerprint}                    {"tables": {...}}: store a template database
    POST   /v1/episodes                                   {"episode_id", "database", "files", "sender"}
                                                          -> {"episode_id", "episode_token"}
    DELETE /v1/episodes/{episode_id}
    POST   /v1/episodes/{episode_id}/{tool}               one tool call (the tools of simulators.tools):
                                                          sql {"query"}, python {"code"},
                                                          smtp {"to", "subject", "body", "cc"?, "attachments"?},
                                                          http {"method", "path", "body"?, "query"?}
    PUT    /v1/episodes/{episode_id}/files/{path}         {"text"} or {"b64"}: write a workspace file
    GET    /v1/episodes/{episode_id}/files/{path}         {"ok": true, "result": {"path", "b64"}}

:class:`SimulatorApp` has the same operations as Python methods (``open_episode``, ``tool``, ...)
for callers that skip the wire, and :meth:`SimulatorApp.handle` / :meth:`handle_bytes` for those
that speak it.

Template databases are content-addressed: ``{fingerprint}`` is ``<label>-<digest>``, where the
digest is the start (16 hex digits or more) of the SHA-256 of ``json.dumps(tables, sort_keys=True)``
(:func:`template_fingerprint`); an upload whose tables hash to another digest is refused (422), so
no client can change the data stored under a fingerprint another client uses.

Episodes are owned: opening one answers an ``episode_token``, and every later call on the wire for
that episode (tool calls, files, DELETE, and a POST that would replace it) must carry it in the
``X-AgentRL-Episode-Token`` header, or is refused with 403. The Python methods are the trusted
in-process surface and take no token.

Open episodes may be capped (``max_episodes``: one more answers 503 ``too_many_episodes``) and
closed when idle (``episode_idle_s``: then a call on one answers 404 ``unknown_episode``, saying
why); both are off in process and set by ``agentrl-envs serve`` (:mod:`simulators.episode_table`).
"""

# Why the routes are split by hand (match_route) and served by a plain ASGI callable, not by
# Starlette. Measured with `nice -n 19 .venv/bin/python benchmarks/bench_router.py` on
# the project's shared 2-core machine (load average ~10; ratios from one run are what counts): on the
# same routes and handlers, Starlette 1.10 with Request/Response endpoints serves 0.78x the requests
# per core in process and 0.76x over uvicorn (+45 us of CPU a request; a SQL point lookup 153 -> 197
# us), and its declared routes with raw ASGI endpoints (matching only) 0.93x and 0.95x (+12.5 us).
# Every env step of the default `sim` backend goes through this router synchronously (handle_bytes),
# and a point lookup through the whole env is at +0.27 ms of its +0.3 ms budget (docs/results/performance.md,
# "The simulator's router"); Starlette's router is async only, and matching alone would replace only the few
# lines of match_route. The tool routes are declared per simulator folder (simulators/tools.py) and
# their OpenAPI entries are built from those declarations (simulators/openapi.py).

from __future__ import annotations

import array
import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from simulators.episode_table import EpisodeTable
from simulators.memory import CloseCounter, release_memory
from simulators.python import PythonRunner, RunLimits
from simulators.python.sandbox.shared import SharedSandbox
from simulators.routes import Reply
from simulators.routes import err as _err
from simulators.routes import ok as _okr
from simulators.smtp import Mailbox
from simulators.sql import ReadOnlyDatabase, TemplateCache
from simulators.sql.route import MAX_PENDING_BYTES as MAX_PENDING_BYTES  # re-exported
from simulators.tools import TOOL_ROUTES
from simulators.workspace import RESULTS, WorkspaceError, write_files
from simulators.workspace import create as create_workspace

MAX_REQUEST_BYTES = 8 << 20
#: Default largest template upload (``PUT /v1/databases/...``); a setting: ``SimulatorApp(max_upload_bytes=...)``,
#: ``agentrl-envs serve --max-upload-mb``.
MAX_UPLOAD_BYTES = 1 << 30
MAX_FILE_BYTES = 2 << 20
EPISODE_TOKEN_HEADER = "X-AgentRL-Episode-Token"

_EPISODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: What an episode id may be (clients check it before their first request).
EPISODE_ID = _EPISODE_ID
_FINGERPRINT = re.compile(r"^(?:[A-Za-z0-9_.-]{0,100}-)?([0-9a-f]{16,64})$")


class PendingResults:
    """The query results (``results/qN.csv``) of one episode not written to its workspace yet.

    They are kept in one growing buffer with an array of (N, end offset) pairs, not as a bytes
    object and a path per result in a dict: a server holds thousands of episodes with hundreds of
    small results each, and small objects live in CPython's 1 MiB allocator arenas, which go back
    to the system only when every object in them is freed (after closing every episode, a server
    process's residue above its start-up size is such arenas, pinned by a few long-lived objects
    such as its connections). 400 results took 802 small-object blocks as a dict, under 50 this way
    (``tests/simulators/test_serve_scale.py``); a buffer past 512 bytes lives in ``malloc``'d
    memory, which :func:`simulators.memory.release_memory` returns.
    """

    __slots__ = ("_data", "_index")

    def __init__(self) -> None:
        self._data = bytearray()
        self._index = array.array("Q")  # N, end offset, N, end offset, ...

    def add(self, number: int, data: bytes) -> None:
        """Keep the CSV of query ``number`` (its file is ``results/q{number}.csv``)."""
        self._data += data
        self._index.extend((number, len(self._data)))

    def __len__(self) -> int:
        return len(self._index) // 2

    @property
    def nbytes(self) -> int:
        """Bytes of CSV held."""
        return len(self._data)

    def take(self) -> dict[str, bytes]:
        """The results as ``{"results/qN.csv": bytes}``, forgotten here."""
        files, start, data, index = {}, 0, self._data, self._index
        for i in range(0, len(index), 2):
            files[f"{RESULTS}/q{index[i]}.csv"] = bytes(data[start : index[i + 1]])
            start = index[i + 1]
        self.clear()
        return files

    def clear(self) -> None:
        """Drop every result (and the buffers' memory)."""
        self._data = bytearray()
        self._index = array.array("Q")


@dataclass(slots=True)
class _Episode:
    """One open episode. Its workspace directory is created on first use (a Python run, a mail
    attachment, a file read or write): an episode that only queries never touches the disk.

    A server holds thousands of these, so each one is kept to a few objects the cycle collector
    tracks: slots, no mailbox until the first mail, query results held as bytes (not tracked).
    """

    root: str | None
    files: dict[str, str]
    database: ReadOnlyDatabase | None
    sender: str
    allowed_domains: tuple[str, ...] | None
    queries: int = 0
    # The owner's secret: returned by open_episode, required on the wire for every later call.
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    # One call at a time per episode: its SQLite connection and mailbox are not thread-safe, and
    # an HTTP client may send concurrent calls for the same episode.
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Query results (CSV as UTF-8 bytes) not yet written to the workspace (see ``workspace``).
    pending: PendingResults = field(default_factory=lambda: PendingResults())
    # State a tool's route keeps for the episode, by tool (the http tool's company service); made on first use.
    services: dict[str, Any] | None = None
    # Set (under ``lock``) when the episode is closed: a call that was waiting for the lock answers 409.
    closed: bool = False
    _path: str | None = None
    _mailbox: Mailbox | None = None

    @property
    def mailbox(self) -> Mailbox:
        """The episode's mail record, made on the first mail."""
        if self._mailbox is None:
            self._mailbox = Mailbox(self.sender, "msg", allowed_domains=self.allowed_domains)
        return self._mailbox

    @property
    def workspace(self) -> str:
        """The workspace directory, created with the setup files and every query result so far.

        Raises:
            WorkspaceError: a query result could not be saved (the agent broke or filled its
                workspace); the results not saved are dropped, so the next call can go ahead.
        """
        if self._path is None:
            self._path = create_workspace(self.root, self.files)
        if self.pending:
            write_files(self._path, self.pending.take())
        return self._path

    @property
    def pending_bytes(self) -> int:
        """Bytes of query results held in memory, not yet in the workspace."""
        return self.pending.nbytes

    def discard(self) -> None:
        """Drop the database, workspace and mail (the caller holds ``lock``); later calls answer 409."""
        self.closed = True
        if self.database is not None:
            self.database.close()
            self.database = None
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None
        self.pending.clear()
        self.services = None


class SimulatorApp:
    """In-memory simulator of the SQL, Python, SMTP and company REST (``http``) services.

    Args:
        sql_deadline_s: statement deadline of the SQL service.
        python_limits: resource limits of the Python service.
        workspace_root: where episode workspaces are created (default: the system temp dir).
        python_sandbox: run programs in the hardened sandbox (default) rather than a plain
            subprocess with rlimits.
        allow_unsafe_sandbox: accept a sandbox that can only apply rlimits (tier UNSAFE).
        lazy_python: start the Python runner (the sandbox service lease) at the first Python run,
            or the first look at :attr:`sandbox_tier` / :attr:`numpy_available`, instead of now.
            Envs without the ``python`` tool use it: they never start a sandbox, and work where
            the sandbox would refuse to start.
        max_upload_bytes: the largest template database upload (its JSON body) accepted; other
            requests stay within ``MAX_REQUEST_BYTES``.
        max_episodes: the most episodes open at once; opening one more answers 503
            ``too_many_episodes`` (None: no cap, the default in process; ``agentrl-envs serve`` sets one).
        episode_idle_s: an episode without a call for this long is closed, as if its client had
            (None: never, the default in process; ``agentrl-envs serve`` sets one).
        clock: the clock of ``episode_idle_s`` (tests pass one they move).
    """

    def __init__(
        self,
        sql_deadline_s: float = 2.0,
        python_limits: RunLimits | None = None,
        workspace_root: str | None = None,
        python_sandbox: bool = True,
        allow_unsafe_sandbox: bool = False,
        max_upload_bytes: int = MAX_UPLOAD_BYTES,
        lazy_python: bool = False,
        max_episodes: int | None = None,
        episode_idle_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(max_upload_bytes, int) or isinstance(max_upload_bytes, bool) or max_upload_bytes < 1:
            raise ValueError(f"max_upload_bytes={max_upload_bytes!r}: use a positive number of bytes")
        self.sql_deadline_s = sql_deadline_s
        self.max_upload_bytes = max_upload_bytes
        self.templates = TemplateCache()
        self._python_limits = python_limits
        self._python_sandbox = bool(python_sandbox)
        self._allow_unsafe_sandbox = bool(allow_unsafe_sandbox)
        self._runner: PythonRunner | SharedSandbox | None = None
        self._runner_lock = threading.Lock()
        self._runner_closed = False
        self.workspace_root = workspace_root
        self._episodes: EpisodeTable[_Episode] = EpisodeTable(max_episodes, episode_idle_s, clock)
        #: called with the id of each episode closed for being idle (the server forgets its fault state)
        self.on_expire: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        self._closes = CloseCounter()
        if not lazy_python:
            self._start_runner()

    @property
    def runner(self) -> PythonRunner | SharedSandbox:
        """What runs Python programs: a lease on the sandbox service, or the plain subprocess runner.
        Started here if it was not yet (``lazy_python``)."""
        runner = self._runner
        return runner if runner is not None else self._start_runner()

    @runner.setter
    def runner(self, runner: PythonRunner | SharedSandbox) -> None:
        """Swap in another runner (tests, custom runners); the caller closes the old one."""
        with self._runner_lock:
            self._runner = runner

    @property
    def python_started(self) -> bool:
        """Whether the Python runner exists (always, unless ``lazy_python`` and no Python ran yet)."""
        return self._runner is not None

    @property
    def sandbox_tier(self) -> str:
        """FULL / REDUCED / UNSAFE for the hardened sandbox, BASIC for the plain subprocess runner."""
        return str(getattr(self.runner, "tier", "BASIC"))

    @property
    def numpy_available(self) -> bool:
        """Whether agent programs can import numpy (the plain runner's ``python -I -S`` cannot)."""
        return bool(getattr(self.runner, "numpy_available", False))

    def _start_runner(self) -> PythonRunner | SharedSandbox:
        with self._runner_lock:
            if self._runner is None:
                if self._runner_closed:
                    raise RuntimeError("this simulator is closed: it starts no Python runner")
                if self._python_sandbox:  # a lease on the one sandbox service of the machine (or process: SharedSandbox scope)
                    self._runner = SharedSandbox(self._python_limits, allow_unsafe=self._allow_unsafe_sandbox)
                else:
                    self._runner = PythonRunner(self._python_limits)
            return self._runner

    # -- HTTP surface -------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Serve one ``httpx`` request (the ``MockTransport`` handler). Never raises."""
        token = request.headers.get(EPISODE_TOKEN_HEADER)
        status, body, headers = self.handle_bytes(request.method, request.url.path, request.read(), token)
        return httpx.Response(status, content=body, headers=headers)

    def handle_bytes(
        self, method: str, path: str, body: bytes | bytearray, episode_token: str | None = None
    ) -> tuple[int, bytes, dict[str, str]]:
        """Serve one request given as bytes; answer (status, JSON bytes, headers). Never raises.

        ``episode_token`` is the ``X-AgentRL-Episode-Token`` header (None when absent).
        """
        try:
            limit = self.body_limit(method, path)
            if len(body) > limit:
                status, reply = self.too_large(method, path, limit)
            else:
                payload = json.loads(body) if body else {}
                if not isinstance(payload, dict):
                    status, reply = _err(400, "bad_request", "the request body must be a JSON object")
                else:
                    status, reply = self.call(method, path, payload, episode_token)
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

    def body_limit(self, method: str, path: str) -> int:
        """The largest body accepted for ``method path``: ``max_upload_bytes`` for a template upload."""
        if method == "PUT" and path.startswith("/v1/databases/"):
            return self.max_upload_bytes
        return MAX_REQUEST_BYTES

    def too_large(self, method: str, path: str, limit: int) -> Reply:
        """The 413 answer to a body over :meth:`body_limit`, naming the setting that raises it."""
        if limit == self.max_upload_bytes and method == "PUT" and path.startswith("/v1/databases/"):
            return _err(
                413,
                "too_large",
                f"template upload over {limit:,} bytes of JSON; start the server with a larger "
                "--max-upload-mb (SimulatorApp(max_upload_bytes=...)) or use a smaller database",
                limit_bytes=limit,
            )
        return _err(413, "too_large", f"request body over {limit} bytes", limit_bytes=limit)

    def call(self, method: str, path: str, payload: dict[str, Any], episode_token: str | None = None) -> Reply:
        """Route one request already decoded from JSON; answer (status, JSON object or None). Never raises.

        Calls on an open episode need ``episode_token``, the token its ``open_episode`` answered.
        """
        try:
            return self._route(method, path, payload, episode_token)
        except Exception as exc:  # MemoryError included: every call gets an answer
            return _failure(exc)

    def _route(self, method: str, path: str, payload: dict[str, Any], episode_token: str | None = None) -> Reply:
        name, args = match_route(method, path)
        self.expire_idle()
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[:2] == ["v1", "episodes"]:
            # Answered here, not by the handler, when the episode is not open: a call that passed
            # the check must not land in an episode someone opens under that id a moment later.
            if parts[2] not in self._episodes:
                if name == "close_episode":
                    return 204, None
                return self._unknown(parts[2])
            denied = self.check_owner(parts[2], episode_token)
            if denied is not None:
                return denied
        if name == "openapi":
            from simulators.openapi import OPENAPI

            return 200, OPENAPI
        if name == "health":
            return _okr({"episodes": len(self._episodes), "sandbox_tier": self.sandbox_tier, "numpy": self.numpy_available})
        if name == "put_database":
            return self.put_database(args[0], payload)
        if name == "open_episode":
            return self.open_episode(payload, episode_token)
        if name == "close_episode":
            self.close_episode(args[0])
            return 204, None
        if name == "put_file":
            return self.put_file(args[0], args[1], payload)
        if name == "get_file":
            return self.get_file(args[0], args[1])
        if name == "tool":
            return self.tool(args[0], args[1], payload)
        return _err(404, "not_found", f"no route {method} {path[:100]}")

    def check_owner(self, episode_id: str, token: str | None) -> Reply | None:
        """None if ``token`` is the owner's token of episode ``episode_id`` (or no such episode is
        open); else the 403 answer."""
        episode = self._episodes.get(episode_id)
        if episode is None or (token is not None and hmac.compare_digest(token.encode(), episode.token.encode())):
            return None
        return _err(
            403,
            "forbidden",
            f"episode {episode_id[:64]!r} belongs to the client that opened it: send the episode_token its "
            f"POST /v1/episodes answered in the {EPISODE_TOKEN_HEADER} header, or open an episode of your own",
        )

    def tool(self, episode_id: str, tool: str, payload: dict[str, Any]) -> Reply:
        """Carry out one tool call of an open episode."""
        episode = self._episodes.touch(episode_id)
        if episode is None:
            return self._unknown(episode_id)
        route = TOOL_ROUTES.get(tool)
        if route is None:
            return _err(404, "unknown_tool", f"no tool {tool[:64]!r}; tools are {', '.join(TOOL_ROUTES)}")
        with episode.lock:
            if episode.closed:
                return _closed(episode_id)
            try:
                return route.handler(self, episode, payload)
            except WorkspaceError as exc:  # the agent broke its own workspace: its error, not the service's
                return _err(409, "workspace", str(exc))
            except Exception as exc:  # MemoryError included: every call gets an answer
                return _failure(exc)

    # -- workspace files ----------------------------------------------------------------------

    def put_file(self, episode_id: str, rel: str, payload: dict[str, Any]) -> Reply:
        """Write a file into an episode's workspace (``{"text": ...}`` or ``{"b64": ...}``)."""
        episode = self._episodes.touch(episode_id)
        if episode is None:
            return self._unknown(episode_id)
        # A query result of a mounted SQL backend: written like the simulator's own, results/ repaired.
        result_name = os.path.normpath(rel) if rel and "\x00" not in rel and len(rel) <= 255 else ""
        is_result = os.path.dirname(result_name) == RESULTS
        try:
            if isinstance(payload.get("text"), str):
                data = payload["text"].encode("utf-8")
            elif isinstance(payload.get("b64"), str):
                data = base64.b64decode(payload["b64"], validate=True)
            else:
                return _err(400, "bad_request", "expected {'text': str} or {'b64': str}")
        except ValueError as exc:
            return _err(400, "bad_request", f"could not write {rel[:64]!r}: {exc}")
        if len(data) > MAX_FILE_BYTES:
            return _err(413, "too_large", f"file over {MAX_FILE_BYTES} bytes")
        # Under the episode's lock to the end: a close waits for the write, so it never lands in a
        # workspace already removed (which would make its folders again, and leak them).
        with episode.lock:
            if episode.closed:
                return _closed(episode_id)
            try:
                full = _inside(episode.workspace, rel)
                if full is None and not is_result:
                    return _err(400, "bad_request", f"file {rel[:64]!r} is outside the workspace")
                if is_result:
                    write_files(episode.workspace, {result_name: data})
                    return 204, None
                assert full is not None
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.write(data)
            except WorkspaceError as exc:
                return _err(409, "workspace", str(exc))
            except (OSError, ValueError) as exc:
                detail = exc.strerror if isinstance(exc, OSError) else exc
                return _err(400, "bad_request", f"could not write {rel[:64]!r}: {detail}")
        return 204, None

    def get_file(self, episode_id: str, rel: str) -> Reply:
        """Read a workspace file as ``{"b64": ...}`` (at most ``MAX_FILE_BYTES``)."""
        episode = self._episodes.touch(episode_id)
        if episode is None:
            return self._unknown(episode_id)
        try:
            with episode.lock:
                if episode.closed:  # its workspace is gone: asking for it would make it again
                    return _closed(episode_id)
                full = _inside(episode.workspace, rel)
        except WorkspaceError as exc:
            return _err(409, "workspace", str(exc))
        if full is None:
            return _err(400, "bad_request", f"file {rel[:64]!r} is outside the workspace")
        if not os.path.isfile(full):
            return _err(404, "no_such_file", f"no file {rel[:64]!r} in the workspace")
        if os.path.getsize(full) > MAX_FILE_BYTES:
            return _err(413, "too_large", f"file {rel[:64]!r} is larger than {MAX_FILE_BYTES} bytes")
        try:
            with open(full, "rb") as f:
                return _okr({"path": rel, "b64": base64.b64encode(f.read()).decode()})
        except OSError as exc:
            return _err(409, "workspace", f"file {rel[:64]!r} could not be read ({exc.strerror})")

    # -- episodes -----------------------------------------------------------------------------

    def put_database(self, fingerprint: str, payload: dict[str, Any]) -> Reply:
        """Store a template database under its content fingerprint (see the module docstring)."""
        tables = payload.get("tables")
        if not isinstance(tables, dict):
            return _err(400, "bad_request", "expected {'tables': {name: {columns, rows}}}")
        match = _FINGERPRINT.fullmatch(fingerprint)
        try:
            digest = content_digest(tables)
        except (TypeError, ValueError) as exc:
            return _err(400, "bad_database", f"the tables are not plain JSON: {exc}")
        if match is None or not digest.startswith(match.group(1)):
            return _err(
                422,
                "fingerprint_mismatch",
                f"template databases are content-addressed: these tables belong at /v1/databases/<label>-{digest[:16]}, "
                f"not {fingerprint[:100]!r} (the digest is the SHA-256 of json.dumps(tables, sort_keys=True))",
            )
        try:
            self.templates.put(fingerprint, tables, digest=digest)
        except (ValueError, KeyError, TypeError) as exc:
            return _err(400, "bad_database", str(exc))
        return 204, None

    def open_episode(self, payload: dict[str, Any], token: str | None = None) -> Reply:
        """Open an episode (replacing an open one of that id needs its owner's ``token``); answer
        its ``episode_id`` and ``episode_token``."""
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
        problem = _layout_problem(files)
        if problem is not None:
            return _err(400, "bad_request", f"could not set up the workspace: files: {problem}")
        fingerprint = payload.get("database")
        if fingerprint is not None and not isinstance(fingerprint, str):
            return _err(
                400,
                "bad_request",
                f"database must be a template fingerprint (a string) or null, got {type(fingerprint).__name__}",
            )
        sender = payload.get("sender")
        if sender is not None and not (isinstance(sender, str) and len(sender) <= 320):
            return _err(400, "bad_request", "sender must be an email address (a string of at most 320 characters) or null")
        if episode_id not in self._episodes and self._episodes.full():
            self.expire_idle()  # outside self._lock: closing waits for calls in flight
            if self._episodes.full():  # checked again under the lock below (a race may fill it meanwhile)
                return self._too_many()
        database = None
        if fingerprint is not None:
            image = self.templates.get(fingerprint)
            if image is None:
                return _err(409, "unknown_database", f"no template database {fingerprint[:64]!r}; PUT it first")
            database = ReadOnlyDatabase(image, deadline_s=self.sql_deadline_s)
        sender = sender or "agent@agentrl.example"
        domains = payload.get("mail_domains")
        if domains is not None and not (isinstance(domains, list) and all(isinstance(d, str) and d for d in domains)):
            if database is not None:
                database.close()
            return _err(400, "bad_request", "mail_domains must be a list of domain names or null")
        allowed = tuple(d.lower() for d in domains) if domains is not None else None
        with self._lock:
            denied = self.check_owner(episode_id, token)
            if denied is not None:
                if database is not None:
                    database.close()
                return denied
            if episode_id not in self._episodes and self._episodes.full():
                if database is not None:
                    database.close()
                return self._too_many()
            replaced = self._episodes.pop(episode_id)
            episode = _Episode(self.workspace_root, dict(files), database, sender, allowed)
            self._episodes.put(episode_id, episode)
        if replaced is not None:  # outside self._lock: this waits for a call in flight on it
            self._retire(replaced)
        return _okr({"episode_id": episode_id, "episode_token": episode.token}, status=201)

    def close_episode(self, episode_id: str) -> None:
        """Drop an episode's database, workspace and mailbox (no error if it is not open).

        A call on the episode in flight finishes first (this waits for it); calls that were waiting
        behind it answer 409 ``episode_closed``, so nothing makes the workspace again after it is removed.
        """
        episode = self._episodes.pop(episode_id)
        if episode is not None:
            self._retire(episode)

    def set_episode_limits(self, max_episodes: int | None, episode_idle_s: float | None) -> None:
        """Set ``max_episodes`` and ``episode_idle_s`` (see the class) on a running simulator.

        Raises:
            ValueError: a limit is not a positive number (or None), naming the value to use.
        """
        self._episodes.set_limits(max_episodes, episode_idle_s)

    def expire_idle(self) -> int:
        """Close the episodes idle for ``episode_idle_s`` (every request does this); answer how many.

        O(1) when none is due (the least recently used episode is looked at, see
        :class:`~simulators.episode_table.EpisodeTable`); one with a call in flight is left open.
        """
        expired = self._episodes.expire(busy=lambda episode: episode.lock.locked())
        for episode_id, episode in expired:
            self._retire(episode)
            if self.on_expire is not None:
                self.on_expire(episode_id)
        return len(expired)

    def _unknown(self, episode_id: str) -> Reply:
        idle_s = self._episodes.idle_s
        hint = "" if idle_s is None else f" (episodes idle for {idle_s:g} s are closed: open a new one)"
        return _err(404, "unknown_episode", f"no open episode {episode_id[:64]!r}{hint}")

    def _too_many(self) -> Reply:
        cap = self._episodes.max_open
        return _err(
            503,
            "too_many_episodes",
            f"this server holds its limit of {cap} open episodes: close the episodes you are done with "
            f"(DELETE /v1/episodes/{{id}}, env.close()), wait for idle ones to expire, or start the server with a "
            "larger --max-episodes",
            max_episodes=cap,
        )

    def _retire(self, episode: _Episode) -> None:
        """Discard an episode no longer in ``_episodes``, once no call is using it."""
        with episode.lock:
            episode.discard()
        del episode
        if self._closes.closed(len(self._episodes)):
            release_memory()

    def close(self) -> None:
        for episode_id in self._episodes.ids():
            self.close_episode(episode_id)
        with self._runner_lock:
            runner, self._runner_closed = self._runner, True
        if runner is not None:
            runner.close()

    def workspace_of(self, episode_id: str) -> str | None:
        """The directory of an open episode's workspace (created if needed), for tests and tools."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            return None
        with episode.lock:
            return None if episode.closed else episode.workspace


def match_route(method: str, path: str) -> tuple[str, tuple[str, ...]]:
    """The route a request goes to and its path parameters; ``("not_found", ())`` for none.

    Names: ``openapi``, ``health``, ``put_database`` (fingerprint), ``open_episode``,
    ``close_episode`` (episode_id), ``put_file`` / ``get_file`` (episode_id, path) and ``tool``
    (episode_id, tool; the tool may be one the simulator does not have, answered 404). The server
    (:mod:`agentrl_envs.server.simulator`) routes by this function too, so the API is parsed in one place.
    """
    parts = [p for p in path.split("/") if p]
    if parts == ["openapi.json"] and method == "GET":
        return "openapi", ()
    if parts == ["health"] and method == "GET":
        return "health", ()
    if len(parts) == 3 and parts[:2] == ["v1", "databases"] and method == "PUT":
        return "put_database", (parts[2],)
    if parts == ["v1", "episodes"] and method == "POST":
        return "open_episode", ()
    if len(parts) == 3 and parts[:2] == ["v1", "episodes"] and method == "DELETE":
        return "close_episode", (parts[2],)
    if len(parts) >= 5 and parts[:2] == ["v1", "episodes"] and parts[3] == "files" and method in ("PUT", "GET"):
        return ("put_file" if method == "PUT" else "get_file"), (parts[2], "/".join(parts[4:]))
    if len(parts) == 4 and parts[:2] == ["v1", "episodes"] and method == "POST":
        return "tool", (parts[2], parts[3])
    return "not_found", ()


def content_digest(tables: dict[str, Any]) -> str:
    """SHA-256 (hex) of a template's tables in canonical JSON: the content part of its fingerprint."""
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def template_fingerprint(label: str, tables: dict[str, Any]) -> str:
    """The fingerprint the server accepts for ``tables``: ``<label>-<first 16 hex digits of the digest>``."""
    return f"{label}-{content_digest(tables)[:16]}"


def _closed(episode_id: str) -> Reply:
    return _err(409, "episode_closed", f"episode {episode_id[:64]!r} was closed while this call waited for it")


def _failure(exc: Exception) -> Reply:
    """The answer to a call that raised: 507 when memory ran out (the call asked for too much),
    else 500 (a bug or a broken service)."""
    if isinstance(exc, MemoryError):
        return _err(507, "out_of_memory", "the service ran out of memory on this call; ask for less data (LIMIT, fewer columns)")
    detail = exc.strerror if isinstance(exc, OSError) else str(exc)[:300]  # an OSError's text names host paths
    return _err(500, "internal", f"{type(exc).__name__}: {detail}")


def _layout_problem(files: dict[str, str]) -> str | None:
    """Why the setup ``files`` cannot be laid out in a fresh workspace (None when they can): a path
    outside it, empty, too long, naming a folder or ``results/`` (the sql tool's), two names for one
    file, or a file that another one needs as its folder. Checked when the episode opens, because the
    workspace is made later, on first use, where a failure would be the service's 500."""
    seen: dict[str, str] = {}
    for rel in files:
        shown = repr(rel[:64])
        if not rel or "\x00" in rel:
            return f"file {shown} is outside the workspace (give a relative path such as data/notes.txt)"
        if len(rel) > 255:
            return f"file {shown}... has a path of {len(rel)} characters; the limit is 255"
        norm = os.path.normpath(rel)
        if norm.startswith("..") or os.path.isabs(norm):
            return f"file {shown} is outside the workspace (give a relative path such as data/notes.txt)"
        if rel.endswith(("/", os.sep)) or norm == ".":
            return f"file {shown} names a folder, not a file"
        if norm == RESULTS or norm.startswith(RESULTS + os.sep):
            return f"file {shown} is in {RESULTS}/, which the sql tool keeps for its query results"
        if norm in seen:
            return f"files {seen[norm][:64]!r} and {shown} are the same file"
        seen[norm] = rel
    for norm, rel in seen.items():
        parent = os.path.dirname(norm)
        while parent:
            if parent in seen:
                return f"file {seen[parent][:64]!r} is also the folder of file {rel[:64]!r}"
            parent = os.path.dirname(parent)
    return None


def _inside(workspace: str, rel: str) -> str | None:
    """The absolute path of ``rel`` if it stays inside ``workspace`` (symlinks resolved), else None."""
    if not rel or "\x00" in rel or len(rel) > 255:
        return None
    root = os.path.realpath(workspace)
    full = os.path.realpath(os.path.join(root, rel))
    return full if full.startswith(root + os.sep) else None
