"""The public contract over every registered id: check_env, determinism, pickling, vector envs."""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl_envs
from agentrl_envs import ConfigError, EpisodeError
from agentrl_envs.agents import OracleAgent, RandomAgent
from agentrl_envs.core.actions import format_call
from agentrl_envs.rewards import COMPONENTS
from tests.conftest import ENV_IDS

ALWAYS = {
    "task_id",
    "domain",
    "split",
    "step",
    "reward_components",
    "tool",
    "tool_result",
    "fault",
    "virtual_time_s",
    "subtask_index",
    "subtask_boundary",
}
AT_RESET = {"instruction", "tools", "system_prompt"}


def run_episode(env: gym.Env[str, str], seed: int, agent_cls: Any = OracleAgent) -> list[Any]:
    agent = agent_cls(env) if agent_cls is OracleAgent else agent_cls(env, seed=seed)
    obs, info = env.reset(seed=seed)
    transcript: list[Any] = [obs, info]
    done = False
    while not done:
        action = agent.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        transcript.append((action, obs, reward, terminated, truncated, info))
        done = terminated or truncated
    return transcript


def test_ids_registered() -> None:
    assert set(ENV_IDS) == {
        "AgentRL/SQL-v0",
        "AgentRL/Python-v0",
        "AgentRL/SMTP-v0",
        "AgentRL/SQLPythonSMTP-v1",
        "AgentRL/HTTP-v0",
        "AgentRL/Workplace-v1",
    }
    for env_id in ENV_IDS:
        assert env_id in gym.registry
        env = gym.make(f"agentrl_envs:{env_id}")
        env.close()


def test_check_env(env_id: str) -> None:
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_env_card(env_id: str) -> None:
    cls = type(gym.make(env_id).unwrapped)
    for heading in (
        "## Description",
        "## Action Space",
        "## Observation Space",
        "## Rewards",
        "## Episode End",
        "## Arguments",
        "## Version History",
    ):
        assert heading in (cls.__doc__ or ""), heading


def test_info_keys_and_reward_sum(env_id: str) -> None:
    env = gym.make(env_id, candidates=3)
    obs, info = env.reset(seed=3)
    assert ALWAYS | AT_RESET <= set(info)
    assert obs == info["instruction"]
    assert all(t["type"] == "function" and "parameters" in t["function"] for t in info["tools"])
    agent = OracleAgent(env)
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
        assert ALWAYS <= set(info)
        assert set(info["reward_components"]) == set(COMPONENTS)
        assert reward == pytest.approx(sum(info["reward_components"].values()))
        assert env.observation_space.contains(obs)
        done = terminated or truncated
    assert info["success"] is True
    assert all(info["task_components"].values())
    assert info["reward_components"]["task"] == 1.0
    env.close()


def test_same_seed_same_transcript(env_id: str) -> None:
    for agent_cls in (OracleAgent, RandomAgent):
        a, b = gym.make(env_id, candidates=4), gym.make(env_id, candidates=4)
        for seed in (0, 7):
            assert run_episode(a, seed, agent_cls) == run_episode(b, seed, agent_cls)
        a.close()
        b.close()


def test_different_seeds_different_tasks(env_id: str) -> None:
    env = gym.make(env_id)
    instructions = {env.reset(seed=s)[0] for s in range(20)}
    assert len(instructions) >= 15
    env.close()


def test_pickle(env_id: str) -> None:
    env = gym.make(env_id, candidates=2)
    env.reset(seed=1)
    clone = pickle.loads(pickle.dumps(env))
    assert env.reset(seed=5) == clone.reset(seed=5)
    action = OracleAgent(env).act("", {})
    assert env.step(action) == clone.step(action)
    env.close()
    clone.close()


def test_render_ansi(env_id: str) -> None:
    env = gym.make(env_id, render_mode="ansi")
    run_episode(env, 2)
    text = env.render()
    assert isinstance(text, str) and text.count("\n> ") >= 2
    env.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_return_real_observations(mode: str) -> None:
    env_id = "AgentRL/SQLPythonSMTP-v1"
    venv = gym.make_vec(env_id, num_envs=4, vectorization_mode=mode)
    obs, info = venv.reset(seed=10)
    assert len(obs) == 4 and all(o.startswith("You are an analytics agent") for o in obs)
    assert len(set(obs)) > 1, "four envs seeded 10..13 should not all get the same task"
    for _ in range(6):
        actions = venv.call("oracle_action")
        prev = tuple(obs)
        obs, rewards, terminated, _truncated, _info = venv.step(actions)
        assert tuple(obs) != prev
        assert all(isinstance(o, str) and o for o in obs)
        assert not any(o.strip("0") == "" for o in obs), "stale shared-memory observation"
        if terminated.all():
            break
    assert terminated.all() and (rewards == 1.0).all()
    venv.close()


def test_step_contract_errors() -> None:
    env = gym.make("AgentRL/SQL-v0")
    with pytest.raises(EpisodeError):
        env.unwrapped.step("{}")
    env.reset(seed=0)
    with pytest.raises(TypeError):
        env.step(None)  # type: ignore[arg-type]
    env.step('{"name": "finish", "arguments": {"answer": "x"}}')
    with pytest.raises(EpisodeError, match="reset"):
        env.unwrapped.step('{"name": "finish", "arguments": {"answer": "x"}}')
    env.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"split": "validation"},
        {"domain": "space"},
        {"split": "heldout", "domain": "retail"},
        {"split": "train", "domain": "logistics"},
        {"max_steps": 0},
        {"candidates": -1},
        {"candidates": True},
        {"candidates": 10**9},  # padded with no-op guesses one at a time: never returned
        {"error_profile": "no-such-profile"},
        {"error_profile": "/etc/passwd"},
        {"backend": "ftp://nowhere"},
        {"render_mode": "human"},
        {"time_budget_s": -1.0},
        {"long_horizon": True, "_id": "AgentRL/SQL-v0"},
    ],
)
def test_bad_make_kwargs(kwargs: dict[str, Any]) -> None:
    env_id = kwargs.pop("_id", "AgentRL/SQLPythonSMTP-v1")
    with pytest.raises(ConfigError) as info:
        env = gym.make(env_id, **kwargs)
        env.reset(seed=0)
    assert str(info.value)


def test_domain_and_split_filters() -> None:
    for split, domain in (("train", "finance"), ("test", "hr"), ("heldout", "logistics")):
        env = gym.make("AgentRL/SQL-v0", split=split, domain=domain)
        for s in range(5):
            _, info = env.reset(seed=s)
            assert info["domain"] == domain and info["split"] == split
        env.close()


def test_task_seed_option() -> None:
    env = gym.make("AgentRL/SQL-v0")
    a = env.reset(seed=0, options={"task_seed": 42})[0]
    b = env.reset(seed=99, options={"task_seed": 42})[0]
    assert a == b
    with pytest.raises(ConfigError):
        env.reset(options={"task_seed": -1})
    env.close()


NON_STR_ACTIONS = [b"x", bytearray(b"x"), None, 7, 1.5, {"name": "finish"}, ["finish"], np.array("x")]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_non_str_actions_are_a_type_error_and_the_episode_goes_on(env_id: str) -> None:
    env = gym.make(env_id)
    _, info = env.reset(seed=1)
    for action in NON_STR_ACTIONS:
        with pytest.raises(TypeError, match=f"an action must be a str, got {type(action).__name__}"):
            env.step(action)  # type: ignore[arg-type]
    assert env.unwrapped._steps == 0  # nothing was played
    finish = format_call("finish", {"answer": "x"})
    _, reward, terminated, _, info = env.step(np.str_(finish))  # a numpy str is a str
    assert terminated and info["tool"] == "finish" and info["call_format"] == "hermes"
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize(
    "options",
    [
        "task_seed=3",
        ["task_seed", 3],
        5,
        b"x",
        {"task_seed": "3"},
        {"task_seed": 1.0},
        {"task_seed": True},
        {"task_seed": -1},
        {"bogus": 1},
        {"task_seed": 3, "taskseed": 4},
        {"task_seed": 2**63},
        {"task_seed": np.uint64(2**63)},
        # raised a raw ValueError (int to str) after closing the episode
        pytest.param({"task_seed": 10**5000}, id="{'task_seed': 10**5000}"),
    ],
    ids=repr,
)
def test_garbage_reset_options_are_a_config_error_that_keeps_the_episode(env_id: str, options: Any) -> None:
    # a str or a list raised a raw AttributeError ('str' object has no attribute 'get')
    env = gym.make(env_id)
    _, info = env.reset(seed=2)
    with pytest.raises(ConfigError, match=r"options|task_seed"):
        env.reset(seed=3, options=options)
    assert env.unwrapped.task.task_id == info["task_id"]  # the episode in progress is still there
    assert env.step(env.unwrapped.oracle_action())[-1]["task_id"] == info["task_id"]
    env.close()


def test_an_unknown_reset_option_names_the_key_and_the_keys_read() -> None:
    # a typo such as "taskseed" was ignored silently and the env drew a random task
    env = gym.make("AgentRL/SQL-v0")
    with pytest.raises(ConfigError, match=r"options key 'taskseed' is not a reset option .*: 'task_seed'"):
        env.reset(seed=0, options={"taskseed": 42})
    assert env.reset(seed=0, options={})[1]["task_id"] == env.reset(seed=0)[1]["task_id"]  # no keys: as None
    env.close()


def test_task_seeds_are_int64s() -> None:
    env = gym.make("AgentRL/SQL-v0")
    _, info = env.reset(seed=0, options={"task_seed": np.int64(2**63 - 1)})
    assert info["task_id"].endswith("/train/9223372036854775807")
    for task_seed, shown in ((2**63, "9223372036854775808"), (10**5000, "a 16610-bit int")):
        with pytest.raises(ConfigError, match=rf"options\['task_seed'\]={shown}: use an int from 0 to 2\*\*63 - 1"):
            env.reset(seed=0, options={"task_seed": task_seed})
    env.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_pass_task_seed_and_keep_reset_mask_to_themselves(mode: str) -> None:
    # the vector env takes "reset_mask" out of the options; the sub-envs see only "task_seed"
    venv = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode=mode)
    try:
        _, info = venv.reset(seed=0, options={"task_seed": 7})
        assert [t.rsplit("/", 1)[1] for t in info["task_id"]] == ["7", "7"]
        _, info = venv.reset(seed=0, options={"reset_mask": np.array([False, True]), "task_seed": 8})
        assert info["task_id"][1].endswith("/8") and not info["_task_id"][0]  # sub-env 0 was not reset
    finally:
        venv.close()


def test_a_numpy_int_task_seed_is_the_same_task_as_the_int() -> None:
    env = gym.make("AgentRL/SQL-v0")
    a = env.reset(seed=0, options={"task_seed": 42})
    b = env.reset(seed=0, options={"task_seed": np.int64(42)})
    assert a[0] == b[0] and a[1]["task_id"] == b[1]["task_id"] == "SQL/" + a[1]["domain"] + "/train/42"
    env.close()


def test_long_horizon() -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1", long_horizon=True)
    transcript = run_episode(env, 4)
    steps = transcript[2:]
    info = steps[-1][-1]
    assert info["success"]
    assert len(steps) >= 16
    assert len([k for k in info["task_components"] if k.endswith("emailed")]) >= 5
    boundaries = [s[-1]["subtask_boundary"] for s in steps]
    assert sum(boundaries) >= 10
    indices = [s[-1]["subtask_index"] for s in steps]
    assert indices == sorted(indices) and indices[-1] == 5
    env.close()


def test_max_steps_truncates() -> None:
    env = gym.make("AgentRL/SQL-v0", max_steps=2)
    env.reset(seed=0)
    _, _, term, trunc, info = env.step("nonsense")
    assert not term and not trunc
    _, reward, term, trunc, info = env.step("nonsense")
    assert trunc and not term and info["success"] is False
    assert reward == pytest.approx(-0.1)
    env.close()


def test_version_exposed() -> None:
    assert agentrl_envs.__version__


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_infos_merge_when_sub_envs_are_out_of_step(mode: str) -> None:
    """One sub-env autoresets while another steps: every info key keeps one type across sub-envs."""
    from agentrl_envs.core.actions import format_call

    finish = format_call("finish", {"answer": "x"})
    sql = format_call("sql", {"query": "SELECT 1 AS one"})
    venv = gym.make_vec("AgentRL/SQLPythonSMTP-v1", num_envs=2, vectorization_mode=mode)
    try:
        venv.reset(seed=0)
        _, _, terminated, _, _ = venv.step((finish, sql))
        assert terminated.tolist() == [True, False]
        _, _, _, _, info = venv.step(("not a call", sql))  # sub-env 0 is in its autoreset step
        assert info["_fault"].tolist() == [True, True]
        _, rewards, terminated, _, info = venv.step(("not a call", finish))
        assert terminated.tolist() == [False, True] and rewards[0] == pytest.approx(-0.1)
        assert info["fault_stats"]["faults"].tolist() == [0, 0]
    finally:
        venv.close()
