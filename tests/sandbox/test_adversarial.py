"""Hostile programs against :class:`SandboxRunner` (issue #4): each one is contained.

Every case runs in a fresh workspace ``ws`` next to an empty directory ``outside`` and a directory
``secret`` holding ``key.txt``; ``{outside}``, ``{secret}``, ``{ws}``, ``{marker}`` and ``{host_pid}``
in the code are replaced by their values. After each case: the case's own assertion on the result,
then the runner still serves a benign program, no process of the run survives (the zygote's tree
is back to its idle size and no process carries the case's marker), ``outside`` is still empty and
``secret`` was not read.

Every case runs twice: on a runner of its own, and through a lease on a shared service (issue #16)
while another lease's run (another env's) is going on in that service; after each case that run
must still be alive and its workspace untouched, and at the end it finishes with the right answer.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from simulators.python import PythonResult, RunLimits
from simulators.python.sandbox import FULL, SandboxRunner
from simulators.python.sandbox.shared import SharedSandbox
from tests.procs import with_marker

from .conftest import SUITE_LIMITS, WAIT_S, Dirs, assert_no_leftovers, need, wait_for

Check = Callable[[PythonResult, Dirs], None]


@dataclass
class Case:
    id: str
    code: str
    check: Check
    limits: dict[str, Any] = field(default_factory=dict)
    marks: tuple[Any, ...] = ()


# -- expectations ----------------------------------------------------------------------------------


def timed_out(res: PythonResult, d: Dirs) -> None:
    assert res.timed_out is True, res
    assert res.exit_code == -signal.SIGKILL
    assert res.elapsed_s < 60.0  # a hang detector, not a speed check


def raises(*names: str) -> Check:
    def check(res: PythonResult, d: Dirs) -> None:
        assert res.exit_code == 1, res
        assert any(name in res.stderr for name in names), res.stderr[-2000:]
        assert 'File "<agent>"' in res.stderr or "Error" in res.stderr

    return check


def prints(text: str, code: int = 0) -> Check:
    def check(res: PythonResult, d: Dirs) -> None:
        assert res.exit_code == code, res
        assert text in res.stdout, res

    return check


def exit_code(code: int) -> Check:
    def check(res: PythonResult, d: Dirs) -> None:
        assert res.exit_code == code, res

    return check


def either(*checks: Check) -> Check:
    def check(res: PythonResult, d: Dirs) -> None:
        errors = []
        for c in checks:
            try:
                c(res, d)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(" | ".join(errors))

    return check


def truncated_stdout(res: PythonResult, d: Dirs) -> None:
    assert res.output_truncated is True and res.timed_out is False, res.stderr
    assert res.stdout.endswith("\n[output truncated]")
    assert len(res.stdout.encode()) <= SUITE_LIMITS.output_bytes + 64


def truncated_stderr(res: PythonResult, d: Dirs) -> None:
    assert res.output_truncated is True and res.timed_out is False, res.stdout
    assert res.stderr.endswith("\n[output truncated]")


def no_core_file(res: PythonResult, d: Dirs) -> None:
    assert res.exit_code == -signal.SIGABRT, res
    assert not [p for p in d.ws.iterdir() if p.name.startswith("core")]


def workspace_capped(max_files: int, max_bytes: int) -> Check:
    def check(res: PythonResult, d: Dirs) -> None:
        assert res.exit_code == 1 and not res.timed_out, res
        assert "No space left" in res.stderr or "Disk quota" in res.stderr, res.stderr[-500:]
        files = [p for p in d.ws.rglob("*") if p.is_file()]
        assert len(files) <= max_files
        assert sum(p.stat().st_size for p in files) <= max_bytes

    return check


def secret_not_printed(res: PythonResult, d: Dirs) -> None:
    assert "s3cr3t" not in res.stdout + res.stderr
    assert "AGENTRL_HOST_SECRET" not in res.stdout + res.stderr


def denied(res: PythonResult, d: Dirs) -> None:
    assert res.exit_code == 1, res
    assert "PermissionError" in res.stderr or "Operation not permitted" in res.stderr, res.stderr[-1500:]
    secret_not_printed(res, d)


def syscall_denied(errno_name: str) -> Check:
    return prints(f"result=-1 errno={errno_name}")


def _ctypes_syscall(nr: int, *args: int) -> str:
    arglist = "".join(f", ctypes.c_long({a})" for a in args)
    return (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        f"r = libc.syscall(ctypes.c_long({nr}){arglist})\n"
        "print(f'result={r} errno={errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}')\n"
    )


def _sleeper_daemon() -> str:
    return (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.close(1); os.close(2)\n"
        "        os.execv('/bin/sleep', ['{marker}', '1000'])\n"
        "    os._exit(0)\n"
        "import time; time.sleep(0.2)\n"
        "print('parent done')\n"
    )


FAST = {"wall_s": 1.0}

CASES: list[Case] = [
    # -- time and CPU -----------------------------------------------------------------------------
    Case("cpu_spin", "while True:\n    pass\n", timed_out, FAST),
    Case("sleep", "import time\ntime.sleep(60)\n", timed_out, FAST),
    Case(
        "ignores_signals",
        "import signal\nfor s in (1, 2, 3, 15):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n",
        timed_out,
        FAST,
    ),
    Case("sigstop_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n", timed_out, FAST),
    Case("huge_power", "x = 10**(10**8)\nprint(len(str(x)))\n", either(timed_out, raises("ValueError", "MemoryError")), FAST),
    # The CPU limit and the wall deadline are one outcome (a timeout), whichever comes first.
    Case("cpu_rlimit", "while True:\n    pass\n", timed_out, {"wall_s": 30.0, "cpu_s": 1}),
    Case(
        "cpu_rlimit_sigxcpu_ignored",
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n",
        timed_out,
        {"wall_s": 30.0, "cpu_s": 1},
    ),
    # -- memory -----------------------------------------------------------------------------------
    Case("memory_bomb", "blob = bytearray(2**40)\n", raises("MemoryError")),
    Case("unbounded_growth", "x = []\nwhile True:\n    x.append(' ' * 10**7)\n", either(raises("MemoryError"), timed_out)),
    Case("mmap_bomb", "import mmap\nm = mmap.mmap(-1, 2**36)\n", raises("OSError", "MemoryError")),
    Case(
        "memory_across_children",
        # each child maps (and touches one byte per MiB of) 400 MiB under a 512 MiB per-process cap
        "import mmap, os\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n        try:\n"
        "            m = mmap.mmap(-1, 400 << 20)\n            for i in range(0, 400 << 20, 1 << 20):\n                m[i] = 1\n"
        "        finally:\n            os._exit(0)\n    kids.append(pid)\nfor k in kids:\n    os.waitpid(k, 0)\nprint('done')\n",
        prints("done"),
        {"wall_s": 60.0, "cpu_s": 30},
    ),
    # -- processes and threads --------------------------------------------------------------------
    Case(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        either(timed_out, exit_code(-signal.SIGKILL)),
        FAST,
    ),
    Case("double_forked_daemon", _sleeper_daemon(), prints("parent done")),
    Case(
        "background_child_outlives_program",
        "import subprocess\nsubprocess.Popen(['{marker}', '1000'], executable='/bin/sleep', stdout=subprocess.DEVNULL)\nprint('bye')\n",
        prints("bye"),
    ),
    Case(
        "child_in_new_session_at_timeout",
        "import subprocess, time\nsubprocess.Popen(['{marker}', '1000'], executable='/bin/sleep', start_new_session=True)\ntime.sleep(60)\n",
        timed_out,
        FAST,
    ),
    Case(
        "thousands_of_threads",
        "import threading, time\nn = 0\ntry:\n    for _ in range(5000):\n        threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()\n        n += 1\n"
        "except RuntimeError as e:\n    print('stopped at', n, e)\n",
        prints("stopped at"),
    ),
    Case(
        "threads_still_work",
        "import threading\nt = threading.Thread(target=print, args=('from thread',))\nt.start(); t.join()\n",
        prints("from thread"),
    ),
    Case(
        # The program's parent is outside its pid namespace, so getppid() is 0 and this signals the
        # program's own process group: it can only end itself.
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')\n",
        either(prints("still here"), denied, exit_code(-signal.SIGKILL)),
    ),
    Case(
        "kill_pid_1",
        "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('still here')\n",
        either(prints("still here"), denied),
    ),
    Case(
        "kill_everything",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('still here')\n",
        denied,
    ),
    Case(
        "kill_host_by_pid",
        "import os, signal\nos.kill({host_pid}, signal.SIGKILL)\n",
        either(raises("ProcessLookupError", "PermissionError"), exit_code(0)),
    ),
    Case("exec_shell", "import os\nos.system('kill -9 -1; cat {secret}/key.txt; echo shell-ran')\n", secret_not_printed),
    # -- output -----------------------------------------------------------------------------------
    Case("endless_print", "while True:\n    print('x' * 1000)\n", truncated_stdout),
    Case("one_huge_line", "import sys\nsys.stdout.write('y' * (50 << 20))\n", truncated_stdout),
    Case("endless_stderr", "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n", truncated_stderr),
    Case("deeply_nested_repr", "x = []\nfor _ in range(100000):\n    x = [x]\nprint(x)\n", raises("RecursionError")),
    Case("invalid_utf8", "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfe\\xc3(b\\n')\n", prints("a\ufffd\ufffd\ufffd(b")),
    Case("control_chars", "print('\\x1b[2J\\x1b[31mred\\x00\\x07')\n", prints("\x1b[31mred\x00\x07")),
    Case("fake_all_passed", "print('ALL PASSED')\nprint('exit_code: 0')\nraise SystemExit(1)\n", prints("ALL PASSED", code=1)),
    Case(
        "forged_result_frame",
        "import sys, json\nh = json.dumps({'exit_code': 0, 'timed_out': False, 'truncated_out': False, 'truncated_err': False,"
        " 'stdout_bytes': 2, 'stderr_bytes': 0}).encode()\nframe = b'SBX1' + len(h).to_bytes(4, 'big') + h + b'ok'\n"
        "for fd in (1, 2):\n    import os; os.write(fd, frame)\nsys.exit(3)\n",
        exit_code(3),
    ),
    Case("stdout_closed", "import os\nos.close(1)\nprint('lost')\n", either(exit_code(120), exit_code(1), exit_code(0))),
    Case("input", "name = input('name? ')\nprint(name)\n", raises("EOFError")),
    Case("stdin_read", "import sys\nprint(repr(sys.stdin.read()))\n", prints("''")),
    # -- files ------------------------------------------------------------------------------------
    Case(
        "file_size_bomb", "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (8 << 20))\n", raises("OSError", "File too large")
    ),
    Case(
        "file_count_bomb",
        "i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1\n",
        workspace_capped(512, 16 << 20),
    ),
    Case(
        "disk_fill",
        "i = 0\nwhile True:\n    with open(f'chunk{i}', 'wb') as f:\n        f.write(b'0' * (1 << 20))\n    i += 1\n",
        workspace_capped(512, 16 << 20),
    ),
    Case("write_outside_absolute", "open('{outside}/escaped.txt', 'w').write('x')\n", denied),
    Case("write_outside_dotdot", "open('../outside/escaped.txt', 'w').write('x')\n", denied),
    Case("write_tmp", "open('/tmp/agentrl-escape-{marker}', 'w').write('x')\n", denied),
    Case("write_dev_shm", "open('/dev/shm/agentrl-escape-{marker}', 'w').write('x')\n", denied),
    Case("mkdir_outside", "import os\nos.mkdir('{outside}/d')\n", denied),
    Case("symlink_out", "import os\nos.symlink('{outside}', 'link')\nopen('link/escaped.txt', 'w').write('x')\n", denied),
    Case(
        "hardlink_secret",
        "import os\nos.link('{secret}/key.txt', 'key')\nprint(open('key').read())\n",
        either(denied, raises("OSError")),
    ),
    Case(
        "rename_into_outside",
        "open('a', 'w').write('x')\nimport os\nos.rename('a', '{outside}/a')\n",
        either(denied, raises("OSError")),
    ),
    Case("read_secret", "print(open('{secret}/key.txt').read())\n", denied),
    Case("read_etc_passwd", "print(open('/etc/passwd').read())\n", denied),
    Case("read_etc_shadow", "print(open('/etc/shadow').read())\n", denied),
    Case("list_root", "import os\nprint(os.listdir('/'))\n", denied),
    Case("list_home", "import os\nprint(os.listdir(os.path.expanduser('~/..')))\n", denied),
    Case("proc_1_environ", "print(open('/proc/1/environ', 'rb').read())\n", denied),
    Case("proc_host_environ", "print(open('/proc/{host_pid}/environ', 'rb').read())\n", denied),
    Case("proc_host_mem", "f = open('/proc/{host_pid}/mem', 'rb')\n", denied),
    Case("proc_sys_write", "open('/proc/sys/kernel/core_pattern', 'w').write('|/bin/sh')\n", denied),
    Case(
        "environment_secrets",
        "import os, json\nprint(json.dumps(dict(os.environ)))\nprint(open('/proc/self/environ', 'rb').read())\n",
        secret_not_printed,
    ),
    Case(
        "exec_from_workspace",
        "import shutil, os\nshutil.copy('/bin/true', 'mytrue')\nos.chmod('mytrue', 0o755)\nos.execv('./mytrue', ['mytrue'])\n",
        denied,
    ),
    # -- executing what the program wrote: memfds are never executable ----------------------------
    Case("memfd_default_flags", "import os\nos.memfd_create('x')\n", denied),
    Case("memfd_exec_flag", "import os\nos.memfd_create('x', 0x10)\n", denied),  # MFD_EXEC
    Case("memfd_raw_syscall", _ctypes_syscall(319, 0, 0), syscall_denied("EPERM")),
    Case(
        "memfd_noexec_exec_proc_path",
        "import os\nfd = os.memfd_create('x', os.MFD_CLOEXEC | 8)\nos.write(fd, open('/bin/true', 'rb').read())\n"
        "os.execv(f'/proc/self/fd/{fd}', ['t'])\n",
        denied,
    ),
    Case(
        "memfd_noexec_fexecve",
        "import os\nfd = os.memfd_create('x', 8)\nos.write(fd, open('/bin/true', 'rb').read())\nos.execve(fd, ['t'], {})\n",
        denied,
    ),
    Case(
        "memfd_noexec_chmod_then_exec",
        "import os\nfd = os.memfd_create('x', 8)\nos.write(fd, open('/bin/true', 'rb').read())\nos.fchmod(fd, 0o755)\n"
        "os.execve(fd, ['t'], {})\n",
        denied,
    ),
    Case(
        "memfd_noexec_for_data",
        "import os\nfd = os.memfd_create('x', 8)\nos.write(fd, b'data')\nos.lseek(fd, 0, 0)\nprint(os.read(fd, 4))\n",
        prints("b'data'"),
    ),
    Case("memfd_secret", _ctypes_syscall(447, 0), syscall_denied("EPERM")),
    Case("setuid_bit", "open('s', 'w').close()\nimport os\nos.chmod('s', 0o4755)\n", denied),
    Case("mkfifo", "import os\nos.mkfifo('fifo')\n", denied),
    Case("fd_exhaustion", "fs = [open('/dev/null') for _ in range(100000)]\n", raises("OSError", "Too many open files")),
    Case("core_dump", "import os\nos.abort()\n", no_core_file),
    Case("segfault", "import ctypes\nctypes.string_at(0)\n", exit_code(-signal.SIGSEGV)),
    Case("deep_recursion", "def r():\n    return r()\nr()\n", raises("RecursionError")),
    Case(
        "deep_recursion_no_limit",
        "import sys\nsys.setrecursionlimit(10**7)\ndef r():\n    return r()\nr()\n",
        either(exit_code(-signal.SIGSEGV), raises("RecursionError", "MemoryError"), timed_out),
        FAST,
    ),
    # -- network ----------------------------------------------------------------------------------
    Case("loopback_connect", "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n", denied),
    Case("remote_connect", "import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=1)\n", denied),
    Case("dns", "import socket\nprint(socket.getaddrinfo('example.com', 80))\n", raises("gaierror", "PermissionError")),
    Case("udp", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 53))\n", denied),
    Case("ipv6", "import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n", denied),
    Case("unix_socket", "import socket\nsocket.socket(socket.AF_UNIX).connect('/run/systemd/private')\n", denied),
    Case("netlink", "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n", denied),
    Case("packet", "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)\n", denied),
    Case("vsock", "import socket\nsocket.socket(40, socket.SOCK_STREAM)\n", denied),
    Case("socketpair_ok", "import socket\na, b = socket.socketpair()\na.send(b'hi')\nprint(b.recv(2))\n", prints("b'hi'")),
    # -- kernel attack surface (raw syscalls through ctypes; x86_64 numbers) -------------------------
    Case("ctypes_unshare_user", _ctypes_syscall(272, 0x10000000), syscall_denied("EPERM")),
    Case("ctypes_unshare_net", _ctypes_syscall(272, 0x40000000), syscall_denied("EPERM")),
    Case("ctypes_setns", _ctypes_syscall(308, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_ptrace_traceme", _ctypes_syscall(101, 0, 0, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_ptrace_attach_parent", _ctypes_syscall(101, 16, 1, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_mount", _ctypes_syscall(165, 0, 0, 0, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_bpf", _ctypes_syscall(321, 0, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_io_uring", _ctypes_syscall(425, 8, 0), syscall_denied("EPERM")),
    Case("ctypes_keyctl", _ctypes_syscall(250, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_perf_event_open", _ctypes_syscall(298, 0, 0, -1, -1, 0), syscall_denied("EPERM")),
    Case("ctypes_userfaultfd", _ctypes_syscall(323, 0), syscall_denied("EPERM")),
    Case("ctypes_process_vm_readv", _ctypes_syscall(310, 1, 0, 0, 0, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_clone_newpid", _ctypes_syscall(56, 0x20000000 | 17, 0, 0, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_clone3", _ctypes_syscall(435, 0, 0), syscall_denied("ENOSYS")),
    Case("ctypes_reboot", _ctypes_syscall(169, 0, 0, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_settime", _ctypes_syscall(227, 0, 0), syscall_denied("EPERM")),
    Case("ctypes_init_module", _ctypes_syscall(175, 0, 0, 0), syscall_denied("EPERM")),
    Case(
        "raise_rlimit",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n",
        raises("ValueError", "PermissionError"),
    ),
    Case(
        "capabilities_gone",
        "print([l for l in open('/proc/self/status') if l.startswith('CapEff')])\n",
        prints("0000000000000000"),
    ),
    Case(
        "sysv_shm_leak",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nshmid = libc.shmget(0, 64 << 20, 0o1000 | 0o600)\nprint('shmid', shmid)\n",
        prints("shmid"),
    ),
    Case("import_site_packages", "import httpx\n", raises("ModuleNotFoundError", "PermissionError", "ImportError")),
]


@pytest.fixture(scope="module")
def tcp_server() -> Any:
    """A loopback server on the host that counts the connections it accepts."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    accepted: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    thread.join()
    srv.close()


def _shm_segments() -> dict[int, int]:
    """System V segments of the host's IPC namespace: shmid -> creator pid."""
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {int(row[1]): int(row[4]) for row in rows if len(row) > 4}


def _segments_left_by_runs(before: dict[int, int]) -> list[int]:
    """New segments whose creator is gone: a run's (its processes are all dead by now). Segments of
    live processes are other programs' on this machine (a PostgreSQL server of another test), and a
    creator pid of 0 is a process this namespace cannot see (a run's would be visible here)."""
    now = _shm_segments()
    return [shmid for shmid, cpid in now.items() if shmid not in before and cpid > 0 and not os.path.exists(f"/proc/{cpid}")]


@dataclass
class Neighbour:
    """Another env's run, going on in the shared service while the cases run through another lease."""

    lease: SharedSandbox
    ws: Path
    marker: str
    thread: threading.Thread
    outcome: dict[str, PythonResult]

    def processes(self) -> int:
        """Its processes in the service's tree: its pid 1 (with a pid namespace), its program, its child."""
        return 3 if self.lease.layers.get("pidns") else 2

    def assert_untouched(self) -> None:
        assert self.thread.is_alive() and with_marker(self.marker), f"the other env's run ended: {self.outcome}"
        assert sorted(os.listdir(self.ws)) == ["data.txt"], os.listdir(self.ws)
        assert (self.ws / "data.txt").read_text() == "the other env's data\n"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SharedSandbox, Neighbour]]:
    """Lease A (for the cases) and a neighbour's run on lease B, both on one shared service."""
    settings = {"workspace_bytes": 16 << 20, "workspace_files": 512}  # the session runner's caps
    a, b = (SharedSandbox(SUITE_LIMITS, scope="process", **settings) for _ in "ab")  # type: ignore[arg-type]
    try:
        if a.tier != FULL:
            need(a.runner, *a.missing)
        assert a.runner is b.runner
        ws = tmp_path_factory.mktemp("neighbour")
        (ws / "data.txt").write_text("the other env's data\n")
        marker = f"agentrl-sbx-neighbour-{os.getpid()}-{time.monotonic_ns()}"
        outcome: dict[str, PythonResult] = {}
        code = (
            "import subprocess\nopen('mine.txt', 'w').write('kept')\n"
            f"subprocess.run([{marker!r}, 'infinity'], executable='/bin/sleep')\nprint(open('data.txt').read(), end='')\n"
        )
        limits = RunLimits(**{**SUITE_LIMITS.__dict__, "wall_s": 3600.0})

        def run() -> None:
            outcome["res"] = b.run(code, str(ws), limits)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_for(lambda: with_marker(marker) or not thread.is_alive(), "the other env's run to start")
        neighbour = Neighbour(b, ws, marker, thread, outcome)
        neighbour.assert_untouched()
        yield a, neighbour
        for pid in with_marker(marker):  # its child ends: the neighbour's program finishes
            os.kill(pid, signal.SIGKILL)
        thread.join(WAIT_S)
        res = outcome.get("res")
        assert res is not None and (res.exit_code, res.stdout) == (0, "the other env's data\n"), res
        assert (ws / "mine.txt").read_text() == "kept"
    finally:
        a.close()
        b.close()


X86_ONLY = pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers of x86_64")
for _case in CASES:
    if _case.id.startswith("ctypes_"):
        _case.marks = (X86_ONLY,)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
@pytest.mark.parametrize("where", ["own", "shared"])
def test_hostile_program_is_contained(
    where: str, dirs: Dirs, case: Case, tcp_server: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    neighbour: Neighbour | None = None
    if where == "own":
        full: SandboxRunner | SharedSandbox = request.getfixturevalue("full")
        service: SandboxRunner = full  # type: ignore[assignment]
    else:
        full, neighbour = request.getfixturevalue("shared")
        service = full.runner  # type: ignore[union-attr]
    monkeypatch.setenv("AGENTRL_HOST_SECRET", "s3cr3t-env")
    port, accepted = tcp_server
    code = case.code
    for key, value in {
        "outside": dirs.outside,
        "secret": dirs.secret,
        "ws": dirs.ws,
        "marker": dirs.marker,
        "host_pid": os.getpid(),
        "port": port,
    }.items():
        code = code.replace("{" + key + "}", str(value))
    shm_before = _shm_segments()
    limits = RunLimits(**{**SUITE_LIMITS.__dict__, **case.limits})
    res = full.run(code, str(dirs.ws), limits)
    case.check(res, dirs)
    # the runner still serves, nothing survived, nothing escaped
    benign = full.run("print(6 * 7)", str(dirs.ws))
    assert (benign.exit_code, benign.stdout, benign.stderr) == (0, "42\n", ""), benign
    assert_no_leftovers(service, dirs.marker, others=neighbour.processes() if neighbour else 0)
    assert os.listdir(dirs.outside) == []
    assert not Path(f"/tmp/agentrl-escape-{dirs.marker}").exists()
    assert not Path(f"/dev/shm/agentrl-escape-{dirs.marker}").exists()
    assert not accepted, "a sandboxed program reached the host's loopback server"
    assert not _segments_left_by_runs(shm_before), "a System V shared memory segment outlived the run"
    for path in dirs.ws.rglob("*"):
        assert not path.is_symlink() and (path.is_file() or path.is_dir()), f"{path} is not a plain file"
        assert not path.stat().st_mode & 0o6000, f"{path} has a setuid/setgid bit"
    if neighbour is not None:
        neighbour.assert_untouched()


def test_case_count() -> None:
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)
