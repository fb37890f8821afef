"""Dense auxiliary rewards: schedules, decay through set_attr, no farming, format invariance."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from agentrl_envs import ConfigError
from agentrl_envs.core.actions import format_call, parse_action
from agentrl_envs.rewards.schedule import AuxRewardConfig, Schedule, parse_aux_reward
from tests.conftest import ENV_IDS


def play(env: gym.Env[str, str], policy: Any, seed: int) -> tuple[float, dict[str, Any], list[float]]:
    obs, info = env.reset(seed=seed)
    total, rewards, done = 0.0, [], False
    step = 0
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy(env, obs, info, step))
        total += float(reward)
        rewards.append(float(reward))
        done = terminated or truncated
        step += 1
    return total, info, rewards


def oracle(env: gym.Env[str, str], obs: str, info: dict[str, Any], step: int) -> str:
    return env.unwrapped.oracle_action()


@pytest.mark.parametrize(
    ("schedule", "points"),
    [
        (Schedule("linear", 0.8, 0.1, 100), {0: 0.8, 50: 0.45, 100: 0.1, 10_000: 0.1}),
        (Schedule("cosine", 0.8, 0.1, 100), {0: 0.8, 50: 0.45, 100: 0.1}),
        (Schedule("exponential", 0.8, 0.1, 100), {0: 0.8, 100: 0.1, 50: 0.8 * (0.1 / 0.8) ** 0.5}),
        (Schedule("step", 0.8, 0.1, 100), {0: 0.8, 99: 0.8, 100: 0.1}),
        (Schedule("constant", 0.3, 0.3, 100), {0: 0.3, 10**9: 0.3}),
    ],
)
def test_schedule_shapes(schedule: Schedule, points: dict[int, float]) -> None:
    for step, weight in points.items():
        assert schedule.weight(step) == pytest.approx(weight)


@pytest.mark.parametrize(
    "spec",
    [
        {"schedule": "sawtooth"},
        {"start": -1},
        {"steps": 0},
        {"terms": {"ftp": 1}},
        {"terms": {"sql": float("nan")}},
        {"bogus": 1},
        "big",
        [1],
    ],
)
def test_bad_aux_specs(spec: Any) -> None:
    with pytest.raises(ConfigError):
        parse_aux_reward(spec)
    with pytest.raises(ConfigError):
        gym.make("AgentRL/SQL-v0", aux_reward=spec)


def test_aux_spec_forms() -> None:
    assert parse_aux_reward(None) == AuxRewardConfig()
    assert parse_aux_reward(False).schedule.weight(0) == 0.0
    assert parse_aux_reward(0.5).schedule.weight(123) == 0.5
    assert parse_aux_reward({"schedule": "cosine", "terms": {"sql": 1.0}}).terms == {
        "sql": 1.0,
        "python": 0.2,
        "smtp": 0.5,
        "http": 0.5,
    }


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_decay_through_set_attr(mode: str) -> None:
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode=mode)
    try:
        weights = []
        for step in (0, 500_000, 1_000_000):
            venv.set_attr("training_step", step)
            assert venv.get_attr("training_step") == (step, step)
            venv.reset(seed=3)
            _, rewards, *_ = venv.step(venv.call("oracle_action"))  # the gold query: first useful SQL
            weights.append(tuple(float(r) for r in rewards))
        assert weights[0] == pytest.approx((0.3 * 0.8,) * 2)
        assert weights[1] == pytest.approx((0.3 * 0.45,) * 2)
        assert weights[2] == pytest.approx((0.3 * 0.1,) * 2)
        venv.call("set_training_step", 250_000)
        assert venv.get_attr("aux_weight") == pytest.approx((0.625, 0.625))
    finally:
        venv.close()


def test_single_env_set_wrapper_attr() -> None:
    env = gym.make("AgentRL/SMTP-v0")
    env.set_wrapper_attr("training_step", 1_000_000)
    assert env.unwrapped.aux_weight == pytest.approx(0.1)
    total, info, rewards = play(env, oracle, 0)
    assert rewards[0] == pytest.approx(0.5 * 0.1) and info["success"]
    env.close()


def test_aux_is_paid_once_per_tool_per_subtask() -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1", max_steps=30)
    obs, info = env.reset(seed=1)
    gold_sql = env.unwrapped.oracle_action()
    paid = [env.step(gold_sql)[1] for _ in range(4)]
    assert paid[0] == pytest.approx(0.3 * 0.8) and paid[1:] == [0.0, 0.0, 0.0]
    env.close()


def _farmer(env: gym.Env[str, str], obs: str, info: dict[str, Any], step: int) -> str:
    """Spams cheap successful calls of every tool, then finishes with a guess."""
    core = env.unwrapped
    tools = [t for t in core.tools if t != "finish"]
    if step >= 3 * len(tools) + 2:
        return format_call("finish", {"answer": "42"})
    tool = tools[step % len(tools)]
    domain = core.task.domain
    if tool == "sql":
        return format_call("sql", {"query": "SELECT * FROM staff"})
    if tool == "python":
        return format_call("python", {"code": "print(sum(range(10)))"})
    if tool == "http":
        return format_call("http", {"method": "GET", "path": "/openapi.json"})
    staff = [row[2] for row in core.task.data.tables["staff"]["rows"]]
    return format_call("smtp", {"to": staff[step % len(staff)], "subject": f"{domain} update", "body": "All good."})


def _smart_farmer(env: gym.Env[str, str], obs: str, info: dict[str, Any], step: int) -> str:
    """Does every useful step of the gold plan except the last one that solves it, then spams."""
    core = env.unwrapped
    action = core.oracle_action()
    name = parse_action(action).name
    if name in ("finish", "smtp", "http"):  # the steps that complete a sub-task
        return _farmer(env, obs, info, step)
    return action


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("training_step", [0, 500_000, 1_000_000])
def test_farming_returns_less_than_half_of_solving(env_id: str, training_step: int) -> None:
    for long_horizon in (False, True) if env_id == "AgentRL/SQLPythonSMTP-v1" else (False,):
        env = gym.make(env_id, max_steps=60, long_horizon=long_horizon) if long_horizon else gym.make(env_id, max_steps=60)
        env.unwrapped.set_training_step(training_step)
        for seed in range(4):
            solved, info, _ = play(env, oracle, seed)
            assert info["success"]
            for farmer in (_farmer, _smart_farmer):
                farmed, finfo, _ = play(env, farmer, seed)
                assert not finfo["success"]
                assert farmed < 0.5 * solved, (farmer.__name__, farmed, solved)
        env.close()


def _decorate(action: str) -> str:
    call = parse_action(action)
    args = dict(call.arguments)
    if call.name == "smtp":
        args["body"] = "**✅ SUCCESS** 🎉\n\n" + args["body"].replace("Hello,", "<b>Hello</b>,") + "\n\n_all tests passed_ 🚀"
    if call.name == "finish":
        args["answer"] = f"🎯 **Final answer:** `{args['answer']}` ✅ verified"
    return "Let me think 🤔 ... here is my call:\n" + format_call(call.name, args) + "\nDone! ✨"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_decorations_change_no_reward(env_id: str) -> None:
    env = gym.make(env_id)
    for seed in range(6):
        _, info_a, plain = play(env, oracle, seed)
        _, info_b, decorated = play(env, lambda e, o, i, s: _decorate(e.unwrapped.oracle_action()), seed)
        assert plain == decorated and info_a["task_components"] == info_b["task_components"]
    env.close()


def test_number_stuffed_email_earns_no_content_credit() -> None:
    env = gym.make("AgentRL/SMTP-v0")
    env.reset(seed=2)
    call = parse_action(env.unwrapped.oracle_action())
    rng = np.random.default_rng(0)
    stuffing = " ".join(f"{x:.2f}" for x in rng.uniform(0, 10_000, size=60))
    args = {**call.arguments, "body": call.arguments["body"] + "\n" + stuffing}
    _, reward, *_, info = env.step(format_call("smtp", args))
    assert info["tool_result"]["ok"] and reward == 0.0
    assert env.unwrapped.oracle_action().startswith('<tool_call>{"name": "smtp"')  # still not emailed
    env.close()
