"""The runner survives its zygote's death, host forks, concurrent use and close()."""

from __future__ import annotations

import os
import select
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from simulators.python import PythonResult, RunLimits
from simulators.python.sandbox import SandboxError, SandboxRunner
from tests.procs import alive, descendants, parent_of, with_marker

from .conftest import SUITE_LIMITS, WAIT_S, wait_for


@pytest.fixture
def own_runner() -> SandboxRunner:
    r = SandboxRunner(SUITE_LIMITS)
    yield r
    r.close()


def _host_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_killed_zygote_is_restarted(own_runner: SandboxRunner, tmp_path: Path) -> None:
    first = own_runner.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    # The kill lands when the zygote next runs (on a busy machine, later): wait for its death, so the
    # run below meets a dead zygote (a kill that lands during a run is the mid-run test below).
    wait_for(lambda: not alive(first), "the killed zygote to die")
    res = own_runner.run("print('after restart')", str(tmp_path))
    assert res.stdout == "after restart\n", res
    assert own_runner.restarts == 1 and own_runner.pid != first
    assert not alive(first)


def test_a_killed_inner_zygote_is_restarted(own_runner: SandboxRunner, tmp_path: Path) -> None:
    outer = own_runner.pid
    assert outer is not None
    inner = [p for p in descendants(outer) if parent_of(p) == outer]
    for pid in inner:
        os.kill(pid, signal.SIGKILL)
    # Wait for the deaths: until the kill lands (on a busy machine, later), a warm slot's program is
    # alive and would serve the run below, and the runner would have nothing to notice yet.
    wait_for(lambda: not any(alive(p) for p in inner), "the killed inner zygote to die")
    # The call that finds the inner zygote dead may fail (on a loaded machine the outer zygote can take
    # a while to notice); the runner must be healthy again by the next call, with a new zygote.
    first = own_runner.run("print(1)", str(tmp_path))
    if first.stdout != "1\n":
        assert first.exit_code != 0 or first.timed_out, first
        first = own_runner.run("print(1)", str(tmp_path))
    assert first.stdout == "1\n", first
    assert own_runner.pid != outer


def test_killing_the_zygote_mid_run_ends_the_run(own_runner: SandboxRunner, tmp_path: Path) -> None:
    """The zygote dies while a run is going on (once the run's program is seen running, whatever the
    load): the run ends with a sandbox error, not at its wall limit, and the next run works."""
    pid = own_runner.pid
    assert pid is not None
    marker = f"agentrl-sbx-zygote-kill-{os.getpid()}-{time.monotonic_ns()}"
    outcome: dict[str, PythonResult] = {}
    limits = RunLimits(**{**SUITE_LIMITS.__dict__, "wall_s": 600.0})  # only the zygote's death can end it in time

    def run() -> None:
        outcome["res"] = own_runner.run(f"import os\nos.execv('/bin/sleep', [{marker!r}, '1000'])", str(tmp_path), limits)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: with_marker(marker) or not thread.is_alive(), "the run's program to start")
        assert thread.is_alive(), outcome
        os.kill(pid, signal.SIGKILL)
    finally:
        thread.join(WAIT_S)
    assert not thread.is_alive(), "the run outlived its zygote"
    res = outcome["res"]
    assert not res.timed_out and res.exit_code != 0, res
    assert "[sandbox]" in res.stderr and "zygote died" in res.stderr, res.stderr
    wait_for(lambda: not with_marker(marker), "the run's processes to be gone")
    assert own_runner.run("print(2)", str(tmp_path)).stdout == "2\n"
    assert own_runner.restarts == 1


def test_no_descriptor_leaks_in_the_host(own_runner: SandboxRunner, tmp_path: Path) -> None:
    own_runner.run("print(0)", str(tmp_path))
    before = _host_fds()
    for code in ("print(1)", "while True:\n    pass", "import os\nos.abort()", "print('x' * 10**7)"):
        own_runner.run(code, str(tmp_path), SUITE_LIMITS.__class__(wall_s=0.3, output_bytes=1000))
    assert _host_fds() == before


def test_close_ends_everything(tmp_path: Path) -> None:
    r = SandboxRunner(SUITE_LIMITS)
    pid = r.pid
    assert pid is not None and r.run("print(1)", str(tmp_path)).exit_code == 0
    tree = descendants(pid)
    scratch = r._state["scratch"]
    r.close()
    # the kernel tears the pid namespaces down after close() returns
    wait_for(lambda: not alive(pid) and not [p for p in tree if alive(p)], "the zygote's processes to be gone")
    assert not os.path.exists(scratch)
    with pytest.raises(SandboxError, match="closed"):
        r.run("print(1)", str(tmp_path))
    r.close()  # idempotent


def test_a_forked_host_gets_its_own_zygote(own_runner: SandboxRunner, tmp_path: Path) -> None:
    assert own_runner.run("print('parent')", str(tmp_path)).stdout == "parent\n"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            res = own_runner.run("print('child')", str(tmp_path))
            ok = res.stdout == "child\n" and own_runner.pid is not None
            own_runner.close()
            os.write(write_end, b"ok" if ok else res.stderr.encode()[:500])
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(child, 0)
    assert os.read(read_end, 1000) == b"ok"
    os.close(read_end)
    assert own_runner.run("print('parent again')", str(tmp_path)).stdout == "parent again\n"


def test_a_warm_slot_whose_program_died_is_skipped(own_runner: SandboxRunner, tmp_path: Path) -> None:
    """A prepared program killed from outside before its request is never handed a run."""
    assert own_runner.run("print(0)", str(tmp_path)).stdout == "0\n"
    zygote = own_runner._state["zygote"]
    taken = [zygote.take_slot() for _ in range(2)]  # the two warm slots asked for after that run
    for slot in taken:
        signal.pidfd_send_signal(slot.prog, signal.SIGKILL)
        select.select([slot.prog], [], [], 5.0)
    zygote.slots.extend(taken)  # back in the pool, dead
    res = own_runner.run("print(3)", str(tmp_path))
    assert res.stdout == "3\n", res
    assert own_runner.restarts == 0


def test_a_run_reports_when_its_program_was_prepared_and_ready(runner: SandboxRunner, tmp_path: Path) -> None:
    """``last_timings``: the program readied itself for its request (``prepared``) before its layers were on
    and the agent's code started (``ready``), which is before the host saw the run end."""
    for _ in range(3):
        assert runner.run("print(1)", str(tmp_path)).exit_code == 0
        t = runner.last_timings
        assert {"prepared", "go", "ready", "ended", "done"} <= set(t)
        assert all(isinstance(v, float) for v in t.values())
        assert t["prepared"] <= t["ready"] <= t["ended"] <= t["done"]  # each after the one before, whatever the load


_KILLED_HOST = """
import json, os, signal, sys
from simulators.python.sandbox import SandboxRunner
r = SandboxRunner()
ok = r.run("print(1)", sys.argv[1]).stdout == "1\\n"
print(json.dumps({"ok": ok, "zygote": r.pid, "scratch": r._state["scratch"]}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close(), no finalizer, no atexit
"""


def test_a_host_killed_without_closing_leaves_no_scratch_folder(tmp_path: Path) -> None:
    """The zygote outlives a SIGKILLed host for a moment: it removes the host's scratch folder then."""
    import json
    import subprocess
    import sys

    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_HOST, str(tmp_path)], env=env, capture_output=True, text=True, timeout=WAIT_S * 2
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["scratch"].startswith(str(temp))
    wait_for(lambda: not alive(report["zygote"]), "the orphaned zygote to end")
    assert not os.path.exists(report["scratch"])
    assert [p.name for p in temp.iterdir()] == []


def test_a_host_that_is_exiting_or_gone_counts_as_gone() -> None:
    """The zygote's check when the host is still its parent: a killed host closes its socket before
    its children are re-parented, so under load the zygote can see the EOF with the host as its parent."""
    from simulators.python.sandbox._zygote import host_is_exiting

    assert not host_is_exiting(os.getpid())  # alive: a host that stops its zygote keeps the folder
    child = os.fork()
    if child == 0:
        os._exit(0)
    wait_for(lambda: not alive(child), "the child to exit")  # a zombie until reaped: it has exited
    assert host_is_exiting(child)
    os.waitpid(child, 0)
    assert host_is_exiting(child)  # reaped: gone


def test_a_zygote_the_host_stops_leaves_the_scratch_folder_to_its_successor(own_runner: SandboxRunner, tmp_path: Path) -> None:
    """Only a dead host's folder is removed by its zygote: a restart (here after a drop) reuses it."""
    assert own_runner.run("print(1)", str(tmp_path)).stdout == "1\n"
    scratch, old = own_runner._state["scratch"], own_runner.pid
    tree = [old, *descendants(old)]
    own_runner._drop(own_runner._state["zygote"])
    wait_for(lambda: not any(alive(p) for p in tree), "the stopped zygote's processes to end")
    assert os.path.isdir(scratch)
    res = own_runner.run("print(2)", str(tmp_path))
    assert res.stdout == "2\n", res
    assert own_runner.pid != old and os.path.isdir(scratch)


def test_a_new_runner_sweeps_scratch_folders_whose_owner_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host and zygote killed together leave a folder that nobody removes: the next runner does."""
    from simulators import _owners

    temp = tmp_path / "tmp"
    temp.mkdir()
    ns = os.stat("/proc/self/ns/pid").st_ino
    owner = _owners.owner_of(os.getpid())
    assert owner is not None
    me = " ".join(map(str, owner))
    folders = {
        "dead": f"999999999 1 {ns}",  # no such process
        "reused": f"{os.getpid()} 1 {ns}",  # a live pid, but started at another time
        "alive": me,
        "other-namespace": f"999999999 1 {ns + 1}",
        "garbage": "not a tag",
        "empty": "",
    }
    for name, tag in folders.items():
        (temp / f"agentrl-sandbox-{name}" / "mnt").mkdir(parents=True)
        (temp / f"agentrl-sandbox-{name}" / "owner").write_text(tag)
    (temp / "agentrl-sandbox-no-owner").mkdir()  # an older runner's, or one being made
    (temp / "agentrl-sandbox-0").mkdir()  # the service directory: no owner file
    (temp / "agentrl-sandbox-link").symlink_to(temp / "agentrl-sandbox-dead")
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    r = SandboxRunner(SUITE_LIMITS)
    try:
        assert r.run("print(1)", str(tmp_path)).stdout == "1\n"
        left = sorted(
            p.name.removeprefix("agentrl-sandbox-") for p in temp.iterdir() if p.name != os.path.basename(r._state["scratch"])
        )
    finally:
        r.close()
    assert left == ["0", "alive", "empty", "garbage", "link", "no-owner", "other-namespace"]
    assert not os.path.exists(r._state["scratch"])  # its own, removed by close()
