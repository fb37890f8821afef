"""The supervisor of one run: pid 1 of the run's pid namespace (or, without one, a child subreaper).

The zygote forks it ahead of the request. Before the request it enters the run's mount and IPC
namespaces, mounts the capped tmpfs and forks the program (see :mod:`._program`), which locks itself
down and waits. On the request it checks the workspace, mounts the overlay over it, tells the
program to go, collects its output up to the cap, enforces the wall deadline, SIGKILLs every process
of the run, copies the workspace changes back and writes the result on its own pipe to the host.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import stat
import time
from typing import Any, NoReturn

from . import _copyback, _linux
from ._context import SETUP_FAILED, Context
from ._program import program_main
from ._protocol import decode_request, encode_request, encode_result, read_frame_fd, write_all

_POLL_S = 0.05
# The kernel's smallest pid_max (RESERVED_PIDS + 1): a run's pid namespace holds at most 300 tasks
# even where RLIMIT_NPROC does not apply (root).
PID_MAX = 301
_SETUP_CAP = 65536
MS_BIND, MS_NOEXEC = 0x1000, 8


def supervisor_main(ctx: Context, request_r: int, result_w: int) -> NoReturn:
    """Entry point of the supervisor child; never returns."""
    marks = {"forked": time.monotonic()}
    result: dict[str, Any] = {"exit_code": SETUP_FAILED, "timed_out": False, "truncated_out": False, "truncated_err": False}
    out = err = b""
    run: _Run | None = None
    prep_error = None
    try:
        run = _Run(ctx)
    except BaseException as exc:
        prep_error = f"supervisor: {type(exc).__name__}: {exc}"
    try:
        header, program = decode_request(read_frame_fd(request_r))
    except BaseException:  # the zygote went away without a request
        if run is not None:
            run.kill_all()
        os._exit(0)
    os.close(request_r)
    marks["request"] = time.monotonic()
    try:
        if run is None:
            raise OSError(prep_error)
        out, err = run.execute(header, program, result, marks)
    except BaseException as exc:
        result["setup_error"] = f"supervisor: {type(exc).__name__}: {exc}"
        if run is not None:
            run.kill_all()
    result["marks"] = marks
    try:
        write_all(result_w, encode_result(result, out, err))
        os.close(result_w)  # the host has its answer; reaping and tearing the namespaces down come after
    except OSError:
        pass
    if run is not None:
        run.kill_all()
    os._exit(0)


class _Run:
    """The supervisor's side of one run, from the warm state to the result."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.usage: dict[str, float] = {}  # the program's CPU seconds, once reaped
        plan = ctx.plan
        _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote's is SIG_IGN; we wait for the program
        os.close(ctx.control_fd)
        os.setsid()
        self.in_pidns = plan.pidns and os.getpid() == 1
        if plan.pidns and not self.in_pidns:
            raise OSError("the supervisor is not pid 1 of its pid namespace")
        if plan.subreaper:
            _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
        flags = (_linux.CLONE_NEWNS if plan.mntns else 0) | (_linux.CLONE_NEWIPC if plan.ipcns else 0)
        self.overlay = plan.overlay
        if flags and not ctx.step("mntns", lambda: _linux.unshare(flags)):
            self.overlay = False
        if self.overlay:
            self.overlay = ctx.step("tmpfs", self._mount_tmpfs)
        if plan.pid_max:
            ctx.step("pid_max", lambda: _write("/proc/sys/kernel/pid_max", str(PID_MAX)))
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.setup_r, setup_w = os.pipe()
        go_r, self.go_w = os.pipe()
        _grow_pipe(self.go_w)
        self.pid = _linux.fork()
        if self.pid == 0:
            try:
                for fd in (self.out_r, self.err_r, self.setup_r, self.go_w):
                    os.close(fd)
                program_main(ctx, out_w, err_w, go_r, setup_w)
            finally:
                os._exit(SETUP_FAILED)
        for fd in (out_w, err_w, setup_w, go_r):
            os.close(fd)

    def _mount_tmpfs(self) -> None:
        ctx = self.ctx
        opts = f"size={ctx.workspace_bytes},nr_inodes={ctx.workspace_files + 5},mode=0700"
        _linux.mount("tmpfs", ctx.mnt, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, opts)
        os.mkdir(f"{ctx.mnt}/work", 0o700)
        os.mkdir(f"{ctx.mnt}/upper", 0o700)

    def _mount_overlay(self, workspace: str, st: os.stat_result) -> None:
        mnt = self.ctx.mnt
        upper = f"{mnt}/upper"
        os.chmod(upper, stat.S_IMODE(st.st_mode))
        try:
            os.chown(upper, st.st_uid, st.st_gid)
        except OSError:
            pass
        lower = workspace
        if any(c in workspace for c in ",:\\"):  # characters overlay options cannot hold
            lower = f"{mnt}/lower"
            os.mkdir(lower, 0o700)
            _linux.mount(workspace, lower, None, MS_BIND, None)
        # Redirects and metacopy off: the upper layer then holds whole files, which the copy-back
        # needs (in a user namespace "userxattr" implies no redirects and refuses redirect_dir=off).
        opts = f"lowerdir={lower},upperdir={upper},workdir={mnt}/work,metacopy=off,index=off"
        opts += ",redirect_dir=off" if self.ctx.root else ",userxattr"
        _linux.mount("overlay", workspace, "overlay", _linux.MS_NOSUID | _linux.MS_NODEV | MS_NOEXEC, opts)

    def execute(
        self, header: dict[str, Any], program: bytes, result: dict[str, Any], marks: dict[str, float]
    ) -> tuple[bytes, bytes]:
        ctx = self.ctx
        workspace = header["workspace"]
        real_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(real_fd)
            if (st.st_dev, st.st_ino) != (header["ws_dev"], header["ws_ino"]):
                raise OSError("the workspace is not the host's workspace here (a mount made after the sandbox started?)")
            if ctx.plan.pid_max and int(header["processes"]) + 2 > PID_MAX:
                ctx.step("pid_max", lambda: _write("/proc/sys/kernel/pid_max", str(int(header["processes"]) + 2)))
            overlay = self.overlay and ctx.step("overlay", lambda: self._mount_overlay(workspace, st))
            try:
                write_all(self.go_w, encode_request(header, program))
            except BrokenPipeError:
                pass  # the program died during its set-up; its report says why
            os.close(self.go_w)
            marks["go"] = time.monotonic()
            output = _Output(self.out_r, self.err_r, self.setup_r, int(header["output_bytes"]))
            status, timed_out, done = None, False, None
            try:
                status, timed_out, done = _watch(self.pid, output, float(header["deadline"]), self.usage)
            finally:
                marks["ended"] = time.monotonic()
                if done is None:
                    reaped = self.kill_all()
                else:  # nothing else of the run can write: answer now, reap after
                    reaped = None
                    self.signal_all()
                output.drain()
            died_alone = status is not None  # reaped before any kill of ours
            if status is None:
                status = reaped
            result["timed_out"] = timed_out
            result["truncated_out"], result["truncated_err"] = output.truncated[self.out_r], output.truncated[self.err_r]
            if done is not None:
                result["exit_code"] = done
                marks["done_reported"] = marks["ended"]
            elif timed_out or status is None:
                result["exit_code"] = -signal.SIGKILL
            elif died_alone and _cpu_limit_hit(status, self.usage.get("cpu_s", 0.0), int(header["cpu_s"])):
                # Out of CPU time is the same outcome as out of wall time: which one comes first
                # depends on how busy the machine is, and a transcript must not.
                result["exit_code"], result["timed_out"] = -signal.SIGKILL, True
            else:
                result["exit_code"] = os.waitstatus_to_exitcode(status)
            report = _parse_setup(output.reports())
            if "ready" in report:
                marks["ready"] = report["ready"]
            if "error" in report:
                result["setup_error"] = report["error"]
            if ctx.probe:
                result["probe"] = {
                    "applied": {**ctx.applied, **report.get("program", {})},
                    "errors": {**ctx.errors, **report.get("program_errors", {})},
                }
            if overlay:
                try:
                    notes, errors = _copyback.apply_upper(f"{ctx.mnt}/upper", real_fd)
                except OSError as exc:
                    notes, errors = [], [f"the workspace: {exc.strerror or type(exc).__name__}"]
                if notes:
                    result["notes"] = notes[:20]
                if errors:
                    result["copyback_errors"] = errors
            marks["copied_back"] = time.monotonic()
            return bytes(output.bufs[self.out_r]), bytes(output.bufs[self.err_r])
        finally:
            os.close(real_fd)

    def signal_all(self) -> None:
        """SIGKILL every process of the run (without waiting)."""
        if self.in_pidns:
            try:
                os.kill(-1, signal.SIGKILL)  # pid 1 of the run's namespace: every other process in it
            except ProcessLookupError:
                pass
        else:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _kill_children()

    def kill_all(self) -> int | None:
        """SIGKILL every process of the run and reap them; the program's status if reaped here."""
        status: int | None = None
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            self.signal_all()
            try:
                done, st, usage = os.wait3(os.WNOHANG)
            except ChildProcessError:
                break
            if done == self.pid:
                status = st
                self.usage["cpu_s"] = usage.ru_utime + usage.ru_stime
            elif done == 0:
                time.sleep(0.001)
        return status


def _grow_pipe(fd: int) -> None:
    """Room for a whole request (100k characters can be 400 kB of UTF-8) in one write."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _Output:
    """The program's stdout and stderr (each capped) and its setup report, read without blocking."""

    def __init__(self, out_r: int, err_r: int, setup_r: int, cap: int) -> None:
        self.caps = {out_r: cap, err_r: cap, setup_r: _SETUP_CAP}
        self.watched = (out_r, err_r)
        self.report = setup_r
        self.bufs = {fd: bytearray() for fd in self.caps}
        self.truncated = dict.fromkeys(self.caps, False)
        self.open = set(self.caps)
        for fd in self.caps:
            os.set_blocking(fd, False)

    def read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.open.discard(fd)
            os.close(fd)
            return
        buf = self.bufs[fd]
        room = self.caps[fd] - len(buf)
        if len(chunk) > room:
            self.truncated[fd] = True
        buf += chunk[: max(room, 0)]

    def capped(self) -> bool:
        return any(self.truncated[fd] for fd in self.watched)

    def reports(self) -> list[dict[str, Any]]:
        """The JSON lines of the program's report pipe (setup report first)."""
        found = []
        for line in bytes(self.bufs[self.report]).split(b"\n"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                found.append(obj)
        return found

    def done(self) -> int | None:
        """The exit code in the program's "done" line, once the setup report came before it."""
        if b"done" not in self.bufs[self.report]:
            return None
        reports = self.reports()
        if len(reports) < 2 or "ready" not in reports[0]:
            return None
        code = reports[1].get("done")
        return code if isinstance(code, int) and 0 <= code <= 255 else None

    def drain(self, timeout: float = 0.5) -> None:
        """After the run: read what is left of stdout and stderr, until end of file or ``timeout``.

        The report pipe is read only for what is already there: after a "done" the program may
        still hold it while it exits, and nothing after "done" matters.
        """
        if self.report in self.open:
            self.read(self.report)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            waiting = [fd for fd in self.open if fd != self.report]
            if not waiting:
                break
            ready, _, _ = select.select(waiting, [], [], max(0.0, end - time.monotonic()))
            for fd in ready:
                self.read(fd)
        for fd in self.open:
            os.close(fd)
        self.open.clear()


def _watch(pid: int, output: _Output, deadline: float, usage: dict[str, float]) -> tuple[int | None, bool, int | None]:
    """Until the program is done, the deadline passes or an output cap is hit.

    Returns (wait status if reaped, timed out, exit code the program reported as "done"). The
    report counts only while the program is this process's only child: then no other process of
    the run can still be writing to the workspace or the output.
    """
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in output.open:
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    status: int | None = None
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return status, True, None
            for fd, _ev in poller.poll(int(min(remaining, _POLL_S) * 1000) + 1):
                if fd != pidfd:
                    output.read(fd)
                    if fd not in output.open:
                        poller.unregister(fd)
            status = _reap(pid, status, usage)
            if status is not None or output.capped():
                return status, False, None
            done = output.done()
            if done is not None and _only_child():
                return None, False, done
    finally:
        os.close(pidfd)


def _only_child() -> bool:
    try:
        with open("/proc/thread-self/children") as f:
            return len(f.read().split()) == 1
    except OSError:
        return False


def _reap(pid: int, status: int | None, usage: dict[str, float]) -> int | None:
    """Reap every finished child; the program's wait status once it is among them (and its CPU
    seconds in ``usage``)."""
    while True:
        try:
            done, st, ru = os.wait3(os.WNOHANG)
        except ChildProcessError:
            return status
        if done == 0:
            return status
        if done == pid:
            status = st
            usage["cpu_s"] = ru.ru_utime + ru.ru_stime


def _cpu_limit_hit(status: int, cpu_s: float, limit: int) -> bool:
    """The program died of RLIMIT_CPU: SIGXCPU at the soft limit, or SIGKILL at the hard one."""
    if not os.WIFSIGNALED(status):
        return False
    sig = os.WTERMSIG(status)
    return sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limit)


def _kill_children() -> None:
    """Without a pid namespace: SIGKILL our children (orphans are reparented to us, a subreaper)."""
    try:
        with open("/proc/thread-self/children") as f:
            kids = [int(p) for p in f.read().split()]
    except OSError:
        kids = []
    for kid in kids:
        for kill in (os.killpg, os.kill):
            try:
                kill(kid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _parse_setup(reports: list[dict[str, Any]]) -> dict[str, Any]:
    if not reports:
        return {"error": "the program died while the sandbox was being set up"}
    return reports[0]
