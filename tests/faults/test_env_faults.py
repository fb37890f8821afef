"""Error profiles through the env: replay, info["fault"], penalties, fault statistics, the virtual clock."""

from __future__ import annotations

import itertools
import time
from typing import Any

import gymnasium as gym
import pytest

from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.env import ToolUseEnv
from agentrl_envs.faults import FAULT_STATUS, ErrorProfile, load_profile
from agentrl_envs.faults.injector import FaultInjectingBackend

ENV_ID = "AgentRL/SQLPythonSMTP-v1"
CALL_TOOLS = ("sql", "python", "smtp")


def episode(env: gym.Env[str, str], seed: int) -> list[tuple[Any, ...]]:
    """One oracle episode: (action, observation, reward, terminated, truncated, info) per step."""
    agent = OracleAgent(env)
    obs, info = env.reset(seed=seed)
    steps: list[tuple[Any, ...]] = [(None, obs, 0.0, False, False, info)]
    done = False
    while not done:
        action = agent.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((action, obs, reward, terminated, truncated, info))
        done = terminated or truncated
    return steps


def flaky_episodes(n: int, profile: Any = "flaky") -> list[list[tuple[Any, ...]]]:
    env = gym.make(ENV_ID, error_profile=profile)
    try:
        return [episode(env, seed) for seed in range(n)]
    finally:
        env.close()


@pytest.fixture(scope="module")
def flaky() -> list[list[tuple[Any, ...]]]:
    return flaky_episodes(12)


def constant(ms: float, think: float = 1.0, timeout_s: float = 1000.0, **defaults: Any) -> ErrorProfile:
    return ErrorProfile.model_validate(
        {
            "name": f"constant-{ms}",
            "think_time_s": think,
            "defaults": {"latency": {"distribution": "constant", "ms": ms}, "timeout_s": timeout_s, **defaults},
        }
    )


def test_same_seed_same_transcript_under_flaky(flaky: list[list[tuple[Any, ...]]]) -> None:
    again = flaky_episodes(12)
    assert again == flaky  # actions, observations, rewards, and every info key (fault, virtual_time_s, ...)
    assert any(step[5]["fault"] for ep in flaky for step in ep[1:]), "flaky should inject faults in 12 episodes"
    other = episode(gym.make(ENV_ID, error_profile="flaky"), seed=1000)
    assert [s[5]["virtual_time_s"] for s in other] != [s[5]["virtual_time_s"] for s in flaky[0]]


def test_fault_info_and_penalties(flaky: list[list[tuple[Any, ...]]]) -> None:
    profile = load_profile("flaky")
    seen = set()
    for ep in flaky:
        for _, obs, reward, _, _, info in ep[1:]:
            fault = info["fault"]
            assert sum(info["reward_components"].values()) == pytest.approx(reward)
            if not fault:
                assert info["reward_components"]["fault"] == 0.0
                continue
            seen.add(fault["type"])
            assert fault["origin"] == "injected" and fault["status"] == FAULT_STATUS[fault["type"]]
            assert info["tool_result"]["ok"] is False and info["tool_result"]["status"] == fault["status"]
            assert info["reward_components"]["fault"] == profile.penalty(fault["type"])
            assert str(fault["status"]) in obs or fault["type"] in obs.lower() or "reset" in obs.lower()
    assert len(seen) >= 3, seen


def expected_stats(ep: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Fault statistics recounted from the transcript (the definitions in FaultStats' docstring)."""
    faults = retries = recoveries = 0
    pending: dict[str, int] = {}
    last_faulted = None
    for _, _, _, _, _, info in ep[1:]:
        tool = info["tool"]
        if tool not in CALL_TOOLS:
            continue
        fault = info["fault"]
        retries += last_faulted == tool
        if fault and (fault["origin"] != "agent" or fault["type"] == "timeout"):
            faults += 1
            pending[tool] = pending.get(tool, 0) + 1
            last_faulted = tool
            continue
        last_faulted = None
        if info["tool_result"]["ok"]:
            recoveries += pending.pop(tool, 0)
    out: dict[str, Any] = {"faults": faults, "retries": retries, "recoveries": recoveries}
    if faults:
        out["recovery_rate"] = recoveries / faults
    return out


def test_fault_stats_match_the_transcript(flaky: list[list[tuple[Any, ...]]]) -> None:
    total = 0
    for ep in flaky:
        final = ep[-1][5]
        assert final["fault_stats"] == expected_stats(ep)
        assert all("fault_stats" not in step[5] for step in ep[:-1])
        total += final["fault_stats"]["faults"]
        if final["success"]:  # the oracle retried every faulted call until it went through
            assert final["fault_stats"]["recoveries"] == final["fault_stats"]["faults"]
    assert total > 0


def test_virtual_time_is_think_time_plus_latency(flaky: list[list[tuple[Any, ...]]]) -> None:
    profile = load_profile("flaky")
    for ep in flaky:
        assert ep[0][5]["virtual_time_s"] == 0.0
        for prev, step in itertools.pairwise(ep):
            info = step[5]
            took = info["virtual_time_s"] - prev[5]["virtual_time_s"]
            if info["tool"] not in CALL_TOOLS:
                assert took == pytest.approx(profile.think_time_s)
            elif info["fault"] and info["fault"]["type"] == "timeout":
                assert took == pytest.approx(profile.think_time_s + profile.for_tool(info["tool"]).timeout_s)
            else:
                assert took > profile.think_time_s


def test_slow_latency_is_virtual() -> None:
    """A minute per call in virtual time; the episode still runs in (wall) milliseconds."""
    env = gym.make(ENV_ID, error_profile=constant(60_000))
    start = time.perf_counter()
    steps = episode(env, seed=0)
    wall = time.perf_counter() - start
    virtual = steps[-1][5]["virtual_time_s"]
    calls = sum(s[5]["tool"] in CALL_TOOLS for s in steps[1:])
    assert virtual >= 60.0 * calls + len(steps) - 1 >= 180
    assert wall < virtual / 20
    assert steps[-1][5]["success"]


def test_realtime_sleeps_the_latency() -> None:
    env = gym.make(ENV_ID, error_profile=constant(40, think=0.0), realtime=True)
    start = time.perf_counter()
    steps = episode(env, seed=0)
    wall = time.perf_counter() - start
    virtual = steps[-1][5]["virtual_time_s"]
    assert virtual == pytest.approx(0.040 * sum(s[5]["tool"] in CALL_TOOLS for s in steps[1:]), rel=0.01)
    assert wall >= virtual


def test_time_budget_truncates() -> None:
    env = gym.make(ENV_ID, error_profile=constant(10_000), time_budget_s=25.0)
    steps = episode(env, seed=0)
    action, obs, reward, terminated, truncated, info = steps[-1]
    assert truncated and not terminated and info["success"] is False
    assert info["virtual_time_s"] >= 25.0 and steps[-2][5]["virtual_time_s"] < 25.0
    assert "time budget" in obs and "fault_stats" in info
    assert len(steps) - 1 == 3  # 11 s, 22 s, 33 s


@pytest.mark.parametrize("name", ["realistic"])
def test_oracle_solves_90_percent_under_realistic(name: str) -> None:
    env = gym.make(ENV_ID, error_profile=name)
    try:
        results = [episode(env, seed)[-1][5] for seed in range(50)]
    finally:
        env.close()
    solved = sum(r["success"] for r in results)
    assert solved >= 45, f"oracle solved {solved}/50 under {name}"


def test_none_injects_nothing_and_time_stands_still() -> None:
    env = gym.make(ENV_ID)  # error_profile defaults to "none"
    for seed in range(5):
        steps = episode(env, seed)
        for step in steps:
            assert step[5]["fault"] == {} and step[5]["virtual_time_s"] == 0.0
            assert step[5]["reward_components"]["fault"] == 0.0
        assert steps[-1][5]["fault_stats"] == {"faults": 0, "retries": 0, "recoveries": 0}
    core = env.unwrapped
    assert isinstance(core, ToolUseEnv) and not isinstance(core._backend, FaultInjectingBackend)


def test_rate_limited_429_is_refused_until_the_window_passes() -> None:
    profile = ErrorProfile.model_validate(
        {
            "name": "always-429-once",
            "think_time_s": 1.0,
            "defaults": {
                "retry_after_s": [3.0, 3.0],
                "burst": {"enter_p": 1.0, "exit_p": 1.0, "rates": {"http_429": 1.0}},
            },
        }
    )
    env = gym.make(ENV_ID, error_profile=profile)
    steps = episode(env, seed=0)
    faults = [s[5]["fault"] for s in steps[1:]]
    # 429 at t=1 (window to 4 s), refused again at t=2 and t=3, through at t=4.
    assert [f.get("type") for f in faults[:4]] == ["http_429", "http_429", "http_429", None]
    # 1 s of think time per step, and each refusal inside the window takes REFUSAL_S (0.25 s).
    assert [f["retry_after_s"] for f in faults[:3] if f] == [3.0, 2.0, 0.75]
    assert steps[-1][5]["fault_stats"]["retries"] >= 3


def test_oracle_retries_python_after_an_injected_fault() -> None:
    # python's first call is a 503 (burst chain enters at once), its next call goes through.
    profile = ErrorProfile.model_validate(
        {
            "name": "python-503-once",
            "think_time_s": 1.0,
            "tools": {"python": {"burst": {"enter_p": 1.0, "exit_p": 1.0, "rates": {"http_503": 1.0}}}},
        }
    )
    steps = episode(gym.make(ENV_ID, error_profile=profile), seed=0)
    tools = [s[5]["tool"] for s in steps[1:]]
    assert steps[2][5]["fault"]["type"] == "http_503"
    assert tools == ["sql", "python", "python", "sql", "smtp", "finish"]  # the retry, then the staff lookup
