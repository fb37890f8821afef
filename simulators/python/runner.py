"""Run untrusted Python in a subprocess with rlimits, a wall deadline and capped output.

This is the basic runner: a fresh ``python -I -S`` per call, in its own session, with address-space,
CPU, file-size, open-file and core limits, a scrubbed environment, stdin at /dev/null, and the
episode workspace as its working directory. When the deadline passes or the output cap is reached
the whole process group is killed with SIGKILL. The hardened sandbox (namespaces, seccomp,
Landlock, a warm zygote) plugs in behind the same :class:`PythonRunner` interface.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

MAX_CODE_CHARS = 100_000

# Runs the agent's file as __main__ with the filename "<agent>", so tracebacks never show
# host paths and are the same on every machine.
_BOOTSTRAP = (
    "import sys, traceback\n"
    "p = sys.argv[1]\n"
    "with open(p, 'rb') as f: src = f.read()\n"
    "sys.argv = ['<agent>']\n"
    "g = {'__name__': '__main__', '__builtins__': __builtins__}\n"
    "try:\n"
    "    exec(compile(src, '<agent>', 'exec'), g)\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as e:\n"
    "    tb = e.__traceback__\n"
    "    while tb is not None and tb.tb_frame.f_code.co_filename != '<agent>':\n"
    "        tb = tb.tb_next\n"
    "    traceback.print_exception(type(e), e, tb)\n"
    "    sys.exit(1)\n"
)


@dataclass(frozen=True)
class RunLimits:
    """Resource limits of one run.

    Args:
        wall_s: wall-clock deadline; the process group is killed with SIGKILL after it.
        cpu_s: RLIMIT_CPU seconds.
        memory_bytes: RLIMIT_AS.
        file_bytes: RLIMIT_FSIZE, the largest file the program may write.
        open_files: RLIMIT_NOFILE.
        processes: RLIMIT_NPROC (ignored by the kernel for root).
        output_bytes: stdout and stderr are each cut at this size and the run is stopped.
    """

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 64
    output_bytes: int = 1 << 20


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
    """Runs programs one at a time; stateless between runs except for a scratch directory."""

    def __init__(self, limits: RunLimits | None = None) -> None:
        self.limits = limits or RunLimits()
        self._scratch = tempfile.mkdtemp(prefix="agentrl-py-")

    def run(self, code: str, workspace: str, limits: RunLimits | None = None) -> PythonResult:
        """Run ``code`` with ``workspace`` as the working directory."""
        lim = limits or self.limits
        fd, path = tempfile.mkstemp(suffix=".py", dir=self._scratch)
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
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, path],
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_limiter(lim),
        )
        out, err, timed_out, truncated = _collect(proc, lim, start)
        return PythonResult(
            exit_code=proc.returncode,
            stdout=_decode(out, truncated and len(out) >= lim.output_bytes),
            stderr=_decode(err, truncated and len(err) >= lim.output_bytes),
            timed_out=timed_out,
            output_truncated=truncated,
            elapsed_s=time.perf_counter() - start,
        )

    def close(self) -> None:
        import shutil

        shutil.rmtree(self._scratch, ignore_errors=True)


def _limiter(lim: RunLimits):  # type: ignore[no-untyped-def]
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_bytes, lim.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_bytes, lim.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim.open_files, lim.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.geteuid() != 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (lim.processes, lim.processes))

    return apply


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
