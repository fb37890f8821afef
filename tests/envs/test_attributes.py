"""The documented vector-env recipes: oracle actions across autoresets, validated set_attr."""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from agentrl_envs import ConfigError, EpisodeError
from agentrl_envs.core.env import AUTORESET_ACTION, SETTABLE_ATTRIBUTES
from agentrl_envs.rewards.schedule import AuxRewardConfig

MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_oracle_recipe_runs_across_autoresets(mode: str) -> None:
    """``vec.call("oracle_action")`` every step, through several NEXT_STEP autoresets of each sub-env."""
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=3, vectorization_mode=mode)
    try:
        venv.reset(seed=0)
        finished = np.zeros(3, dtype=int)
        autoreset_calls = 0
        done_before = np.zeros(3, dtype=bool)
        for _ in range(40):
            actions = venv.call("oracle_action")
            autoreset_calls += sum(a == AUTORESET_ACTION for a in actions)
            assert [a == AUTORESET_ACTION for a in actions] == list(done_before)
            _, rewards, terminated, truncated, _ = venv.step(actions)
            assert not truncated.any()
            finished += terminated
            assert (rewards[terminated] >= 1.0).all(), rewards  # solved: the task reward
            done_before = terminated | truncated
        assert (finished >= 5).all(), finished
        assert autoreset_calls >= 10
        # The workers are alive: one more call and step work.
        venv.step(venv.call("oracle_action"))
    finally:
        venv.close()


@pytest.mark.parametrize("mode", MODES)
def test_oracle_episodes_all_succeed_in_vector_envs(mode: str) -> None:
    venv = gym.make_vec("AgentRL/SQLPythonSMTP-v1", num_envs=2, vectorization_mode=mode)
    try:
        venv.reset(seed=5)
        successes: list[bool] = []
        for _ in range(30):
            _, _, terminated, truncated, infos = venv.step(venv.call("oracle_action"))
            for i in np.flatnonzero(terminated | truncated):
                successes.append(bool(infos["success"][i]))
        assert len(successes) >= 4 and all(successes), successes
    finally:
        venv.close()


def test_oracle_action_on_a_single_env() -> None:
    env = gym.make("AgentRL/SQL-v0")
    with pytest.raises(EpisodeError, match="reset"):
        env.unwrapped.oracle_action()
    env.reset(seed=0)
    env.step(env.unwrapped.oracle_action())
    _, _, terminated, _, _ = env.step(env.unwrapped.oracle_action())
    assert terminated
    assert env.unwrapped.oracle_action() == AUTORESET_ACTION
    with pytest.raises(EpisodeError, match="ended"):  # stepping it on a finished single env is still an error
        env.unwrapped.step(AUTORESET_ACTION)
    env.reset(seed=0)
    assert env.unwrapped.oracle_action() != AUTORESET_ACTION
    env.close()


def first_sql_rewards(venv: Any, seed: int = 3) -> tuple[float, ...]:
    venv.reset(seed=seed)
    _, rewards, *_ = venv.step(venv.call("oracle_action"))  # the gold query
    return tuple(float(r) for r in rewards)


@pytest.mark.parametrize("mode", MODES)
def test_set_attr_aux_reward_takes_effect(mode: str) -> None:
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode=mode)
    try:
        assert first_sql_rewards(venv) == pytest.approx((0.3 * 0.8,) * 2)
        venv.set_attr("aux_reward", {"schedule": "constant", "start": 1.0, "end": 1.0, "terms": {"sql": 0.7}})
        assert first_sql_rewards(venv) == pytest.approx((0.7,) * 2)
        venv.set_attr("aux_reward", False)
        assert first_sql_rewards(venv) == (0.0, 0.0)
        venv.set_attr("aux_reward", [0.5, None])  # one value per sub-env
        assert first_sql_rewards(venv) == pytest.approx((0.3 * 0.5, 0.3 * 0.8))
        configs = venv.get_attr("aux_reward")
        assert all(isinstance(c, AuxRewardConfig) for c in configs)
    finally:
        venv.close()


BAD_VALUES = [
    ("training_step", -5, "non-negative"),
    ("training_step", 1.5, "non-negative"),
    ("training_step", True, "non-negative"),
    ("training_step", "10", "non-negative"),
    ("aux_reward", {"terms": {"ftp": 1.0}}, "unknown tool"),
    ("aux_reward", {"shedule": "linear"}, "unknown key"),
    ("aux_reward", "lots", "use None"),
    ("candidates", -1, "positive int"),
    ("candidates", 2.5, "positive int"),
    ("candidates", 10**9, "up to 1024"),
    ("split", "test", "fixed when the env is made"),
    ("error_profile", "flaky", "fixed when the env is made"),
    ("max_steps", 3, "gym.make"),
    ("aux_weight", 0.5, "read-only"),
    ("aux_rewards", {"terms": {}}, "no attribute 'aux_rewards'"),
    ("trainig_step", 5, "training_step"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD_VALUES, ids=[f"{n}={v!r}" for n, v, _ in BAD_VALUES])
def test_set_attr_refuses_bad_values_sync(name: str, value: Any, message: str) -> None:
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode="sync")
    try:
        before = venv.get_attr("training_step")
        with pytest.raises(ConfigError, match=message):
            venv.set_attr(name, value)
        assert venv.get_attr("training_step") == before
        assert first_sql_rewards(venv) == pytest.approx((0.3 * 0.8,) * 2)  # nothing changed
    finally:
        venv.close()


@pytest.mark.parametrize(("name", "value", "message"), BAD_VALUES[:1] + BAD_VALUES[4:5] + BAD_VALUES[9:10] + BAD_VALUES[-2:-1])
def test_set_attr_refuses_bad_values_async(name: str, value: Any, message: str) -> None:
    # Gymnasium shuts an async worker down on any error in it; the point is that the refusal
    # reaches the caller as the env's ConfigError instead of being applied or dropped.
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode="async")
    try:
        with pytest.raises(ConfigError, match=message):
            venv.set_attr(name, value)
    finally:
        venv.close(terminate=True)


@pytest.mark.parametrize("mode", MODES)
def test_set_attr_good_values(mode: str) -> None:
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode=mode)
    try:
        venv.set_attr("training_step", np.int64(1_000_000))  # numpy ints from a trainer are fine
        assert venv.get_attr("training_step") == (1_000_000, 1_000_000)
        assert first_sql_rewards(venv) == pytest.approx((0.3 * 0.1,) * 2)
        venv.set_attr("candidates", 3)
        _, infos = venv.reset(seed=1)
        assert [len(c) for c in infos["candidates"]] == [3, 3]
        assert all(a in c for a, c in zip(venv.call("oracle_action"), infos["candidates"]))
    finally:
        venv.close()


def test_direct_assignment_is_guarded() -> None:
    env = gym.make("AgentRL/SQL-v0")
    core = env.unwrapped
    with pytest.raises(ConfigError, match="non-negative"):
        core.training_step = -1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="fixed"):
        core.domain = "hr"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="no attribute"):
        core.trainng_step = 3  # type: ignore[attr-defined]
    core.training_step = 500_000  # type: ignore[misc]
    assert core.aux_weight == pytest.approx(0.45)
    env.set_wrapper_attr("training_step", 0)
    assert core.training_step == 0
    with pytest.raises(ConfigError, match="no attribute"):
        env.set_wrapper_attr("aux_rewardd", 0.5)  # would otherwise land, unread, on the outermost wrapper
    core._private_scratch = 1  # private names are the env's own business
    env.close()


def test_settable_attributes_survive_pickling() -> None:
    env = gym.make("AgentRL/SQL-v0")
    env.set_wrapper_attr("training_step", 700)
    env.set_wrapper_attr("aux_reward", 0.25)
    clone = pickle.loads(pickle.dumps(env.unwrapped))
    assert clone.training_step == 700 and clone.aux_weight == 0.25
    with pytest.raises(ConfigError):
        clone.training_step = -1
    clone.close()
    env.close()


def test_settable_attribute_list_is_what_the_env_accepts() -> None:
    env = gym.make("AgentRL/SQL-v0")
    for name in SETTABLE_ATTRIBUTES:
        env.set_wrapper_attr(name, env.get_wrapper_attr(name))
    env.close()


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), 1e300, 86400.5, True, "5"])
@pytest.mark.parametrize("name", ["python_timeout_s", "sql_deadline_s"])
def test_make_refuses_a_service_limit_no_run_can_have(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{name}=.*: use a number of seconds above 0 and at most 86400"):
        gym.make("AgentRL/SQL-v0", **{name: value})
