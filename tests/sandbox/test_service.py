"""The machine's sandbox service (issue #16, item 3): one per user, shared by processes.

Runs of two client processes cannot see or touch each other's workspace or run; the adversarial
suite (all but two CPU-rlimit cases) through a cross-process lease, while another process's run goes on in the
same service; hostile peers on the socket (garbage, huge and cut frames, another uid, another pid
namespace, a hang-up mid-run) lose only their own connection; the service stops when its last
lease is gone, and a lease whose service died starts a new one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from simulators.python import RunLimits
from simulators.python.sandbox import FULL
from simulators.python.sandbox._protocol import recv_json_with_fds, send_json
from simulators.python.sandbox.host import SandboxError, idle_processes
from simulators.python.sandbox.service import DIR_ENV, IDLE_ENV, SCOPE_ENV, ServiceLease
from tests.procs import alive, descendants, with_marker

from .conftest import SUITE_LIMITS, WAIT_S, Dirs, need, neighbour_probe, wait_for
from .test_adversarial import CASES, Case, _segments_left_by_runs, _shm_segments, tcp_server  # noqa: F401 - a fixture

SETTINGS: dict[str, Any] = {"workspace_bytes": 16 << 20, "workspace_files": 512}  # the adversarial suite's caps
ROOT = str(Path(__file__).resolve().parents[2])


def _private_dir() -> str:
    return tempfile.mkdtemp(prefix="sbxsvc-")  # short: a Unix socket path has at most 107 bytes


@pytest.fixture(scope="module")
def service_env() -> Iterator[str]:
    """This module's services live in a private directory and stop as soon as they are idle."""
    path = _private_dir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DIR_ENV, path)
        mp.setenv(IDLE_ENV, "0")
        mp.delenv(SCOPE_ENV, raising=False)
        yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def lease(service_env: str) -> Iterator[ServiceLease]:
    """A lease held for the whole module (the service stays up between tests)."""
    held = ServiceLease(SUITE_LIMITS, **SETTINGS)
    if held.tier != FULL:
        need(held, *held.missing)  # type: ignore[arg-type]
    yield held
    held.close()


# -- a client in another process ------------------------------------------------------------------

_CLIENT = """
import dataclasses, json, sys
from simulators.python import RunLimits
from simulators.python.sandbox.service import ServiceLease
settings, limits, code, ws = json.loads(sys.stdin.readline())
lease = ServiceLease(RunLimits(**limits), **settings)
print(json.dumps({"service_pid": lease.service_pid}), flush=True)
print(json.dumps(dataclasses.asdict(lease.run(code, ws))), flush=True)
lease.close()
"""


@dataclass
class OtherProcess:
    """A client process with one long run in the service: its child sleeps until the test ends it."""

    proc: subprocess.Popen[str]
    ws: Path
    marker: str
    service_pid: int

    def assert_untouched(self) -> None:
        assert self.proc.poll() is None and with_marker(self.marker), "the other process's run ended"
        assert sorted(os.listdir(self.ws)) == ["data.txt"], os.listdir(self.ws)  # its writes come back when it ends
        assert (self.ws / "data.txt").read_text() == "the other process's data\n"

    def finish(self) -> dict[str, Any]:
        for pid in with_marker(self.marker):  # its child ends: its program prints and exits
            os.kill(pid, signal.SIGKILL)
        out, err = self.proc.stdout.read(), self.proc.stderr.read()  # type: ignore[union-attr]
        self.proc.wait(timeout=WAIT_S)
        assert self.proc.returncode == 0, err
        return dict(json.loads(out.splitlines()[-1]))


def start_other_process(ws: Path, marker: str) -> OtherProcess:
    (ws / "data.txt").write_text("the other process's data\n")
    code = (
        "import subprocess\nopen('mine.txt', 'w').write('kept')\n"
        f"subprocess.run([{marker!r}, 'infinity'], executable='/bin/sleep')\nprint(open('data.txt').read(), end='')\n"
    )
    limits = {**SUITE_LIMITS.__dict__, "wall_s": 3600.0}
    arg = json.dumps([SETTINGS, limits, code, str(ws)])
    proc = subprocess.Popen(  # the code comes on stdin: the marker must name the run's child only
        [sys.executable, "-c", _CLIENT],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(arg + "\n")
    proc.stdin.close()
    first = proc.stdout.readline()
    assert first, proc.communicate()[1]
    other = OtherProcess(proc, ws, marker, int(json.loads(first)["service_pid"]))
    wait_for(lambda: with_marker(marker) or proc.poll() is not None, "the other process's run to start")
    return other


@pytest.fixture(scope="module")
def other(lease: ServiceLease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtherProcess]:
    ws = tmp_path_factory.mktemp("other")
    neighbour = start_other_process(ws, f"agentrl-svc-other-{os.getpid()}-{id(ws)}")
    try:
        assert neighbour.service_pid == lease.service_pid  # one service for both processes
        neighbour.assert_untouched()
        yield neighbour
        result = neighbour.finish()
        assert (result["exit_code"], result["stdout"]) == (0, "the other process's data\n"), result
        assert (ws / "mine.txt").read_text() == "kept"
    finally:
        if neighbour.proc.poll() is None:
            neighbour.proc.kill()
            neighbour.proc.wait()


def test_a_run_cannot_see_or_touch_another_processs_workspace_or_run(
    lease: ServiceLease, other: OtherProcess, tmp_path: Path
) -> None:
    probe = neighbour_probe([other.ws / "data.txt", other.ws / "mine.txt"], other.ws)
    res = lease.run(probe, str(tmp_path))
    assert (res.exit_code, res.stdout.strip()) == (0, "FOUND []"), res
    other.assert_untouched()


# -- the adversarial suite through a cross-process lease ------------------------------------------

#: every case but these two: CPU rlimits are the program's own, set the same way whichever process
#: supervises it, and they take 3-5 s each (test_adversarial.py runs them, own and shared)
NOT_HERE = ("cpu_rlimit", "cpu_rlimit_sigxcpu_ignored")
_BY_ID = {c.id: c for c in CASES}
MACHINE_CASES = [name for name in _BY_ID if name not in NOT_HERE]


def test_the_machine_cases_are_the_suite_but_two() -> None:
    assert [name for name in NOT_HERE if name not in _BY_ID] == [] and len(MACHINE_CASES) == len(CASES) - 2 >= 50


@pytest.mark.parametrize("case", [pytest.param(_BY_ID[n], id=n, marks=_BY_ID[n].marks) for n in MACHINE_CASES])
def test_hostile_program_through_the_machine_service(
    lease: ServiceLease,
    other: OtherProcess,
    tmp_path: Path,
    case: Case,
    tcp_server: Any,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dirs = Dirs(tmp_path)
    monkeypatch.setenv("AGENTRL_HOST_SECRET", "s3cr3t-env")
    port, accepted = tcp_server
    code = case.code
    values = {"outside": dirs.outside, "secret": dirs.secret, "ws": dirs.ws, "marker": dirs.marker, "host_pid": lease.service_pid}
    for key, value in {**values, "port": port}.items():
        code = code.replace("{" + key + "}", str(value))
    shm_before = _shm_segments()
    res = lease.run(code, str(dirs.ws), RunLimits(**{**SUITE_LIMITS.__dict__, **case.limits}))
    case.check(res, dirs)
    benign = lease.run("print(6 * 7)", str(dirs.ws))
    assert (benign.exit_code, benign.stdout, benign.stderr) == (0, "42\n", ""), benign
    assert alive(lease.service_pid)
    zygote = lease.pid
    assert zygote is not None
    expected = idle_processes(bool(lease.layers.get("pidns")), lease.slots) + (3 if lease.layers.get("pidns") else 2)
    wait_for(
        lambda: len(descendants(zygote)) <= expected and not with_marker(dirs.marker), f"the service's tree back to {expected}"
    )
    assert os.listdir(dirs.outside) == []
    assert not accepted, "a sandboxed program reached the host's loopback server"
    assert not _segments_left_by_runs(shm_before), "a System V shared memory segment outlived the run"
    other.assert_untouched()


def test_a_sandboxed_run_cannot_reach_the_service_socket(lease: ServiceLease, tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import socket
        found = []
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({lease.socket_path!r})
            found.append('connected')
        except OSError as exc:
            pass
        for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
            try:
                a, b = socket.socketpair(socket.AF_UNIX, kind)
                a.sendto(b'{{}}', {lease.socket_path!r})
                found.append('sent')
            except OSError:
                pass
        print('FOUND', found)
    """)
    res = lease.run(code, str(tmp_path))
    assert (res.exit_code, res.stdout.strip()) == (0, "FOUND []"), res


# -- hostile peers on the socket ------------------------------------------------------------------


def _raw(lease: ServiceLease) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT_S)
    sock.connect(lease.socket_path)
    hello, _ = recv_json_with_fds(sock, 0)
    assert hello["ok"] and hello["service_pid"] == lease.service_pid
    return sock


def _reply(sock: socket.socket) -> dict[str, Any] | None:
    """The next reply, or None when the service hung up."""
    try:
        return recv_json_with_fds(sock, 0)[0]
    except (EOFError, ConnectionResetError):
        return None


def _still_serves(lease: ServiceLease, ws: Path) -> None:
    pid = lease.service_pid
    res = lease.run("print(6 * 7)", str(ws))
    assert (res.exit_code, res.stdout) == (0, "42\n") and lease.service_pid == pid and alive(pid), res


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xff\xff\xff\xff", id="huge_length"),
        pytest.param(struct.pack(">I", 5) + b"hello", id="not_json"),
        pytest.param(struct.pack(">I", 4) + b"\xff\xfe\x00\x01", id="not_utf8"),
        pytest.param(struct.pack(">I", 8) + b'{"a": [', id="cut_frame_then_hang_up"),
        pytest.param(b"\x00\x00", id="cut_length_then_hang_up"),
        pytest.param(struct.pack(">I", 200_000) + b"[" * 100_000 + b"]" * 100_000, id="nested_past_the_recursion_limit"),
        pytest.param(struct.pack(">I", 100) + b'{"op": "run"}' + bytes(87) + b"trailing", id="two_frames"),
    ],
)
def test_garbage_on_the_socket_loses_only_that_connection(lease: ServiceLease, tmp_path: Path, data: bytes) -> None:
    sock = _raw(lease)
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    reply = _reply(sock)
    assert reply is None or (reply["ok"] is False and reply["error"]), reply
    assert _reply(sock) is None  # and then it hangs up
    sock.close()
    _still_serves(lease, tmp_path)


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param([1, 2], id="not_an_object"),
        pytest.param({"op": "exec"}, id="unknown_op"),
        pytest.param({"op": "run", "code": 7, "workspace": "/", "limits": {}}, id="code_not_str"),
        pytest.param({"op": "run", "code": "print(1)", "workspace": "rel", "limits": {}}, id="relative_workspace"),
        pytest.param({"op": "run", "code": "print(1)", "workspace": "/", "limits": {"wall_s": -1}}, id="negative_limit"),
        pytest.param({"op": "run", "code": "print(1)", "workspace": "/", "limits": {"wall_s": True}}, id="bool_limit"),
        pytest.param({"op": "run", "code": "print(1)", "workspace": "/", "limits": {"evil": 1}}, id="unknown_limit"),
        pytest.param({"op": "run", "code": "print(1)", "workspace": "/", "limits": {}}, id="no_descriptor"),
        pytest.param({"op": "run", "code": "print(1)", "workspace": "OTHER", "limits": {}}, id="descriptor_of_another_dir"),
    ],
)
def test_bad_requests_get_an_error_and_the_connection_stays(lease: ServiceLease, tmp_path: Path, request_: Any) -> None:
    sock = _raw(lease)
    fds = None
    if isinstance(request_, dict) and request_.get("workspace") == "OTHER":
        other_dir = tmp_path / "other"
        other_dir.mkdir()
        request_ = {**request_, "workspace": str(tmp_path)}
        fds = [os.open(other_dir, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        send_json(sock, request_, fds)  # type: ignore[arg-type]
    finally:
        for fd in fds or ():
            os.close(fd)
    reply = _reply(sock)
    assert reply is not None and reply["ok"] is False and reply["error"], reply
    send_json(sock, {"op": "info"})
    info = _reply(sock)
    assert info is not None and info["ok"] and info["service_pid"] == lease.service_pid
    sock.close()
    assert sorted(os.listdir(tmp_path)) == ([] if fds is None else ["other"])  # nothing ran
    _still_serves(lease, tmp_path)


def test_a_client_that_hangs_up_mid_run_leaves_the_others_alone(lease: ServiceLease, tmp_path: Path) -> None:
    marker = f"agentrl-svc-hangup-{os.getpid()}"
    code = f"import subprocess\nsubprocess.run([{marker!r}, 'infinity'], executable='/bin/sleep')\n"
    sock = _raw(lease)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    limits = {**SUITE_LIMITS.__dict__, "wall_s": 1.0}  # the orphaned run ends at its own limit
    send_json(sock, {"op": "run", "code": code, "workspace": str(tmp_path), "limits": limits}, [fd])
    os.close(fd)
    wait_for(lambda: with_marker(marker), "the run to start")
    sock.close()
    _still_serves(lease, tmp_path)
    wait_for(lambda: not with_marker(marker), "the orphaned run to end at its wall limit")
    _still_serves(lease, tmp_path)


def _in_forked_child(body: Callable[[], Any]) -> Any:
    """``body()``'s JSON result, computed in a forked child of this process (which must exit 0)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest from here on, only os._exit
        code = 1
        try:
            os.close(read)
            os.write(write, json.dumps(body()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return json.loads(data)


def _as_nobody(path: str) -> dict[str, Any] | None:
    """What a process of uid 65534 reading at ``path`` gets (None: a hang-up without a word)."""

    def connect() -> Any:
        os.setgid(65534)
        os.setuid(65534)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(WAIT_S)
        sock.connect(path)
        try:
            return recv_json_with_fds(sock, 0)[0]
        except EOFError:
            return None

    return _in_forked_child(connect)  # type: ignore[no-any-return]


def test_another_uid_is_refused(lease: ServiceLease, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root, to connect as another uid (the 0700 directory already keeps others out)")
    door = tempfile.mkdtemp(prefix="sbxdoor-")  # a second name for the socket, where uid 65534 may enter
    os.chmod(door, 0o755)
    alias = os.path.join(door, "s")
    os.link(lease.socket_path, alias)
    mode = os.stat(alias).st_mode & 0o777
    os.chmod(alias, 0o666)
    try:
        reply = _as_nobody(alias)
    finally:
        os.chmod(alias, mode)
        shutil.rmtree(door)
    assert reply is not None and reply["ok"] is False and "uid" in reply["error"], reply
    _still_serves(lease, tmp_path)


def test_a_process_in_another_pid_namespace_is_refused(lease: ServiceLease, tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if os.getuid() != 0 or unshare is None:
        pytest.skip("needs root and util-linux unshare, to start a process in a pid namespace of its own")
    code = (
        "import json, socket, sys\nfrom simulators.python.sandbox._protocol import recv_json_with_fds\n"
        "s = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint(json.dumps(recv_json_with_fds(s, 0)[0]))\n"
    )
    out = subprocess.run(
        [unshare, "--pid", "--fork", sys.executable, "-c", code, lease.socket_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    if out.returncode and "unshare failed" in out.stderr:
        pytest.skip(f"this machine does not allow a new pid namespace: {out.stderr.strip()}")
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and "pid namespace" in reply["error"], reply
    _still_serves(lease, tmp_path)


# -- the service's life -----------------------------------------------------------------------------


@pytest.fixture
def own_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    path = _private_dir()
    monkeypatch.setenv(DIR_ENV, path)
    monkeypatch.setenv(IDLE_ENV, "0")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_service_stops_when_its_last_lease_closes(own_service: str, tmp_path: Path) -> None:
    a, b = ServiceLease(SUITE_LIMITS), ServiceLease(SUITE_LIMITS)
    service, zygote = a.service_pid, a.pid
    assert b.service_pid == service and zygote is not None
    a.close()
    res = b.run("print(1)", str(tmp_path))
    assert res.stdout == "1\n" and alive(service), res  # one lease left: still up
    b.close()
    wait_for(lambda: not alive(service) and not alive(zygote), "the service to stop after its last lease")
    wait_for(lambda: not os.path.exists(a.socket_path), "the socket to go")
    assert [p for p in os.listdir(own_service) if not p.endswith((".lock", ".log"))] == []  # scratch removed too
    with ServiceLease(SUITE_LIMITS) as c:  # the next lease starts a new one
        assert c.service_pid != service and c.run("print(2)", str(tmp_path)).stdout == "2\n"


def _all_threads_gone(pid: int) -> bool:
    """No thread of ``pid`` is alive (``alive`` reads the main thread's state, which is a zombie first)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    return not any(alive(int(tid)) for tid in tasks)


def test_a_lease_whose_service_died_starts_a_new_one(own_service: str, tmp_path: Path) -> None:
    with ServiceLease(SUITE_LIMITS) as a:
        first = a.service_pid
        os.kill(first, signal.SIGKILL)
        # every thread of it, not only its main one: the descriptors close when the last thread exits, and until then
        # the idle connection looks open, the next request goes out, and the run fails as "ended during the run"
        wait_for(lambda: _all_threads_gone(first), "the service to die")
        res = a.run("print(1)", str(tmp_path))  # between runs: transparently a new service
        assert (res.exit_code, res.stdout) == (0, "1\n") and a.service_pid != first, res
        second = a.service_pid
        marker = f"agentrl-svc-death-{os.getpid()}"
        outcome: dict[str, Any] = {}

        def killer() -> None:
            wait_for(lambda: with_marker(marker), "the run to start")
            os.kill(second, signal.SIGKILL)

        import threading

        thread = threading.Thread(target=killer)
        thread.start()
        code = f"import subprocess\nsubprocess.run([{marker!r}, 'infinity'], executable='/bin/sleep')\n"
        outcome["res"] = a.run(code, str(tmp_path), RunLimits(**{**SUITE_LIMITS.__dict__, "wall_s": 600.0}))
        thread.join(WAIT_S)
        died = outcome["res"]
        assert died.exit_code == 125 and "sandbox service" in died.stderr and "ended during the run" in died.stderr, died
        wait_for(lambda: not with_marker(marker), "the dead service's run to be gone")
        again = a.run("print(3)", str(tmp_path))
        assert again.stdout == "3\n" and a.service_pid not in (first, second), again


def test_a_socket_directory_others_may_enter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    path = _private_dir()
    try:
        os.chmod(path, 0o755)
        monkeypatch.setenv(DIR_ENV, path)
        with pytest.raises(SandboxError, match="not a private directory"):
            ServiceLease()
        if os.getuid() == 0:  # a directory another user made for us
            os.chmod(path, 0o700)
            os.chown(path, 65534, 65534)
            with pytest.raises(SandboxError, match="owner 65534"):
                ServiceLease()
        assert os.listdir(path) == []  # refused before anything was started or written
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize("raw", ["soon", "-1", "1e9", "nan"])
def test_a_bad_idle_setting_is_refused(own_service: str, monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(IDLE_ENV, raw)
    with pytest.raises(ValueError, match=IDLE_ENV):
        ServiceLease()
    assert [p for p in os.listdir(own_service) if p.endswith(".sock")] == []


def _connections(lease: ServiceLease) -> set[int]:
    """Socket inodes of the lease's idle connections."""
    return {os.fstat(sock.fileno()).st_ino for sock in lease._state["idle"]}


def test_a_forked_copy_of_a_lease_opens_its_own_connection(lease: ServiceLease, tmp_path: Path) -> None:
    _still_serves(lease, tmp_path)
    parents = _connections(lease)
    assert parents

    def in_child() -> list[Any]:
        res = lease.run("print(5)", str(tmp_path))
        seen = [res.exit_code, res.stdout, lease.service_pid, sorted(_connections(lease))]
        lease.close()  # closes the child's copies only
        return seen

    exit_code, stdout, service, childs = _in_forked_child(in_child)
    assert (exit_code, stdout, service) == (0, "5\n", lease.service_pid)
    assert childs and not set(childs) & parents  # a connection of its own, none of the parent's
    _still_serves(lease, tmp_path)
    assert parents <= _connections(lease)  # the parent's connections still work
