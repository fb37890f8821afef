"""Watching one run from outside it: the request, the output caps, the deadline, the kill, the copy-back.

A warm slot (see :mod:`._zygote`) is a program process, locked down and waiting, plus, with a pid
namespace, the namespace's pid 1 (a sleeping placeholder whose death kills every process of the
run). The side that holds the slot's descriptors (the host, or the zygote for its probe) writes the
request, reads stdout and stderr up to their caps, SIGKILLs the run at the deadline, replays the
run's workspace changes from its tmpfs upper layer, and builds the result. The wall deadline
(``header["wall_s"]``) counts from the moment the program reports that its layers are on and the
agent's code starts, so a slow set-up on a busy machine never eats into the agent's time;
``header["deadline"]`` bounds the whole run, set-up included. The program never holds
any of these descriptors except its own output pipes, so nothing it prints can forge a result.

Stdlib only, and nothing from the ``simulators`` package: the zygote loads this file too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _copyback
from ._context import SETUP_FAILED
from ._protocol import encode_request, write_all

_POLL_S = 0.05
_SETUP_CAP = 65536
# Bounds on waits for the kernel (a killed run's teardown, its last output): generous, because on a
# busy machine they take longer, and they end as soon as the event they wait for happens.
_KILL_WAIT_S = 30.0
_DRAIN_WAIT_S = 5.0
#: names of a slot's descriptors, in the order the zygote sends them
SLOT_FDS = ("request", "out", "err", "report", "status", "prog", "pid1", "upper")


@dataclass
class Slot:
    """A warm run: its descriptors (-1 where absent) and the pids of its processes as this side's
    ``/proc`` shows them."""

    request: int
    out: int
    err: int
    report: int
    status: int
    prog: int
    pid1: int = -1
    upper: int = -1

    def __post_init__(self) -> None:
        self.prog_pid = pid_of(self.prog)
        self.pid1_pid = pid_of(self.pid1) if self.pid1 >= 0 else 0

    @classmethod
    def from_fds(cls, names: list[str], fds: list[int]) -> Slot:
        if len(names) != len(fds) or not set(names) <= set(SLOT_FDS) or not {"request", "out", "err", "report"} <= set(names):
            for fd in fds:
                os.close(fd)
            raise ValueError(f"a slot needs descriptors {SLOT_FDS}, got {names}")
        return cls(**dict(zip(names, fds)))

    def close(self) -> None:
        for name in SLOT_FDS:
            fd = getattr(self, name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, -1)


def pid_of(pidfd: int) -> int:
    """The pid of a pidfd in the pid namespace of this side's ``/proc``."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def supervise(
    slot: Slot,
    header: dict[str, Any],
    program: bytes,
    real_fd: int,
    tick: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], bytes, bytes, dict[str, Any]]:
    """Run ``program`` in ``slot``; (result header, stdout, stderr, the program's setup report).

    ``real_fd`` is the workspace directory (for the copy-back; -1: none). ``tick`` is called on every
    poll (the zygote reaps its children there during the probe). The caller closes the slot.
    """
    marks: dict[str, float] = {}
    result: dict[str, Any] = {"exit_code": SETUP_FAILED, "timed_out": False, "truncated_out": False, "truncated_err": False}
    try:
        write_all(slot.request, encode_request(header, program))
    except BrokenPipeError:
        pass  # the program died during its set-up; its report says why
    os.close(slot.request)
    slot.request = -1
    marks["go"] = time.monotonic()
    output = _Output(slot.out, slot.err, slot.report, int(header["output_bytes"]))
    slot.out = slot.err = slot.report = -1  # _Output closes them
    waiter = _Status(slot.status)
    slot.status = -1
    wall_s = float(header["wall_s"]) if "wall_s" in header else None
    timed_out, done = _watch(slot, output, waiter, float(header["deadline"]), wall_s, marks["go"], tick)
    marks["ended"] = time.monotonic()
    died_alone = waiter.status is not None  # the program ended before any kill of ours
    if done is not None:
        _signal_all(slot)  # nothing of the run can still write: answer now, the kernel reaps after
    else:
        _kill_and_wait(slot, waiter, tick)
    output.drain(_DRAIN_WAIT_S)
    result["timed_out"] = timed_out
    result["truncated_out"], result["truncated_err"] = output.truncated[output.out], output.truncated[output.err]
    status = waiter.status
    if done is not None:
        result["exit_code"] = done
    elif timed_out or status is None:
        result["exit_code"] = -signal.SIGKILL
    elif died_alone and _cpu_limit_hit(status, waiter.cpu_s, int(header["cpu_s"])):
        # Out of CPU time is the same outcome as out of wall time: which one comes first
        # depends on how busy the machine is, and a transcript must not.
        result["exit_code"], result["timed_out"] = -signal.SIGKILL, True
    else:
        result["exit_code"] = os.waitstatus_to_exitcode(status)
    waiter.close()
    reports = output.reports()
    report: dict[str, Any] = reports[0] if reports else {"error": "the program died while the sandbox was being set up"}
    if waiter.lost and done is None:
        report = {**report, "error": "the sandbox zygote died during the run (the next run starts a new one)"}
    for mark in ("prepared", "ready"):  # written by the sandbox before any agent code runs
        value = report.get(mark)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            marks[mark] = float(value)
    if "error" in report:
        result["setup_error"] = report["error"]
    if slot.upper >= 0 and real_fd >= 0 and report.get("overlay"):
        try:
            notes, errors = _copyback.apply_upper_fd(slot.upper, real_fd)
        except OSError as exc:
            notes, errors = [], [f"the workspace: {exc.strerror or type(exc).__name__}"]
        if notes:
            result["notes"] = notes[:20]
        if errors:
            result["copyback_errors"] = errors
    marks["copied_back"] = time.monotonic()
    result["marks"] = marks
    return result, bytes(output.bufs[output.out]), bytes(output.bufs[output.err]), report


def _signal_all(slot: Slot) -> None:
    """SIGKILL every process of the run, without waiting."""
    if slot.pid1 >= 0:
        try:
            signal.pidfd_send_signal(slot.pid1, signal.SIGKILL)  # pid 1: the kernel kills the whole namespace
        except ProcessLookupError:
            pass
        return
    for kill, target in ((os.killpg, slot.prog_pid), (signal.pidfd_send_signal, slot.prog)):
        try:
            kill(target, signal.SIGKILL)  # type: ignore[operator]
        except (ProcessLookupError, PermissionError, OSError):
            pass
    for kid in _descendants(slot.prog_pid):  # the program is a subreaper: orphans of its children are its own
        try:
            os.kill(kid, signal.SIGKILL)
        except OSError:
            pass


def _kill_and_wait(slot: Slot, waiter: _Status, tick: Callable[[], None] | None) -> None:
    """SIGKILL the run and wait until it is gone: pid 1 exits only after every other process of its
    namespace did; the program's status comes from the zygote once it reaped it."""
    end = time.monotonic() + _KILL_WAIT_S
    _signal_all(slot)
    while time.monotonic() < end:
        if tick is not None:
            tick()
        waiter.poll()
        gone = slot.pid1 < 0 or select.select([slot.pid1], [], [], 0)[0]
        if gone and waiter.fd < 0:
            return
        if slot.pid1 < 0 and not gone:
            _signal_all(slot)
        select.select([fd for fd in (slot.pid1 if slot.pid1 >= 0 else slot.prog, waiter.fd) if fd >= 0], [], [], 0.01)


class _Status:
    """The program's wait status and CPU seconds, written by the zygote when it reaps the program."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.status: int | None = None
        self.cpu_s = 0.0
        self.lost = False  # the pipe closed without a status: the zygote is gone
        self._buf = b""

    def poll(self) -> None:
        if self.fd < 0 or self.status is not None:
            return
        if not select.select([self.fd], [], [], 0)[0]:
            return
        chunk = os.read(self.fd, 64)
        self._buf += chunk
        if not chunk:
            parts = self._buf.split()
            if len(parts) == 2:
                self.status, self.cpu_s = int(parts[0]), float(parts[1])
            else:
                self.lost = True
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _watch(
    slot: Slot,
    output: _Output,
    waiter: _Status,
    deadline: float,
    wall_s: float | None,
    go: float,
    tick: Callable[[], None] | None,
) -> tuple[bool, int | None]:
    """Until the program is done, dies, the deadline passes or an output cap is hit.

    ``deadline`` bounds the whole run; once the program's set-up report says it is ready, the run
    ends ``wall_s`` seconds after that (when ``wall_s`` is given). Returns (timed out, exit code the
    program reported as "done"). The report counts only once no other process of the run exists
    (see :func:`_quiet`): none can then still write to the workspace or the output.
    """
    ready_seen = wall_s is None
    poller = select.poll()
    for fd in output.open:
        poller.register(fd, select.POLLIN)
    if waiter.fd >= 0:
        poller.register(waiter.fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True, None
        for fd, _ev in poller.poll(int(min(remaining, _POLL_S) * 1000) + 1):
            if fd == waiter.fd:
                waiter.poll()
                if waiter.fd < 0:
                    poller.unregister(fd)
            else:
                output.read(fd)
                if fd not in output.open:
                    poller.unregister(fd)
        if tick is not None:
            tick()
            waiter.poll()
        if waiter.status is not None or waiter.lost or output.capped():
            return False, None
        if not ready_seen:
            ready = output.ready()
            if ready is not None:  # the agent's code starts now: its wall time starts too
                ready_seen = True
                deadline = min(deadline, min(max(ready, go), time.monotonic()) + float(wall_s or 0.0))
        done = output.done()
        if done is not None and _quiet(slot):
            return False, done


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = [pid]
    while stack and len(found) < 4096:
        for kid in _children(stack.pop()):
            found.append(kid)
            stack.append(kid)
    return found


def _quiet(slot: Slot) -> bool:
    """No process of the run besides the program's last thread (and, with a pid namespace, pid 1)."""
    if not select.select([slot.prog], [], [], 0)[0]:  # the program is still there
        try:
            if len(os.listdir(f"/proc/{slot.prog_pid}/task")) > 1:
                return False
        except OSError:
            pass
        if _children(slot.prog_pid):
            return False
    return not (slot.pid1_pid and _children(slot.pid1_pid))


def _cpu_limit_hit(status: int, cpu_s: float, limit: int) -> bool:
    """The program died of RLIMIT_CPU: SIGXCPU at the soft limit, or SIGKILL at the hard one."""
    if not os.WIFSIGNALED(status):
        return False
    sig = os.WTERMSIG(status)
    return sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limit)


class _Output:
    """The program's stdout and stderr (each capped) and its setup report, read without blocking."""

    def __init__(self, out_r: int, err_r: int, report_r: int, cap: int) -> None:
        self.out, self.err, self.report = out_r, err_r, report_r
        self.caps = {out_r: cap, err_r: cap, report_r: _SETUP_CAP}
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
        return self.truncated[self.out] or self.truncated[self.err]

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

    def ready(self) -> float | None:
        """When the program said its set-up was done (its first report line), if it has said so.

        Only the first line counts: the sandbox writes it before any agent code runs."""
        buf = self.bufs[self.report]
        end = buf.find(b"\n")
        if end < 0:
            return None
        try:
            first = json.loads(bytes(buf[:end]))
        except ValueError:
            return None
        ready = first.get("ready") if isinstance(first, dict) else None
        return float(ready) if isinstance(ready, (int, float)) and not isinstance(ready, bool) else None

    def done(self) -> int | None:
        """The exit code in the program's "done" line, once the setup report came before it."""
        if b"done" not in self.bufs[self.report]:
            return None
        reports = self.reports()
        if len(reports) < 2 or "ready" not in reports[0]:
            return None
        code = reports[1].get("done")
        return code if isinstance(code, int) and 0 <= code <= 255 else None

    def drain(self, timeout: float = _DRAIN_WAIT_S) -> None:
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
