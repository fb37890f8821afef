"""Envs without the python tool start no Python sandbox; envs with it start one as before."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401  (registers the envs)
import simulators.app
from simulators.python.sandbox import SandboxError
from simulators.python.sandbox.shared import live_services

NO_PYTHON = ["AgentRL/SQL-v0", "AgentRL/SMTP-v0", "AgentRL/HTTP-v0"]
WITH_PYTHON = ["AgentRL/Python-v0", "AgentRL/SQLPythonSMTP-v1", "AgentRL/Workplace-v1"]
TIERS = ("FULL", "REDUCED", "UNSAFE", "BASIC")


def play_oracle(env: Any, seed: int) -> list[dict[str, Any]]:
    """The oracle's episode; every info, the reset's first."""
    _obs, info = env.reset(seed=seed)
    infos = [info]
    for _ in range(40):
        _obs, _reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        infos.append(info)
        if terminated or truncated:
            break
    return infos


@pytest.mark.parametrize("env_id", NO_PYTHON)
def test_an_env_without_python_starts_no_sandbox(env_id: str) -> None:
    before = live_services()
    env = gym.make(env_id)
    try:
        infos = play_oracle(env, seed=3)
        assert infos[-1]["success"] is True
        assert {info["sandbox_tier"] for info in infos} == {"none"}
        assert live_services() == before
        app = env.unwrapped._get_backend().app
        assert not app.python_started
    finally:
        env.close()


@pytest.mark.parametrize("env_id", WITH_PYTHON)
def test_an_env_with_python_reports_its_sandbox_from_the_reset_on(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        infos = play_oracle(env, seed=3)
        assert infos[-1]["success"] is True
        tiers = {info["sandbox_tier"] for info in infos}
        assert len(tiers) == 1 and tiers <= set(TIERS)
    finally:
        env.close()


class RefusingSandbox:
    """A sandbox that will not start: what a machine without namespaces, seccomp or Landlock gives."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise SandboxError("the Python sandbox would run at tier UNSAFE (test stand-in)")


def test_where_the_sandbox_refuses_to_start_only_envs_that_run_python_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulators.app, "SharedSandbox", RefusingSandbox)
    env = gym.make("AgentRL/SQL-v0")
    try:
        assert play_oracle(env, seed=5)[-1]["success"] is True
        # A python call the agent makes anyway is an unknown tool for SQL-v0: a format penalty, no sandbox.
        env.reset(seed=5)
        _obs, _reward, _terminated, _truncated, info = env.step(
            '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'
        )
        assert info["reward_components"]["format"] < 0 and info["sandbox_tier"] == "none"
    finally:
        env.close()
    env = gym.make("AgentRL/Python-v0")
    try:
        with pytest.raises(SandboxError, match="UNSAFE"):
            env.reset(seed=5)
    finally:
        env.close()
