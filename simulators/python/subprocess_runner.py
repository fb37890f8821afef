"""Run untrusted Python in a subprocess with rlimits, a wall deadline and capped output.

This is the basic runner: a fresh ``python -I -S`` per call, in its own session, with address-space,
CPU, file-size, open-file and core limits, a scrubbed environment, stdin at /dev/null, and the
episode workspace as its working directory. When the deadline passes or the output cap is reached
the whole process group is killed with SIGKILL. The hardened sandbox (namespaces, seccomp,
Landlock, a warm zygote) plugs in behind the same :class:`PythonRunner` interface.
"""

from __future__ import annotations

import math
import numbers
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["MAX_CODE_CHARS", "PythonResult", "PythonRunner", "RunLimits"]

MAX_CODE_CHARS = 100_000

# Applies the rlimits (argv[2:8]), then runs the agent's file as __main__ with the filename
# "<agent>", so tracebacks never show host paths and are the same on every machine. The limits are
# set by the child itself rather than through preexec_fn, so subprocess can use vfork/posix_spawn
# (a preexec_fn forces a full fork of the parent, which grows with the parent's memory).
_BOOTSTRAP = """\
def _run():
    import os, resource, sys
    status_fd = int(sys.argv[8])
    if status_fd >= 0:
        # pid 1 of a new pid namespace: run the program as our child, so it gets ordinary signal
        # semantics, reap every orphan, report the program's status and CPU seconds, and exit,
        # which makes the kernel kill whatever is left in the namespace.
        pid = os.fork()
        if pid:
            while True:
                try:
                    done, st, ru = os.wait3(0)
                except ChildProcessError:
                    os._exit(0)
                if done == pid:
                    cpu = ru.ru_utime + ru.ru_stime
                    os.write(status_fd, f"{os.waitstatus_to_exitcode(st)} {cpu}".encode())
                    os._exit(0)
        os.close(status_fd)
    a = [int(x) for x in sys.argv[2:8]]
    for k, v in ((resource.RLIMIT_AS, a[0]), (resource.RLIMIT_FSIZE, a[2]), (resource.RLIMIT_NOFILE, a[3]),
                 (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(k, (v, v))
    resource.setrlimit(resource.RLIMIT_CPU, (a[1], a[1] + 1))
    if a[5]:
        resource.setrlimit(resource.RLIMIT_NPROC, (a[4], a[4]))
    with open(sys.argv[1], 'rb') as f:
        src = f.read()
    sys.argv = ['<agent>']
    main = sys.modules['__main__']
    for k in [k for k in vars(main) if k not in ('__name__', '__builtins__', '__doc__', '__spec__', '__loader__')]:
        delattr(main, k)
    try:
        exec(compile(src, '<agent>', 'exec'), vars(main))
    except SystemExit:
        raise
    except BaseException as e:
        import traceback
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != '<agent>':
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)
_run()
"""


@dataclass(frozen=True)
class RunLimits:
    """Resource limits of one run.

    Every value is checked when the limits are made, so a bad one fails where it was written (a
    ValueError naming the field and what to use instead) rather than as a failed run later.

    Args:
        wall_s: wall-clock deadline, a finite number of seconds above 0; the process group is killed
            with SIGKILL after it.
        cpu_s: RLIMIT_CPU seconds, an int of at least 1.
        memory_bytes: RLIMIT_AS, an int of at least 1.
        file_bytes: RLIMIT_FSIZE, the largest file the program may write (0: none at all).
        open_files: RLIMIT_NOFILE, an int of at least 1.
        processes: RLIMIT_NPROC, an int of at least 1 (ignored by the kernel for root).
        output_bytes: stdout and stderr are each cut at this size and the run is stopped; at least 1.
    """

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 64
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        wall = self.wall_s
        if isinstance(wall, bool) or not isinstance(wall, numbers.Real) or not (math.isfinite(wall) and wall > 0):
            raise ValueError(f"RunLimits.wall_s={wall!r}: use a finite number of seconds above 0, e.g. 5.0")
        object.__setattr__(self, "wall_s", float(wall))
        for name, least in _INT_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not least <= value < 1 << 63:
                raise ValueError(
                    f"RunLimits.{name}={value!r}: use an int from {least} to 2**63 - 1 (the kernel's limits "
                    f"are 64-bit), e.g. the default {getattr(RunLimits, name)}"
                )
            object.__setattr__(self, name, int(value))


#: the integer fields of RunLimits and the least value that means something (0 bytes of file: no files)
_INT_LIMITS = {"cpu_s": 1, "memory_bytes": 1, "file_bytes": 0, "open_files": 1, "processes": 1, "output_bytes": 1}


@dataclass(frozen=True)
class PythonResult:
    """Outcome of one run. ``exit_code`` is negative for a signal, as in :mod:`subprocess`."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    elapsed_s: float


class PythonRunner:
    """Runs programs one at a time; stateless between runs.

    Each run's program is a private temporary file (mode 0600), removed when the run ends; between
    runs the runner holds no files, so a runner that is never closed leaves nothing behind.
    """

    def __init__(self, limits: RunLimits | None = None) -> None:
        self.limits = limits or RunLimits()
        self.isolation = _probe_pid_namespace()

    def run(self, code: str, workspace: str, limits: RunLimits | None = None) -> PythonResult:
        """Run ``code`` with ``workspace`` as the working directory."""
        lim = limits or self.limits
        fd, path = tempfile.mkstemp(prefix="agentrl-py-", suffix=".py")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(code.encode("utf-8", "surrogatepass"))
            return self._run_file(path, workspace, lim)
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _run_file(self, path: str, workspace: str, lim: RunLimits) -> PythonResult:
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": workspace,
            "PYTHONIOENCODING": "utf-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        start = time.perf_counter()
        limits = [lim.memory_bytes, lim.cpu_s, lim.file_bytes, lim.open_files, lim.processes, int(os.geteuid() != 0)]
        status_r, status_w = os.pipe() if self.isolation else (-1, -1)
        try:
            proc = subprocess.Popen(
                [
                    *self.isolation,
                    os.path.abspath(sys.executable),
                    "-I",
                    "-S",
                    "-c",
                    _BOOTSTRAP,
                    path,
                    *map(str, limits),
                    str(status_w),
                ],
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=(status_w,) if status_w >= 0 else (),
            )
        finally:
            if status_w >= 0:
                os.close(status_w)
        try:
            out, err, timed_out, truncated = _collect(proc, lim, start)
            exit_code, cpu_s = proc.returncode, 0.0
            if status_r >= 0 and not timed_out and not truncated:
                exit_code, cpu_s = _read_status(status_r, exit_code)
            if not timed_out and not truncated and _cpu_limit_hit(exit_code, cpu_s, lim.cpu_s):
                # Out of CPU time is the same outcome as out of wall time: which one comes first
                # depends on how busy the machine is, and a transcript must not.
                exit_code, timed_out = -signal.SIGKILL, True
        finally:
            if status_r >= 0:
                os.close(status_r)
        return PythonResult(
            exit_code=exit_code,
            stdout=_decode(out, truncated and len(out) >= lim.output_bytes),
            stderr=_decode(err, truncated and len(err) >= lim.output_bytes),
            timed_out=timed_out,
            output_truncated=truncated,
            elapsed_s=time.perf_counter() - start,
        )

    def close(self) -> None:
        """Nothing to release (kept for the runners' common interface)."""


def _read_status(fd: int, fallback: int) -> tuple[int, float]:
    """The program's exit status and CPU seconds as reported by the namespace's pid 1 (the fallback
    and 0 if it said nothing)."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        return fallback, 0.0
    try:
        code, cpu = data.decode().split()
        return int(code), float(cpu)
    except ValueError:
        return fallback, 0.0


def _cpu_limit_hit(exit_code: int, cpu_s: float, limit: int) -> bool:
    """The program died of RLIMIT_CPU: SIGXCPU at the soft limit, or SIGKILL at the hard one."""
    return exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu_s >= limit)


def _probe_pid_namespace() -> list[str]:
    """A command prefix that runs the program as pid 1 of a new pid namespace, or [] if unavailable.

    When pid 1 of a namespace dies the kernel kills every process in it, so nothing the program
    started (double-forked daemons included) outlives the run. Root can unshare directly; other
    users need an unprivileged user namespace.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    for extra in ([], ["--user", "--map-root-user"]):
        cmd = [unshare, *extra, "--fork", "--pid", "--kill-child"]
        try:
            ok = subprocess.run([*cmd, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return cmd
    return []


def _collect(proc: subprocess.Popen[bytes], lim: RunLimits, start: float) -> tuple[bytes, bytes, bool, bool]:
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        sel.register(stream.fileno(), selectors.EVENT_READ)
    timed_out = truncated = False
    deadline = start + lim.wall_s
    try:
        while sel.get_map():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                fd = key.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = buffers[fd]
                room = lim.output_bytes - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    truncated = True
            if truncated:
                break
        if not timed_out and not truncated:
            remaining = max(0.0, deadline - time.perf_counter())
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        _kill_group(proc)
        proc.stdout.close()
        proc.stderr.close()
    return bytes(buffers[out_fd]), bytes(buffers[err_fd]), timed_out, truncated


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _decode(data: bytes, truncated: bool) -> str:
    text = data.decode("utf-8", errors="replace")
    if truncated:
        text += "\n[output truncated]"
    return text
