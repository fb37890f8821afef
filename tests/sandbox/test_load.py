"""The same program gives the same result on an idle and on a busy machine (issue #14, item 14).

A program that runs past its limits ends as a timeout whether it hit its CPU limit (SIGXCPU, or
SIGKILL at the hard limit) or the wall deadline first: which one comes first depends on the load.
Each program runs on an idle machine, then again while CPU burners keep every core busy, and the
results (and the env's observation and reward) must be equal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the env ids
from agentrl_envs.core.actions import format_call
from simulators.python import PythonRunner, RunLimits
from simulators.python.sandbox import SandboxRunner

from .conftest import SUITE_LIMITS

SPIN = "while True:\n    pass\n"
PROGRAMS = {
    "spin": SPIN,
    "print_then_spin": "print('started', flush=True)\n" + SPIN,
    "sigxcpu_ignored": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" + SPIN,
    "sigxcpu_handled_then_spin": "import signal\nsignal.signal(signal.SIGXCPU, lambda *a: None)\n" + SPIN,
    "two_threads": "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n" + SPIN,
}
# (wall_s, cpu_s): the CPU limit first (its hard limit too, at cpu_s + 1), a race, the wall deadline first
LIMITS = [(2.5, 1), (1.0, 1), (0.5, 2)]
TIMEOUT = (-signal.SIGKILL, True, False)


@contextmanager
def busy_machine() -> Iterator[None]:
    """Twice as many CPU-bound processes as cores, until the block ends."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"], stdout=subprocess.DEVNULL)
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


def _outcomes(run: Callable[[str, RunLimits], Any], names: tuple[str, ...] = tuple(PROGRAMS)) -> dict[Any, tuple[Any, ...]]:
    found = {}
    for name in names:
        code = PROGRAMS[name]
        for wall_s, cpu_s in LIMITS:
            res = run(code, RunLimits(**{**SUITE_LIMITS.__dict__, "wall_s": wall_s, "cpu_s": cpu_s}))
            found[(name, wall_s, cpu_s)] = (res.exit_code, res.timed_out, res.output_truncated, res.stdout, res.stderr)
    return found


def _check(idle: dict[Any, tuple[Any, ...]], busy: dict[Any, tuple[Any, ...]]) -> None:
    assert busy == idle
    for key, (code, timed_out, truncated, stdout, stderr) in idle.items():
        assert (code, timed_out, truncated) == TIMEOUT, (key, code, stderr)
        assert stdout == ("started\n" if key[0] == "print_then_spin" else "") and stderr == "", key


@pytest.mark.slow
def test_sandbox_runs_past_their_limits_the_same_on_a_busy_machine(full: SandboxRunner, tmp_path: Path) -> None:
    def run(code: str, limits: RunLimits) -> Any:
        return full.run(code, str(tmp_path), limits)

    idle = _outcomes(run)
    with busy_machine():
        busy = _outcomes(run)
    _check(idle, busy)


@pytest.mark.slow
def test_basic_runner_runs_past_their_limits_the_same_on_a_busy_machine(tmp_path: Path) -> None:
    runner = PythonRunner(SUITE_LIMITS)
    try:

        def run(code: str, limits: RunLimits) -> Any:
            return runner.run(code, str(tmp_path), limits)

        names = ("spin", "sigxcpu_ignored")
        idle = _outcomes(run, names)
        with busy_machine():
            busy = _outcomes(run, names)
    finally:
        runner.close()
    _check(idle, busy)


def test_env_observation_and_reward_of_a_runaway_program_do_not_depend_on_load() -> None:
    env = gym.make("AgentRL/Python-v0", python_timeout_s=1.0)
    try:

        def episode() -> list[tuple[str, float, str]]:
            env.reset(seed=5)
            steps = []
            for code in (SPIN, PROGRAMS["sigxcpu_ignored"], "print(6 * 7)"):
                obs, reward, _terminated, _truncated, info = env.step(format_call("python", {"code": code}))
                steps.append((obs, float(reward), json.dumps(info, sort_keys=True, default=str)))
            return steps

        idle = episode()
        with busy_machine():
            busy = episode()
    finally:
        env.close()
    assert busy == idle
    assert idle[0][0].startswith("python error [timeout]") and idle[1][0] == idle[0][0], idle
    assert idle[2][0].startswith("python ok")
