"""Host side of the Python sandbox: :class:`SandboxRunner`, a drop-in for :class:`PythonRunner`.

Process tree (root host; a non-root host adds a user namespace around the zygote)::

    host (may import torch; never forked)
     └─ zygote         python -I -S, own mount + network namespaces, allowed modules imported
         └─ zygote     pid 1 of its pid namespace: its death ends every run
             ├─ pauser     pid 1 of the run's pid namespace (shares the zygote's memory): its death ends the run
             └─ program    forked into the run's pid, mount and IPC namespaces; no capabilities,
                           Landlock, seccomp, rlimits (+ own user namespace)

Two slots (a program, locked down as far as it can be before its request, and its pid 1) are kept
prepared ahead of requests ("warm slots"). A run writes its request straight to the program; this
side reads its output, enforces the deadline and copies the workspace changes back (see
:mod:`._monitor`). The program holds none of the descriptors the result is built from except its
own output pipes, so nothing it prints can forge the result.
"""

from __future__ import annotations

import importlib.util
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any

from simulators import _owners
from simulators.python.sandbox._context import SETUP_FAILED
from simulators.python.sandbox._monitor import Slot, supervise
from simulators.python.sandbox._protocol import ProtocolError, frame, recv_json_with_fds, send_json
from simulators.python.subprocess_runner import PythonResult, RunLimits

__all__ = [
    "DEFAULT_PREIMPORT",
    "FULL",
    "PROGRAM_ENV",
    "REDUCED",
    "UNSAFE",
    "SandboxError",
    "SandboxRunner",
    "SandboxWarning",
    "idle_processes",
]

FULL, REDUCED, UNSAFE = "FULL", "REDUCED", "UNSAFE"

#: modules imported once in the zygote, so that a run's ``import`` of them costs nothing
DEFAULT_PREIMPORT = (
    "array base64 bisect calendar collections copy csv dataclasses datetime decimal enum fnmatch fractions functools "
    "glob hashlib heapq io itertools json math operator pathlib pprint random re statistics string struct subprocess "
    "tempfile textwrap threading time typing unicodedata zoneinfo"
).split()

#: the environment of every program (HOME and TMPDIR are set to the workspace per run)
PROGRAM_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_ZYGOTE_ENV = {
    k: PROGRAM_ENV[k] for k in ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
}
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_BOOT = (
    "import sys, types\n"
    "pkg = types.ModuleType('_agentrl_sandbox')\n"
    "pkg.__path__ = [sys.argv[1]]\n"
    "sys.modules['_agentrl_sandbox'] = pkg\n"
    "from _agentrl_sandbox._zygote import main\n"
    "main(int(sys.argv[2]))\n"
)
# How long the host waits for the zygote to hand over a slot, and how long a run's set-up may take
# beyond its wall limit: generous bounds for a busy machine (both end as soon as the event comes).
_ACK_TIMEOUT_S = 60.0
_SETUP_WAIT_S = 60.0
_WARM_SLOTS = 2  # slots kept prepared ahead of requests (two: two client threads never wait)


def idle_processes(pidns: bool, slots: int = _WARM_SLOTS) -> int:
    """Processes below the zygote between runs: the pid-1 zygote (with a pid namespace) and, per
    warm slot, its program (and its pid 1)."""
    return (1 + 2 * slots) if pidns else slots


class SandboxError(RuntimeError):
    """The sandbox cannot start, or refuses to (tier UNSAFE without ``allow_unsafe``)."""


class SandboxWarning(UserWarning):
    """The sandbox runs with layers missing (tier REDUCED or UNSAFE)."""


class _Zygote:
    """A started zygote: its process and control socket. Kept apart from the runner for finalizers."""

    def __init__(self, config: dict[str, Any], timeout_s: float, warm_slots: int = _WARM_SLOTS) -> None:
        self.warm_slots = warm_slots
        self.slots: list[Slot] = []  # warm runs, prepared ahead of their requests
        self.pending = 0  # slots asked for, replies not read yet
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [os.path.abspath(sys.executable), "-I", "-S", "-c", _BOOT, _PKG_DIR, str(child.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=_ZYGOTE_ENV,
                cwd="/",
                pass_fds=(child.fileno(),),
                close_fds=True,
                start_new_session=True,
            )
        finally:
            child.close()
        self.sock = parent
        try:
            parent.settimeout(timeout_s)
            send_json(parent, config)
            self.hello, _ = recv_json_with_fds(parent, 0)
            parent.settimeout(_ACK_TIMEOUT_S)
        except (OSError, EOFError, ProtocolError, ValueError) as exc:
            self.stop()
            raise SandboxError(f"the sandbox zygote did not start: {type(exc).__name__}: {exc}") from None

    def take_slot(self) -> Slot:
        """A warm slot for the next run (prepared now if none is ready)."""
        while True:
            while not self.slots:
                if self.pending == 0:
                    self._ask()
                reply, fds = recv_json_with_fds(self.sock, 8)
                self.pending -= 1
                if not reply.get("ok"):
                    for fd in fds:
                        os.close(fd)
                    raise SandboxError(f"the sandbox could not prepare a run: {reply.get('error')}")
                self.slots.append(Slot.from_fds(list(reply.get("fds", ())), list(fds)))
            slot = self.slots.pop(0)
            # A slot outlives its zygote for a moment (its program is killed when the zygote's death
            # reaches it): a dead zygote's slots are never handed out, so the run goes to a new one.
            if self.proc.poll() is None and not select.select([slot.prog], [], [], 0)[0]:
                return slot
            slot.close()  # its program is gone, or about to be: the zygote died, or killed it
            if self.proc.poll() is not None:
                raise EOFError("the sandbox zygote is gone")

    def refill(self) -> None:
        """Ask for warm slots up to the pool size. Called after a run, so that their preparation
        overlaps the caller's own work rather than the next run."""
        while self.pending + len(self.slots) < self.warm_slots:
            self._ask()

    def _ask(self) -> None:
        self.sock.sendall(frame(b"{}"))
        self.pending += 1

    def stop(self) -> None:
        """Hang up (the zygote exits and takes every run with it), then make sure it is gone."""
        for slot in self.slots:
            slot.close()
        self.slots = []
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: scratch folders are ``<tmp>/agentrl-sandbox-XXXXXXXX`` (the service directory, ``agentrl-sandbox-<uid>``,
#: has no owner file and is never swept)
SCRATCH_PREFIX = "agentrl-sandbox-"
_OWNER_FILE = "owner"


def _read_owner_file(path: str, name: str) -> _owners.Owner | None:
    with open(os.path.join(path, _OWNER_FILE), encoding="ascii") as f:
        pid, start, ns = (int(x) for x in f.read().split())
    return pid, start, ns


def sweep_stale_scratch(folder: str, keep: str = "") -> list[str]:
    """Remove this user's runner scratch folders in ``folder`` whose owning process is gone.

    A runner's zygote removes its host's folder when the host is killed; this catches the rest (host
    and zygote killed together, as a killed process group or container can be). A folder is removed
    only when its owner file names a process of this pid namespace that no longer runs; anything
    else (another user's, an unreadable or unfinished owner file, another namespace) is left alone.
    Returns the folders removed.
    """
    return _owners.sweep(folder, SCRATCH_PREFIX, _read_owner_file, keep)


def _finalize(state: dict[str, Any]) -> None:
    zygote = state.get("zygote")
    if zygote is not None and state.get("owner") == os.getpid():
        zygote.stop()
    state["zygote"] = None
    if state.get("owner") == os.getpid():
        shutil.rmtree(state["scratch"], ignore_errors=True)


def open_workspace(code: str, workspace: str) -> tuple[str, int]:
    """A run's checks before anything starts: ``code`` is a str, ``workspace`` a directory.

    Returns the workspace's absolute path and a read-only descriptor of it (close-on-exec), which
    the run's lock-in compares against the path it names. The caller closes the descriptor.

    Raises:
        TypeError: ``code`` is not a str.
        OSError: ``workspace`` is missing or not a directory.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, not {type(code).__name__}")
    workspace = os.path.abspath(workspace)
    return workspace, os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


class SandboxRunner:
    """Runs untrusted Python in a hardened sandbox; the same interface as :class:`PythonRunner`.

    Args:
        limits: default resource limits of a run.
        allow_unsafe: accept tier UNSAFE (rlimits only) instead of raising :class:`SandboxError`.
        numpy: make numpy importable inside (when the host can import it), pre-imported.
        workspace_bytes: a run's writes to the workspace go to a tmpfs of this size and are copied
            back when it ends (``None``: write the workspace directly, with no total cap).
        workspace_files: inode cap of that tmpfs (files + directories a run may create).
        disable: layer names to switch off (for tests, or a platform known to lack them).
        warm_slots: runs kept prepared ahead of requests (two: two client threads never wait).

    Attributes:
        tier: ``"FULL"``, ``"REDUCED"`` or ``"UNSAFE"``, as probed when the zygote started.
        missing: the layers tier FULL needs that are not in force here.
        layers: every layer and whether it is in force.
        notes: why layers are missing, as the probe saw it.
    """

    def __init__(
        self,
        limits: RunLimits | None = None,
        allow_unsafe: bool = False,
        *,
        numpy: bool = True,
        workspace_bytes: int | None = 64 << 20,
        workspace_files: int = 4096,
        disable: tuple[str, ...] | list[str] = (),
        start_timeout_s: float = 60.0,
        warm_slots: int = _WARM_SLOTS,
    ) -> None:
        self.limits = limits or RunLimits()
        self.allow_unsafe = allow_unsafe
        self._numpy = numpy
        self._workspace_bytes = workspace_bytes
        self._workspace_files = workspace_files
        self._disable = list(disable)
        self._start_timeout_s = start_timeout_s
        if not 1 <= int(warm_slots) <= 64:
            raise ValueError(f"warm_slots={warm_slots!r}: use 1 to 64 (2 serves two client threads without waiting)")
        self.warm_slots = int(warm_slots)
        self._lock = threading.Lock()
        self.tier = UNSAFE
        self.missing: list[str] = []
        self.layers: dict[str, bool] = {}
        self.notes: list[str] = []
        self.numpy_available = False
        self.restarts = 0
        self._closed = False
        #: seconds from the start of the last run to each phase (for benchmarks)
        self.last_timings: dict[str, float] = {}
        self._state: dict[str, Any] = {}
        self._init_state()
        self._finalizer = weakref.finalize(self, _finalize, self._state)
        with self._lock:
            self._start()

    def _init_state(self) -> None:
        scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
        for sub in ("mnt", "probe-ws"):
            os.mkdir(os.path.join(scratch, sub), 0o700)
        with open(os.path.join(scratch, "probe-secret"), "w") as f:
            f.write("not for the sandbox\n")
        owner = _owners.owner_of(os.getpid())
        with open(os.path.join(scratch, _OWNER_FILE), "w") as f:
            f.write(" ".join(map(str, owner)) if owner else "")
        self._state.update(scratch=scratch, zygote=None, owner=os.getpid())
        sweep_stale_scratch(os.path.dirname(scratch), keep=scratch)

    @property
    def pid(self) -> int | None:
        """Pid of the zygote process (None when stopped)."""
        zygote = self._state.get("zygote")
        return zygote.proc.pid if zygote is not None else None

    def _start(self) -> None:
        scratch = self._state["scratch"]
        numpy_path = None
        if self._numpy:
            spec = importlib.util.find_spec("numpy")
            if spec is not None and spec.submodule_search_locations:
                numpy_path = os.path.dirname(next(iter(spec.submodule_search_locations)))
        config = {
            "preimport": list(DEFAULT_PREIMPORT),
            "numpy_path": numpy_path,
            "mnt": os.path.join(scratch, "mnt"),
            "probe_workspace": os.path.join(scratch, "probe-ws"),
            "probe_secret": os.path.join(scratch, "probe-secret"),
            "scratch": scratch,  # the zygote removes it if this process dies without closing the runner
            "host_pid": os.getpid(),
            "workspace_bytes": self._workspace_bytes,
            "workspace_files": self._workspace_files,
            "disable": self._disable,
            "env": PROGRAM_ENV,
        }
        zygote = _Zygote(config, self._start_timeout_s, self.warm_slots)
        hello = zygote.hello
        self.tier, self.missing = hello["tier"], list(hello["missing"])
        self.layers, self.notes = dict(hello["layers"]), list(hello["notes"])
        self.numpy_available = bool(hello.get("numpy"))
        if self.tier == UNSAFE and not self.allow_unsafe:
            zygote.stop()
            raise SandboxError(
                "the Python sandbox would run at tier UNSAFE (rlimits only; missing: "
                f"{', '.join(self.missing)}). Pass allow_unsafe=True to accept that, or run where user "
                f"namespaces, seccomp and Landlock are available. Probe notes: {'; '.join(self.notes)}"
            )
        if self.tier != FULL:
            warnings.warn(
                f"Python sandbox at tier {self.tier}: missing {', '.join(self.missing)} ({'; '.join(self.notes)})",
                SandboxWarning,
                stacklevel=3,
            )
        self._state["zygote"] = zygote
        zygote.refill()

    def info(self) -> dict[str, Any]:
        """The tier and layers, for ``info["sandbox_tier"]`` and logs."""
        return {"tier": self.tier, "missing": list(self.missing), "layers": dict(self.layers), "notes": list(self.notes)}

    # -- running ----------------------------------------------------------------------------------

    def run(self, code: str, workspace: str, limits: RunLimits | None = None) -> PythonResult:
        """Run ``code`` with ``workspace`` as the working directory."""
        lim = limits or self.limits
        start = time.monotonic()
        workspace, real_fd = open_workspace(code, workspace)
        try:
            st = os.fstat(real_fd)
            slot = self._take_slot()  # (re)starting the zygote, if needed, does not count against the run
            acked = time.monotonic()
            header = {
                "workspace": workspace,
                "ws_dev": st.st_dev,
                "ws_ino": st.st_ino,
                "wall_s": float(lim.wall_s),  # counted from the moment the agent's code starts
                "deadline": acked + lim.wall_s + _SETUP_WAIT_S,  # the whole run, set-up included
                "cpu_s": max(1, int(lim.cpu_s)),
                "memory_bytes": lim.memory_bytes,
                "file_bytes": lim.file_bytes,
                "open_files": lim.open_files,
                "processes": lim.processes,
                "output_bytes": lim.output_bytes,
            }
            try:
                outcome = supervise(slot, header, code.encode("utf-8", "surrogatepass"), real_fd)
            finally:
                slot.close()
        finally:
            os.close(real_fd)
        result_header, out, err, _report = outcome
        result = _to_result(result_header, out, err, time.monotonic() - start, (workspace, self._state["scratch"]))
        self._refill()
        marks = result_header.get("marks", {})
        self.last_timings = {"acked": acked - start, **{k: v - start for k, v in marks.items()}, "done": result.elapsed_s}
        return result

    def _take_slot(self) -> Slot:
        """A warm slot of a live zygote. Restarts a dead zygote once."""
        for attempt in (0, 1):
            with self._lock:
                if self._closed:
                    raise SandboxError("this SandboxRunner is closed")
                if self._state["owner"] != os.getpid():
                    self._adopt_after_fork()
                if self._state["zygote"] is None:
                    self._start()
                    self.restarts += 1
                zygote = self._state["zygote"]
                try:
                    return zygote.take_slot()
                except (OSError, EOFError, ProtocolError, ValueError) as exc:
                    self._drop(zygote)
                    if attempt:
                        raise SandboxError(f"the sandbox zygote failed twice: {type(exc).__name__}: {exc}") from None
        raise SandboxError("unreachable")

    def _refill(self) -> None:
        with self._lock:
            zygote = self._state.get("zygote")
            if zygote is not None and not self._closed and self._state["owner"] == os.getpid():
                try:
                    zygote.refill()
                except OSError:
                    self._drop(zygote)

    def _drop(self, zygote: _Zygote) -> None:
        """Stop a failed zygote (if it is still the current one); the next run starts a new one."""
        if self._state["zygote"] is zygote:
            zygote.stop()
            self._state["zygote"] = None

    def _adopt_after_fork(self) -> None:
        """In a forked copy of the host: leave the parent's zygote alone and start our own."""
        zygote = self._state["zygote"]
        if zygote is not None:
            os.close(zygote.sock.detach())
            for slot in zygote.slots:  # our copies of the parent's warm slots
                slot.close()
        self._init_state()

    def close(self) -> None:
        """Stop the zygote (ending any run in flight) and remove the scratch directory."""
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> SandboxRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _redact(text: str, paths: tuple[str, ...]) -> str:
    """``text`` without the host paths in ``paths`` (a message of the sandbox must not reveal them)."""
    for path, stand_in in zip(paths, ("<workspace>", "<sandbox>")):
        text = text.replace(path, stand_in)
    return text


def _to_result(header: dict[str, Any], out: bytes, err: bytes, elapsed: float, redact: tuple[str, ...] = ()) -> PythonResult:
    """The run's result from the monitor's header. Host paths in ``redact`` (the workspace, the
    scratch directory) are replaced in the sandbox's own messages."""
    stdout, stderr = _decode(out, header["truncated_out"]), _decode(err, header["truncated_err"])
    exit_code = int(header["exit_code"])
    if header.get("setup_error"):
        stderr += f"[sandbox] {_redact(str(header['setup_error']), redact)}\n"
        exit_code = SETUP_FAILED
    for note in header.get("notes", ()):
        stderr += f"[sandbox] workspace: {_redact(str(note), redact)}\n"
    errors = header.get("copyback_errors") or ()
    for error in errors:
        stderr += f"[sandbox] workspace: could not keep {_redact(str(error), redact)}\n"
    if errors:
        # The program's changes did not all reach the workspace: never a success.
        stderr += f"[sandbox] the run's workspace changes were not all kept (the program exited with {exit_code})\n"
        exit_code = SETUP_FAILED
    return PythonResult(
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        timed_out=bool(header["timed_out"]),
        output_truncated=bool(header["truncated_out"] or header["truncated_err"]),
        elapsed_s=elapsed,
    )


def _decode(data: bytes, truncated: bool) -> str:
    text = data.decode("utf-8", errors="replace")
    if truncated:
        text += "\n[output truncated]"
    return text
