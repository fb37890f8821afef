"""One sandbox service per process, shared by every env in it (issue #16, item 3).

64 envs in one process run through one zygote; an async vector env's workers each use one; and
runs of two envs sharing a service cannot see or touch each other's workspace or run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the env ids
from agentrl_envs.actions import format_call
from simulators.python import RunLimits
from simulators.python.sandbox import FULL
from simulators.python.sandbox.host import idle_processes
from simulators.python.sandbox.shared import SharedSandbox, live_services, service_slots
from tests.procs import alive, descendants, sandbox_zygotes, with_marker

from .conftest import SUITE_LIMITS, WAIT_S, need, wait_for


def _python(code: str) -> str:
    return format_call("python", {"code": code})


def test_64_envs_in_one_process_share_one_service() -> None:
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


def test_a_16_env_async_vector_env_runs_with_one_service_per_worker() -> None:
    # a generous SQL deadline: task generation in 16 workers on 2 busy cores must not time out
    vec = gym.make_vec("AgentRL/Python-v0", num_envs=16, vectorization_mode="async", sql_deadline_s=60.0)
    try:
        vec.reset(seed=3)
        obs, _reward, _terminated, _truncated, _info = vec.step([_python(f"print({i} * 3)") for i in range(16)])
        for i, text in enumerate(obs):
            assert text.startswith("python ok") and str(i * 3) in text, (i, text)
        workers = [proc.pid for proc in vec.unwrapped.processes]  # type: ignore[attr-defined]
        assert len(workers) == 16
        assert [len(sandbox_zygotes(pid)) for pid in workers] == [1] * 16  # one service per worker, shared by its envs
    finally:
        vec.close()


@pytest.fixture
def two_leases() -> Iterator[tuple[SharedSandbox, SharedSandbox]]:
    a, b = SharedSandbox(SUITE_LIMITS), SharedSandbox(SUITE_LIMITS)
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
    probe = f"""
import os, signal
found = []
for path in ({str(ws_b / "secret.txt")!r}, {str(ws_b / "alive.txt")!r}):
    try:
        open(path).read()
        found.append('read ' + path)
    except OSError:
        pass
    try:
        open(path, 'w').write('overwritten by a')
        found.append('wrote ' + path)
    except OSError:
        pass
try:
    found.append('listed ' + ' '.join(os.listdir({str(ws_b)!r})))
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
