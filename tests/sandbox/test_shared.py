"""One sandbox service shared by every env of a process, or of the machine (issue #16, item 3).

64 envs in one process run through one zygote (in process, or the machine's service); an async
vector env's workers all use the machine's one service; and runs of two envs sharing a service
cannot see or touch each other's workspace or run (across processes: tests/sandbox/test_service.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the env ids
from agentrl_envs.core.actions import format_call
from simulators.python import RunLimits
from simulators.python.sandbox import FULL, SandboxRunner
from simulators.python.sandbox.host import idle_processes
from simulators.python.sandbox.service import DIR_ENV, IDLE_ENV, SCOPE_ENV, SERVICE_MARKER, ServiceLease
from simulators.python.sandbox.shared import SharedSandbox, live_services, resolve_scope, service_slots
from tests.procs import alive, descendants, sandbox_zygotes, with_marker

from .conftest import SUITE_LIMITS, WAIT_S, assert_no_leftovers, need, neighbour_probe, wait_for


def _python(code: str) -> str:
    return format_call("python", {"code": code})


@pytest.fixture
def machine_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private directory for this test's machine services, which stop as soon as they are idle."""
    path = tempfile.mkdtemp(prefix="sbxsvc-")  # short: a Unix socket path has at most 107 bytes
    monkeypatch.setenv(DIR_ENV, path)
    monkeypatch.setenv(IDLE_ENV, "0")
    monkeypatch.delenv(SCOPE_ENV, raising=False)
    yield path
    for pid in _services_in(path):  # a failed test's service: gone before the next test
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def _services_in(path: str) -> list[int]:
    """Live service processes whose socket is in ``path``."""
    return [pid for pid in with_marker(SERVICE_MARKER) if path.encode() in open(f"/proc/{pid}/cmdline", "rb").read()]


def test_64_envs_in_one_process_share_the_machine_service(machine_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCOPE_ENV, "machine")
    others = set(sandbox_zygotes(os.getpid()))
    envs = [gym.make("AgentRL/Python-v0") for _ in range(64)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i % 4)
        for env in (envs[0], envs[63]):
            obs, *_ = env.step(_python("print(6 * 7)"))
            assert obs.startswith("python ok") and "42" in obs, obs
        assert set(sandbox_zygotes(os.getpid())) == others  # no zygote of this process's own
        services = _services_in(machine_dir)
        assert len(services) == 1, services
        zygotes = sandbox_zygotes(services[0])
        assert len(zygotes) == 1, zygotes
        with ServiceLease() as lease:
            assert lease.service_pid == services[0]
            expected = idle_processes(bool(lease.layers.get("pidns")), lease.slots)
        wait_for(lambda: len(descendants(zygotes[0])) <= expected, f"the service to be back to {expected} processes")
    finally:
        for env in envs:
            env.close()
    wait_for(lambda: not alive(services[0]) and not alive(zygotes[0]), "the last lease to shut the service down")


def test_64_envs_in_one_process_share_one_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SCOPE_ENV, raising=False)  # the default: the process's own service, in a main process
    before = live_services()
    others = set(sandbox_zygotes(os.getpid()))  # other tests' own runners, not shared services
    envs = [gym.make("AgentRL/Python-v0") for _ in range(64)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i % 4)  # the sandbox is the point here, not 64 task generations
        assert live_services() == before + 1
        zygotes = sorted(set(sandbox_zygotes(os.getpid())) - others)
        assert len(zygotes) == 1, zygotes
        for env in (envs[0], envs[31], envs[63]):
            obs, *_ = env.step(_python("print(6 * 7)"))
            assert obs.startswith("python ok") and "42" in obs, obs
        with SharedSandbox() as lease:  # one more lease: the same service
            assert live_services() == before + 1 and lease.runner.pid == zygotes[0]
            pidns = bool(lease.layers.get("pidns"))
        # the whole service between runs: its zygote and the warm slots, whatever the number of envs
        expected = idle_processes(pidns, service_slots())
        wait_for(lambda: len(descendants(zygotes[0])) <= expected, f"the service to be back to {expected} processes")
    finally:
        for env in envs:
            env.close()
    assert live_services() == before
    wait_for(lambda: not alive(zygotes[0]), "the last lease to shut the service down")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_an_async_vector_env_runs_with_one_machine_service(machine_dir: str, context: str) -> None:
    """4 workers (16 in benchmarks/bench_sandbox.py), forked or spawned: one service for all of them,
    by default (scope "auto" is the machine's service in a multiprocessing child)."""
    num = 4
    # a generous SQL deadline: task generation in the workers on 2 busy cores must not time out
    vec = gym.make_vec(
        "AgentRL/Python-v0", num_envs=num, vectorization_mode="async", vector_kwargs={"context": context}, sql_deadline_s=60.0
    )
    try:
        vec.reset(seed=3)
        obs, _reward, _terminated, _truncated, _info = vec.step([_python(f"print({i} * 3)") for i in range(num)])
        for i, text in enumerate(obs):
            assert text.startswith("python ok") and str(i * 3) in text, (i, text)
        workers = [proc.pid for proc in vec.unwrapped.processes]  # type: ignore[attr-defined]
        assert len(workers) == num
        assert [sandbox_zygotes(pid) for pid in workers] == [[]] * num  # no worker starts a service of its own
        services = _services_in(machine_dir)
        assert len(services) == 1, services
        assert len(sandbox_zygotes(services[0])) == 1
        with ServiceLease() as lease:
            pidns = bool(lease.layers.get("pidns"))
            expected = 1 + idle_processes(pidns, lease.slots)  # its zygote, and the zygote's idle tree
            wait_for(lambda: len(descendants(services[0])) <= expected, f"the service to be back to {expected} processes")
    finally:
        vec.close()
    wait_for(lambda: not alive(services[0]), "the service to stop once the workers are gone")


def test_the_scope_is_the_process_in_a_main_process_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SCOPE_ENV, raising=False)
    assert (resolve_scope(), resolve_scope("auto"), resolve_scope("machine")) == ("process", "process", "machine")
    monkeypatch.setenv(SCOPE_ENV, "machine")
    assert (resolve_scope(), resolve_scope("process")) == ("machine", "process")
    for bad in ("Machine", "everywhere", " process"):
        monkeypatch.setenv(SCOPE_ENV, bad)
        with pytest.raises(ValueError, match="use 'auto', 'machine' or 'process'"):
            SharedSandbox()


@pytest.fixture
def two_leases() -> Iterator[tuple[SharedSandbox, SharedSandbox]]:
    a, b = SharedSandbox(SUITE_LIMITS, scope="process"), SharedSandbox(SUITE_LIMITS, scope="process")
    if a.tier != FULL:
        need(a.runner, *a.missing)
    yield a, b
    a.close()
    b.close()


def test_leases_share_the_service(two_leases: tuple[SharedSandbox, SharedSandbox]) -> None:
    a, b = two_leases
    assert a.runner is b.runner


def test_a_run_cannot_see_or_touch_another_envs_workspace_or_run(
    two_leases: tuple[SharedSandbox, SharedSandbox], tmp_path: Path
) -> None:
    a, b = two_leases
    ws_a, ws_b = tmp_path / "a", tmp_path / "b"
    ws_a.mkdir()
    ws_b.mkdir()
    (ws_b / "secret.txt").write_text("b's data\n")
    marker = f"agentrl-shared-{os.getpid()}-{time.monotonic_ns()}"
    outcome: dict[str, object] = {}

    def run_b() -> None:  # B's program waits on a child that the host ends: A must not see, signal or end it
        outcome["b"] = b.run(
            f"import subprocess\nopen('alive.txt', 'w').write({marker!r})\n"
            f"subprocess.run([{marker!r}, 'infinity'], executable='/bin/sleep')\nprint(open('secret.txt').read(), end='')",
            str(ws_b),
            RunLimits(**{**SUITE_LIMITS.__dict__, "wall_s": 600.0}),
        )

    thread = threading.Thread(target=run_b)
    thread.start()
    wait_for(lambda: with_marker(marker) or not thread.is_alive(), "B's run to start")
    assert thread.is_alive(), outcome
    probe = neighbour_probe([ws_b / "secret.txt", ws_b / "alive.txt"], ws_b)
    try:
        res_a = a.run(probe, str(ws_a))
        assert with_marker(marker), "A's run ended B's run"
    finally:
        for pid in with_marker(marker):  # B's child ends: B goes on and finishes
            os.kill(pid, signal.SIGKILL)
        thread.join(WAIT_S)
    assert res_a.stdout.strip() == "FOUND []", res_a
    res_b = outcome["b"]
    assert res_b.exit_code == 0 and res_b.stdout == "b's data\n", res_b  # type: ignore[attr-defined]
    assert (ws_b / "secret.txt").read_text() == "b's data\n"
    assert (ws_b / "alive.txt").read_text() == marker
    assert sorted(p.name for p in ws_a.iterdir()) == []


def test_hostile_programs_through_a_shared_lease_leave_the_other_env_alone(
    two_leases: tuple[SharedSandbox, SharedSandbox], tmp_path: Path
) -> None:
    """Each hostile kind (CPU, fork and memory bombs, a daemon) on lease A; B still runs, unaffected."""
    a, b = two_leases
    ws_a, ws_b = tmp_path / "a", tmp_path / "b"
    ws_a.mkdir()
    ws_b.mkdir()
    limits = SUITE_LIMITS.__class__(**{**SUITE_LIMITS.__dict__, "wall_s": 1.0})
    hostile = [
        "while True:\n    pass\n",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "x = []\nwhile True:\n    x.append(bytearray(1 << 24))\n",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n",
    ]
    for code in hostile:
        a.run(code, str(ws_a), limits)
        res = b.run("import os\nprint(sorted(os.listdir('.')))", str(ws_b))
        assert res.exit_code == 0 and res.stdout == "[]\n", (code, res)


def test_the_leftover_check_counts_the_runner_s_own_warm_slots(tmp_path: Path) -> None:
    """A shared service keeps one warm slot per core (up to 8): on a 4-core machine, 4, not the default 2."""
    runner = SandboxRunner(SUITE_LIMITS, warm_slots=4)
    try:
        if runner.tier != FULL:
            need(runner, *runner.missing)
        res = runner.run("print(6 * 7)", str(tmp_path))
        assert (res.exit_code, res.stdout) == (0, "42\n"), res
        expected = idle_processes(bool(runner.layers.get("pidns")), 4)
        wait_for(lambda: len(descendants(runner.pid)) == expected, f"the four warm slots ({expected} processes)")  # type: ignore[arg-type]
        assert_no_leftovers(runner)
    finally:
        runner.close()
