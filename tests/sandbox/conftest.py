"""Fixtures of the sandbox suite: one shared runner, a workspace with an ``outside`` neighbour that
must stay empty, a ``secret`` neighbour that must stay unreadable, and leak checks."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from simulators.python import RunLimits
from simulators.python.sandbox import FULL, SandboxRunner
from simulators.python.sandbox import host as sandbox_host
from tests.procs import descendants, with_marker

# A generous wall limit: a program that is meant to finish must finish however busy the machine is
# (its CPU limit still ends a spinning one after 3 CPU seconds). Cases that are meant to time out
# set a short wall limit of their own: a timeout is their outcome whatever the load.
SUITE_LIMITS = RunLimits(wall_s=60.0, cpu_s=3, memory_bytes=512 << 20, file_bytes=1 << 20, open_files=64, processes=32)
#: how long a test waits for a state it expects (a process gone, a run started): a bound for a busy
#: machine, never an expected time; every wait ends as soon as the state is reached
WAIT_S = 60.0


def require_integration() -> bool:
    """Under CI (AGENTRL_REQUIRE_INTEGRATION=1) a missing layer is a failure, not a skip."""
    return os.environ.get("AGENTRL_REQUIRE_INTEGRATION") == "1"


def need(runner: SandboxRunner, *layers: str) -> None:
    """Skip (or, under CI, fail) when this machine lacks one of ``layers``."""
    missing = [name for name in layers if not runner.layers.get(name)]
    if missing:
        message = f"sandbox layer(s) {missing} not available here (tier {runner.tier}; {'; '.join(runner.notes)})"
        if require_integration():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def runner() -> Iterator[SandboxRunner]:
    r = SandboxRunner(SUITE_LIMITS, workspace_bytes=16 << 20, workspace_files=512)
    yield r
    r.close()


@pytest.fixture
def full(runner: SandboxRunner) -> SandboxRunner:
    """The shared runner, when it reached tier FULL (else skip, or fail under CI)."""
    if runner.tier != FULL:
        need(runner, *runner.missing)
    return runner


class Dirs:
    """``ws``: the workspace; ``outside``: must stay empty; ``secret``: holds ``key.txt``, never readable."""

    def __init__(self, root: Path) -> None:
        self.ws = root / "ws"
        self.outside = root / "outside"
        self.secret = root / "secret"
        for d in (self.ws, self.outside, self.secret):
            d.mkdir()
        (self.secret / "key.txt").write_text("s3cr3t-key\n")
        self.marker = f"agentrl-sbx-test-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    return Dirs(tmp_path)


# -- leak checks -----------------------------------------------------------------------------------


def idle_tree_size(runner: SandboxRunner) -> int:
    """Processes under the zygote between runs: the pid-1 zygote (with a pid namespace) and the warm
    slots, a program each (and, with a pid namespace, the run's pid 1). The slots are the runner's
    own: a shared service keeps one per core (``service_slots``), not the default two."""
    return sandbox_host.idle_processes(bool(runner.layers.get("pidns")), runner.warm_slots)


def wait_for(condition: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` (a hang bound)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"still waiting after {timeout:.0f} s for {what}")
        time.sleep(0.02)


def assert_no_leftovers(runner: SandboxRunner, marker: str | None = None, timeout: float = WAIT_S, others: int = 0) -> None:
    """Nothing of the last run is alive: the zygote's tree is back to its idle size (plus ``others``
    processes of runs still going on), no marked process."""
    assert runner.pid is not None
    expected = idle_tree_size(runner) + others
    end = time.monotonic() + timeout
    while True:
        tree = descendants(runner.pid)
        marked = with_marker(marker) if marker else []
        if len(tree) <= expected and not marked:
            return
        if time.monotonic() > end:
            break
        time.sleep(0.02)
    for pid in marked:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    cmdlines = {}
    for pid in tree:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines[pid] = f.read()[:80]
        except OSError:
            continue
    raise AssertionError(f"processes outlived the run: tree={cmdlines} marked={marked}")


def neighbour_probe(paths: list[Path], folder: Path) -> str:
    """A program that tries to reach another run's files and processes; it prints ``FOUND []`` when it reached none.

    For each of ``paths`` it tries to read and to write; it lists ``folder``, signals pids 1-399 (a pid
    namespace of its own has only 1 and itself) and lists ``/proc``.
    """
    return f"""
import os, signal
found = []
for path in {[str(p) for p in paths]!r}:
    try:
        open(path).read()
        found.append('read ' + path)
    except OSError:
        pass
    try:
        open(path, 'a').write('written by the probe')
        found.append('wrote ' + path)
    except OSError:
        pass
try:
    found.append('listed ' + ' '.join(os.listdir({str(folder)!r})))
except OSError:
    pass
for pid in range(1, 400):
    try:
        os.kill(pid, signal.SIGKILL) if pid != os.getpid() else None
        if pid > 2:
            found.append('signalled ' + str(pid))
    except OSError:
        pass
try:
    found += [p for p in os.listdir('/proc') if p.isdigit() and p not in ('1', str(os.getpid()))]
except OSError:
    pass
print('FOUND', found)
"""
