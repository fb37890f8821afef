"""One sandbox service per user and machine, shared by every process of that user.

A :class:`~simulators.python.sandbox.shared.SharedSandbox` with ``scope="process"`` gives one
service per process; an async vector env has a process per sub-env, so 16 workers started 16
services (96 processes, ~690 MiB). A :class:`ServiceLease` (behind ``scope="machine"``, which the
default ``"auto"`` picks in a multiprocessing child) instead talks to one service process per user,
machine and settings, which every process of that user reaches at a well-known Unix socket:

    lease (any process) ──AF_UNIX──> service (python, one per settings)
                                      └─ SandboxRunner: zygote + one warm slot per core

- Address: ``<dir>/svc-<key>.sock``, ``<dir>`` being ``$AGENTRL_SANDBOX_DIR`` (refused when another
  user owns it or others may enter it), else ``$XDG_RUNTIME_DIR/agentrl-sandbox``, else
  ``<tmp>/agentrl-sandbox-<uid>``, created 0700. A well-known path someone else made first (another
  user's, a symlink, open to others) is never used and never an error: a private
  ``<tmp>/agentrl-sandbox-svc-<uid>-XXXXXXXX`` (mkdtemp) takes its place, with a warning. The key covers the settings, the interpreter and
  the package's location, so two checkouts or venvs never share a service.
- Start: the first lease that finds no service starts one under ``flock(<dir>/svc-<key>.lock)``
  (concurrent starters wait, then connect) and waits for it to say it is ready or why it is not.
  The service detaches (its own session, not a child of the starter) and logs to ``svc-<key>.log``.
- Peers: the service answers only processes of its own uid and pid namespace (``SO_PEERCRED``): a
  sandboxed run (its own pid namespace, no ``socket()``) or another user is refused before a byte is read.
- A run: the request frame holds the code, the workspace path and the limits, with an open
  descriptor of the workspace (``SCM_RIGHTS``), which must be the directory the path names in the
  service's view; the service runs it with :meth:`SandboxRunner.run` (every layer as in process:
  namespaces, Landlock to that workspace only, seccomp) and sends the :class:`PythonResult` back.
- Leases: each connection is one; the service shuts down ``AGENTRL_SANDBOX_IDLE_S`` (default 5) seconds
  after its last one closes. A lease whose service died starts a new one on its next run; a run in
  flight when it died comes back as a failed result (exit code 125), never a hang.
- Hostile peers (garbage, a huge or cut frame, a hang-up mid-run) lose their own connection only; a
  run whose client hung up runs to its own limits and its result is dropped.

Frames are those of :mod:`._protocol` (``u32 length | JSON``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any

from simulators.python.sandbox._protocol import MAX_FRAME, ProtocolError, frame, recv_json_with_fds, send_json
from simulators.python.sandbox.host import FULL, SandboxError, SandboxRunner, SandboxWarning, open_workspace
from simulators.python.subprocess_runner import PythonResult, RunLimits

__all__ = ["SCOPE_ENV", "SERVICE_MARKER", "ServiceLease", "service_dir", "service_slots"]

#: ``auto`` (the default: ``machine`` in a multiprocessing child, else ``process``), ``machine`` (one
#: service per user and machine) or ``process`` (one per process); see :class:`SharedSandbox`
SCOPE_ENV = "AGENTRL_SANDBOX_SCOPE"
DIR_ENV = "AGENTRL_SANDBOX_DIR"
IDLE_ENV = "AGENTRL_SANDBOX_IDLE_S"
#: in the command line of every service process (tests and benchmarks find them by it)
SERVICE_MARKER = "agentrl-sandbox-service"
_VERSION = 1
_IDLE_S = 5.0
_START_TIMEOUT_S = 120.0  # a bound for a busy machine: the service answers as soon as its zygote is up
_HELLO_TIMEOUT_S = 60.0
_REPLY_SLACK_S = 180.0  # beyond a run's wall limit: set-up, a zygote restart, a busy machine
_CONNECT_TRIES = 5
_SETUP_FAILED = 125
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_LIMIT_FIELDS = {f.name: f.type for f in dataclasses.fields(RunLimits)}
# The service imports the sandbox without ``simulators/__init__`` (the simulator app and its
# libraries): a stand-in package keeps it at a plain interpreter's size.
_BOOT = (
    "import os, sys, types\n"
    "if os.fork():\n"
    "    os._exit(0)\n"  # detach: the service is nobody's child, so no starter has to reap it
    "pkg = types.ModuleType('simulators')\n"
    "pkg.__path__ = [os.path.join(sys.argv[1], 'simulators')]\n"
    "sys.modules['simulators'] = pkg\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from simulators.python.sandbox.service import serve_main\n"
    "serve_main(sys.argv[3:])\n"
)


def service_slots() -> int:
    """Warm slots of a shared service: one per core, at least two, at most eight."""
    return max(2, min(os.cpu_count() or 2, 8))


def service_dir() -> str:
    """The directory of this user's service sockets: private to this user (0700, owned, no symlink).

    ``$AGENTRL_SANDBOX_DIR`` when set (refused with a :class:`SandboxError` if it is not private:
    the user chose it). Else ``$XDG_RUNTIME_DIR/agentrl-sandbox`` or ``<tmp>/agentrl-sandbox-<uid>``;
    when that well-known path is not private (another user made it first, it is a symlink, a file or
    open to others), a private fallback in ``<tmp>`` instead (:func:`_fallback_dir`), never a failure.
    """
    explicit = os.environ.get(DIR_ENV)
    if explicit:
        path = os.path.abspath(explicit)
        try:
            os.makedirs(path, 0o700, exist_ok=True)
        except OSError as exc:
            raise SandboxError(
                f"cannot use {path} for the sandbox service: {exc}; set {DIR_ENV} to a private directory"
            ) from None
        problem = _not_private(path)
        if problem is not None:
            raise SandboxError(f"{path} {problem}: remove it, or set {DIR_ENV} to a directory only you can enter")
        return path
    tmp = tempfile.gettempdir()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.abspath(
        os.path.join(runtime, "agentrl-sandbox") if runtime else os.path.join(tmp, f"agentrl-sandbox-{os.getuid()}")
    )
    try:
        os.mkdir(path, 0o700)
    except OSError:
        pass  # it exists (checked next), or cannot be made here (the fallback)
    problem = _not_private(path)
    if problem is None:
        return path
    fallback = _fallback_dir(tmp)
    warnings.warn(
        f"{path} {problem}; the sandbox service uses the private {fallback} instead (remove {path} if it is not yours)",
        stacklevel=2,
    )
    return fallback


def _not_private(path: str) -> str | None:
    """Why ``path`` is not a private directory of this user (None when it is one)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be used ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return f"is not a private directory of uid {os.getuid()} (owner {st.st_uid}, mode {stat.filemode(st.st_mode)})"
    return None


def _fallback_dir(tmp: str) -> str:
    """A private ``<tmp>/agentrl-sandbox-svc-<uid>-XXXXXXXX`` that every process of this user finds.

    Made with :func:`tempfile.mkdtemp` (0700, an unguessable name) when there is none. No other user
    can make a directory this user owns, so any entry of that prefix that is a private directory of
    this user is one of its own: processes pick the first by name, and share one service as they
    would at the well-known path (two that make one at the same moment settle on the same one).
    """
    prefix = f"agentrl-sandbox-svc-{os.getuid()}-"

    def first() -> str | None:
        try:
            names = sorted(e.name for e in os.scandir(tmp) if e.name.startswith(prefix))
        except OSError:
            return None
        return next((os.path.join(tmp, n) for n in names if _not_private(os.path.join(tmp, n)) is None), None)

    found = first()
    if found is not None:
        return found
    try:
        made = tempfile.mkdtemp(prefix=prefix, dir=tmp)
    except OSError as exc:
        raise SandboxError(
            f"cannot make a private directory in {tmp} for the sandbox service: {exc}; set {DIR_ENV} to one"
        ) from None
    found = first() or made
    if found != made:
        os.rmdir(made)  # another process made one first: share its service
    return found


def _idle_s() -> float:
    raw = os.environ.get(IDLE_ENV, "")
    try:
        value = float(raw) if raw else _IDLE_S
    except ValueError:
        raise ValueError(f"{IDLE_ENV}={raw!r}: use seconds, e.g. {_IDLE_S}") from None
    if not 0 <= value <= 86400:
        raise ValueError(f"{IDLE_ENV}={raw!r}: use 0 to 86400 seconds")
    return value


def _peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel recorded it at connect()."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _same_pid_namespace(pid: int) -> bool:
    try:
        return pid > 0 and os.stat(f"/proc/{pid}/ns/pid").st_ino == os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return False


# -- the service process -------------------------------------------------------------------------


class _Server:
    """The accept loop, one thread per connection, and the idle shutdown."""

    def __init__(self, runner: SandboxRunner, listener: socket.socket, path: str, lock: str, idle_s: float) -> None:
        self.runner, self.listener, self.path, self.lock, self.idle_s = runner, listener, path, lock, idle_s
        self.bound = os.stat(path).st_ino
        self.active = 0
        self.idle_since = time.monotonic()
        self.mutex = threading.Lock()

    def hello(self) -> dict[str, Any]:
        r = self.runner
        return {
            "ok": True,
            "v": _VERSION,
            "service_pid": os.getpid(),
            "zygote_pid": r.pid,
            "slots": r.warm_slots,
            "numpy": r.numpy_available,
            **r.info(),
        }

    def serve(self) -> None:
        while True:
            with self.mutex:
                idle_for = time.monotonic() - self.idle_since if self.active == 0 else None
            if idle_for is not None and idle_for >= self.idle_s and self._stop_if_idle():
                return
            wait = 1.0 if idle_for is None else max(0.01, min(1.0, self.idle_s - idle_for))
            if not select.select([self.listener], [], [], wait)[0]:
                continue
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            try:
                pid, uid = _peer(conn)
            except OSError:
                conn.close()
                continue
            if uid != os.getuid() or not _same_pid_namespace(pid):
                self._refuse(conn, f"the sandbox service serves uid {os.getuid()} in its own pid namespace only")
                continue
            with self.mutex:
                self.active += 1
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _stop_if_idle(self) -> bool:
        """Stop unless a starter holds the lock or a client is at the door."""
        try:
            lock = open(self.lock, "a")
        except OSError:  # the directory is gone: nobody can find this service any more
            self.listener.close()
            return True
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            if select.select([self.listener], [], [], 0)[0]:
                return False
            try:
                if os.stat(self.path).st_ino == self.bound:  # a newer service may own the path by now
                    os.unlink(self.path)
            except OSError:
                pass
            self.listener.close()
        return True

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        try:
            conn.settimeout(1.0)
            send_json(conn, {"ok": False, "error": why})
        except OSError:
            pass
        conn.close()

    def _client(self, conn: socket.socket) -> None:
        try:
            send_json(conn, self.hello())
            while True:
                try:
                    request, fds = recv_json_with_fds(conn, 1)
                except EOFError:
                    return
                except (ProtocolError, ValueError, RecursionError) as exc:  # the framing is lost: answer and hang up
                    send_json(conn, {"ok": False, "error": f"bad frame: {type(exc).__name__}: {exc}"})
                    return
                try:
                    reply = self._answer(request, fds)
                except Exception as exc:  # a bug of ours: this request fails, the service and its other clients go on
                    reply = {"ok": False, "error": f"the sandbox service failed on this request: {type(exc).__name__}: {exc}"}
                finally:
                    for fd in fds:
                        os.close(fd)
                data = json.dumps(reply, separators=(",", ":")).encode()
                if len(data) > MAX_FRAME:  # only with an output_bytes limit far above the default
                    error = f"the run's result is {len(data)} bytes, over the {MAX_FRAME}-byte frame: lower limits.output_bytes"
                    data = json.dumps({"ok": False, "error": error}).encode()
                conn.sendall(frame(data))
        except OSError:
            pass  # the client went away (mid-run too: its result is dropped)
        finally:
            conn.close()
            with self.mutex:
                self.active -= 1
                if self.active == 0:
                    self.idle_since = time.monotonic()

    def _answer(self, request: Any, fds: list[int]) -> dict[str, Any]:
        if not isinstance(request, dict) or request.get("op") not in ("run", "info"):
            return {"ok": False, "error": "a request is a JSON object with op 'run' or 'info'"}
        if request["op"] == "info":
            return self.hello()
        try:
            code, workspace, limits = _check_run(request, fds)
        except ValueError as exc:
            return {"ok": False, "error": str(exc)}
        try:
            result = self.runner.run(code, workspace, limits)
        except (SandboxError, OSError, TypeError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "result": dataclasses.asdict(result)}


def _check_run(request: dict[str, Any], fds: list[int]) -> tuple[str, str, RunLimits]:
    """The code, workspace and limits of a run request; ValueError naming what is wrong."""
    code, workspace, raw = request.get("code"), request.get("workspace"), request.get("limits")
    if not isinstance(code, str):
        raise ValueError("'code' must be a string")
    if not isinstance(workspace, str) or not os.path.isabs(workspace) or "\x00" in workspace:
        raise ValueError("'workspace' must be an absolute path")
    if not isinstance(raw, dict) or set(raw) - set(_LIMIT_FIELDS):
        raise ValueError(f"'limits' must be an object with fields from {sorted(_LIMIT_FIELDS)}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e18:
            raise ValueError(f"limits.{key}={value!r}: use a number from 0 to 1e18")
    values: dict[str, Any] = {k: (float(v) if k == "wall_s" else int(v)) for k, v in raw.items()}
    limits = RunLimits(**values)  # ValueError naming the field for a value no run can have (cpu_s=0)
    if len(fds) != 1:
        raise ValueError("a run request carries one open descriptor of the workspace directory")
    try:
        held, named = os.fstat(fds[0]), os.stat(workspace)
    except OSError as exc:
        raise ValueError(f"the workspace is not reachable from the service: {exc}") from None
    if not stat.S_ISDIR(held.st_mode) or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
        raise ValueError("the workspace descriptor is not the directory its path names here (another mount namespace?)")
    return code, workspace, limits


def serve_main(argv: list[str]) -> None:
    """The service process (started by :func:`_start`): start the runner, bind, report ready, serve."""
    settings, path, lock, idle_s, ready = json.loads(argv[0]), argv[1], argv[2], float(argv[3]), int(argv[4])
    try:
        runner = SandboxRunner(RunLimits(), warm_slots=service_slots(), **settings)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.lexists(path):  # a dead service's (the starter holds the lock: no live one binds now)
            os.unlink(path)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
    except BaseException as exc:
        os.write(ready, json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode())
        raise SystemExit(1) from None
    os.write(ready, json.dumps({"ok": True, "pid": os.getpid()}).encode())
    os.close(ready)
    server = _Server(runner, listener, path, lock, idle_s)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve()
    finally:
        try:
            if os.stat(path).st_ino == server.bound:
                os.unlink(path)
        except OSError:
            pass
        runner.close()


# -- the client side ----------------------------------------------------------------------------


def _address(settings: dict[str, Any]) -> tuple[str, str]:
    """(socket path, lock path) of the service for ``settings``."""
    ident = json.dumps([_VERSION, os.path.realpath(sys.executable), _PKG_ROOT, settings], sort_keys=True)
    base = os.path.join(service_dir(), "svc-" + hashlib.sha256(ident.encode()).hexdigest()[:16])
    return base + ".sock", base + ".lock"


def _connect(path: str) -> tuple[socket.socket, dict[str, Any]] | None:
    """A connection and the service's hello; None when no service answers there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(_HELLO_TIMEOUT_S)
        sock.connect(path)
        owner = _peer(sock)[1]
        hello, _fds = recv_json_with_fds(sock, 0)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, EOFError):
        sock.close()
        return None  # no service, a dead one's socket, or one that was shutting down
    except (OSError, ProtocolError, ValueError) as exc:
        sock.close()
        raise SandboxError(f"the sandbox service at {path} did not answer: {type(exc).__name__}: {exc}") from None
    if owner != os.getuid():
        sock.close()
        raise SandboxError(f"{path} is served by uid {owner}, not this user: remove it, or set {DIR_ENV}")
    if not hello.get("ok") or hello.get("v") != _VERSION:
        sock.close()
        raise SandboxError(f"the sandbox service at {path} refused this process: {hello.get('error', hello)}")
    sock.settimeout(None)
    return sock, hello


def _start(settings: dict[str, Any], path: str, lock_path: str) -> None:
    """Start the service for ``settings`` and wait until it is ready (the caller holds the lock)."""
    read_fd, write_fd = os.pipe()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TMPDIR": os.path.dirname(path)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    args = [json.dumps(settings), path, lock_path, str(_idle_s()), str(write_fd)]
    log_path = path[: -len(".sock")] + ".log"
    try:
        with open(log_path, "w") as log:
            intermediate = subprocess.Popen(
                [sys.executable, "-c", _BOOT, _PKG_ROOT, SERVICE_MARKER, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
                cwd="/",
                pass_fds=(write_fd,),
                start_new_session=True,
            )
    finally:
        os.close(write_fd)
    try:
        intermediate.wait()  # it forks the service and exits at once
        data, end = b"", time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < end:
            if not select.select([read_fd], [], [], 1.0)[0]:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
    try:
        ready = json.loads(data) if data else {"ok": False, "error": f"it exited or gave no answer in {_START_TIMEOUT_S:.0f} s"}
    except ValueError:
        ready = {"ok": False, "error": repr(data[:200])}
    if not ready.get("ok"):
        raise SandboxError(f"the sandbox service did not start: {ready.get('error')} (its log: {log_path})")


def _open(settings: dict[str, Any]) -> tuple[socket.socket, dict[str, Any]]:
    """A connection to the service for ``settings``, starting it when none answers."""
    path, lock_path = _address(settings)
    for _ in range(_CONNECT_TRIES):
        found = _connect(path)
        if found is not None:
            return found
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held by a starter (until its service is up) or a stopping service
            found = _connect(path)
            if found is not None:
                return found
            _start(settings, path, lock_path)
        finally:
            os.close(fd)
    raise SandboxError(f"no sandbox service answered at {path} after {_CONNECT_TRIES} starts; see {path[:-5]}.log")


_leases: weakref.WeakSet[ServiceLease] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child may have copied a lease's lock while another thread held it: fresh locks."""
    for lease in list(_leases):
        lease._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_all(state: dict[str, Any]) -> None:
    for sock in state["idle"]:
        sock.close()
    state["idle"] = []


class ServiceLease:
    """A lease on this user's machine-wide sandbox service; the :class:`PythonRunner` interface.

    Args:
        limits: this lease's default limits.
        allow_unsafe, numpy, workspace_bytes, workspace_files: as for :class:`SandboxRunner`
            (leases with different values use different services).

    Raises:
        SandboxError: the service cannot start (its message says why) or refuses this process.
    """

    def __init__(
        self,
        limits: RunLimits | None = None,
        allow_unsafe: bool = False,
        *,
        numpy: bool = True,
        workspace_bytes: int | None = 64 << 20,
        workspace_files: int = 4096,
    ) -> None:
        self.limits = limits or RunLimits()
        self.settings = {
            "allow_unsafe": bool(allow_unsafe),
            "numpy": bool(numpy),
            "workspace_bytes": workspace_bytes,
            "workspace_files": int(workspace_files),
        }
        self.socket_path, _ = _address(self.settings)
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {"idle": [], "owner": os.getpid(), "closed": False}
        sock, hello = _open(self.settings)
        self._state["idle"].append(sock)
        self._finalizer = weakref.finalize(self, _close_all, self._state)
        _leases.add(self)
        self._hello(hello)
        if self.tier != FULL:
            warnings.warn(f"Python sandbox at tier {self.tier}: missing {', '.join(self.missing)}", SandboxWarning, stacklevel=2)

    def _hello(self, hello: dict[str, Any]) -> None:
        self.tier, self.missing = str(hello["tier"]), list(hello["missing"])
        self.layers, self.notes = dict(hello["layers"]), list(hello["notes"])
        self.numpy_available, self.slots = bool(hello["numpy"]), int(hello["slots"])
        self.service_pid: int = int(hello["service_pid"])

    def info(self) -> dict[str, Any]:
        """The tier and layers, as :meth:`SandboxRunner.info`."""
        return {"tier": self.tier, "missing": list(self.missing), "layers": dict(self.layers), "notes": list(self.notes)}

    @property
    def pid(self) -> int | None:
        """The service's zygote pid now (None when stopped)."""
        reply = self._call({"op": "info"}, None)
        self._hello(reply)
        return reply.get("zygote_pid")

    def run(self, code: str, workspace: str, limits: RunLimits | None = None) -> PythonResult:
        """Run ``code`` in ``workspace`` through the service, with this lease's limits by default."""
        lim = limits or self.limits
        start = time.monotonic()
        workspace, fd = open_workspace(code, workspace)
        try:
            request = {"op": "run", "code": code, "workspace": workspace, "limits": dataclasses.asdict(lim)}
            reply = self._call(request, fd, float(lim.wall_s) + _REPLY_SLACK_S)
        except _ServiceDied as exc:
            return PythonResult(_SETUP_FAILED, "", f"[sandbox] {exc}\n", False, False, time.monotonic() - start)
        finally:
            os.close(fd)
        if not reply.get("ok"):
            raise SandboxError(f"the sandbox service refused the run: {reply.get('error')}")
        return PythonResult(**reply["result"])

    def _call(self, request: dict[str, Any], fd: int | None, timeout: float = _HELLO_TIMEOUT_S) -> dict[str, Any]:
        """One request and its reply on an idle connection (a fresh one when the service restarted)."""
        for attempt in (0, 1):
            sock = self._take()
            sent = False
            try:
                sock.settimeout(timeout)
                send_json(sock, request, [fd] if fd is not None else None)
                sent = True
                reply, _fds = recv_json_with_fds(sock, 0)
            except (OSError, EOFError, ProtocolError, ValueError) as exc:
                sock.close()
                if sent or attempt:
                    raise _ServiceDied(
                        f"the sandbox service (pid {self.service_pid}) ended during the run ({type(exc).__name__}: {exc}); "
                        "the next run starts a new one"
                    ) from None
                continue  # the service went away between runs: connect (or start) again
            self._give(sock)
            return reply
        raise SandboxError("unreachable")

    def _take(self) -> socket.socket:
        with self._lock:
            state = self._state
            if state["closed"]:
                raise SandboxError("this ServiceLease is closed")
            if state["owner"] != os.getpid():  # a forked copy: the parent's connections are not ours
                for sock in state["idle"]:
                    os.close(sock.detach())
                state.update(idle=[], owner=os.getpid())
            while state["idle"]:
                sock = state["idle"].pop()
                if not select.select([sock], [], [], 0)[0]:  # an idle connection has nothing to read unless it ended
                    return sock
                sock.close()
        sock, hello = _open(self.settings)
        self._hello(hello)
        return sock

    def _give(self, sock: socket.socket) -> None:
        with self._lock:
            if self._state["closed"] or self._state["owner"] != os.getpid():
                sock.close()
            else:
                self._state["idle"].append(sock)

    def close(self) -> None:
        """Give the lease back (the service stops once its last lease is gone). Idempotent."""
        with self._lock:
            self._state["closed"] = True
            self._finalizer()  # in a forked copy this closes only the copies of the parent's connections

    def __enter__(self) -> ServiceLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ServiceDied(Exception):
    """The connection to the service broke after the request went out."""
