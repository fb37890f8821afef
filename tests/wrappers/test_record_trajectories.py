"""RecordTrajectories on single and vector envs: what is stored, and where episodes are cut."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from agentrl_envs.agents import OracleAgent, RandomAgent
from agentrl_envs.data import (
    ReplayBuffer,
    ShardWriter,
    StorageError,
    Trajectory,
    as_float32,
    read_shards,
)
from agentrl_envs.wrappers.record_trajectories import RecordTrajectories, RecordVectorTrajectories

ENV_ID = "AgentRL/SQLPythonSMTP-v1"


class RecorderKeysOnly(gym.Wrapper[Any, Any, Any, Any]):
    """Keeps only the info keys the recorder reads, working around an env-side vector bug.

    ``info["tool_result"]`` is None after reset and a dict after a step, and ``info["fault"]`` is
    None or a dict; SyncVectorEnv's ``_add_info`` raises AttributeError when one sub-env reports
    None and a later one a dict in the same step, which these tests provoke on purpose (one
    sub-env in its autoreset step while the other steps).
    """

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, _keep(info)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, _keep(info)


def _keep(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k in ("task_id", "domain", "split", "reward_components", "tool", "success")}


def run_single(env: gym.Env[Any, Any], seed: int) -> list[tuple[str, str, float, dict[str, float]]]:
    """One oracle episode; returns (action, observation, reward, components) per step."""
    agent = OracleAgent(env)
    obs, info = env.reset(seed=seed)
    steps = []
    done = False
    while not done:
        action = agent.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((action, obs, float(reward), dict(info["reward_components"])))
        done = terminated or truncated
    return steps


def test_single_env_records_each_episode() -> None:
    sink: list[Trajectory] = []
    env = RecordTrajectories(gym.make(ENV_ID), sink, policy_id="oracle-v1")
    expected = [run_single(env, seed) for seed in (3, 4)]
    env.close()
    assert env.episodes_recorded == 2 and len(sink) == 2
    for traj, steps, seed in zip(sink, expected, (3, 4)):
        assert traj.env_id == ENV_ID and traj.seed == seed and traj.policy_id == "oracle-v1"
        assert traj.task_id.startswith("SQLPythonSMTP/") and traj.split == "train" and traj.domain
        assert traj.terminated and not traj.truncated and traj.success
        assert [s.action for s in traj.steps] == [a for a, _, _, _ in steps]
        assert [s.observation.decode() for s in traj.steps] == [o for _, o, _, _ in steps]
        assert [s.reward for s in traj.steps] == [r for _, _, r, _ in steps]
        assert [dict(s.reward_components) for s in traj.steps] == [c for _, _, _, c in steps]
        assert [s.tool for s in traj.steps] == ["sql", "python", "sql", "smtp", "finish"]  # v1: a staff lookup
        assert traj.steps[1].prompt == traj.steps[0].observation.decode()  # the prompt is what the policy saw
        assert "task" in traj.steps[0].prompt.lower() or traj.steps[0].prompt
        assert traj.steps[-1].terminated and not any(s.terminated for s in traj.steps[:-1])


def test_annotations_partial_episodes_and_sinks(tmp_path: Path) -> None:
    with ReplayBuffer.create(tmp_path / "b.ring", capacity_bytes=4 << 20) as buf:
        env = RecordTrajectories(gym.make(ENV_ID), buf)
        agent = OracleAgent(env)
        obs, info = env.reset(seed=1)
        env.annotate(log_prob=-2.5, value=0.5, embedding=np.ones(4), token_ids=[5, 6], prompt="full context")
        env.step(agent.act(obs, info))
        env.step(agent.act(obs, info))
        with pytest.raises(TypeError, match="unknown fields"):
            env.annotate(logprob=1.0)
        # refused when given, not after the env has stepped
        for bad, use in ({"log_prob": "abc"}, "a number"), ({"value": [1.0, 2.0]}, "a number"), ({"prompt": 3}, "a str"):
            with pytest.raises(TypeError, match=f"use {use}"):
                env.annotate(**bad)
        with pytest.raises(TypeError, match="an array of numbers"):
            env.annotate(embedding=[[1.0], [2.0, 3.0]])
        env.reset(seed=2)  # cuts the first episode short: it is recorded as partial
        env.close()  # the second has no steps: nothing to record
        assert len(buf) == 1
        traj = buf.get(0)
    assert len(traj.steps) == 2 and not traj.terminated and not traj.truncated
    first, second = traj.steps
    assert first.log_prob == -2.5 and first.value == 0.5 and first.prompt == "full context"
    assert as_float32(first.embedding).tolist() == [1.0] * 4
    assert second.log_prob == 0.0 and second.embedding == b""  # annotations last one step

    with ShardWriter(tmp_path / "shards") as shards:
        env = RecordTrajectories(gym.make(ENV_ID, max_steps=2), shards, record_partial=False)
        agent = RandomAgent(env, seed=0)
        for seed in range(2):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
                done = terminated or truncated
        obs, info = env.reset(seed=9)
        env.step(agent.act(obs, info))
        env.close()  # partial, and record_partial=False: dropped
    stored = list(read_shards(tmp_path / "shards"))
    assert len(stored) == 2 and all(t.truncated or t.terminated for t in stored)


def test_close_closes_the_env_when_the_sink_refuses_the_partial_episode(tmp_path: Path) -> None:
    buf = ReplayBuffer.create(tmp_path / "b.ring", capacity_bytes=64 << 10)
    env = RecordTrajectories(gym.make("CartPole-v1"), buf)
    closed: list[bool] = []
    env.unwrapped.close = lambda: closed.append(True)  # type: ignore[method-assign]
    env.reset(seed=0)
    env.step(0)
    buf.close()  # closed before the env: the partial episode has nowhere to go
    with pytest.raises(StorageError, match="closed"):
        env.close()
    assert closed == [True]
    buf = ReplayBuffer.create(tmp_path / "v.ring", capacity_bytes=64 << 10)
    vec = RecordVectorTrajectories(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"), buf)
    vec.reset(seed=0)
    vec.step(np.zeros(2, dtype=np.int64))
    buf.close()
    with pytest.raises(StorageError, match="closed"):
        vec.close()
    assert vec.env.closed


def test_non_text_env_and_wrong_wrapper() -> None:
    sink: list[Trajectory] = []
    env = RecordTrajectories(gym.make("CartPole-v1"), sink)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        done = terminated or truncated
    assert sink[0].env_id == "CartPole-v1" and sink[0].steps[0].action in ("0", "1")
    assert sink[0].steps[0].observation.startswith(b"[")
    vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync")
    with pytest.raises(TypeError, match="RecordVectorTrajectories"):
        RecordTrajectories(vec, sink)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RecordTrajectories"):
        RecordVectorTrajectories(gym.make(ENV_ID), sink)  # type: ignore[arg-type]
    vec.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_cuts_episodes_per_sub_env(mode: AutoresetMode) -> None:
    """Sub-env 0 follows the oracle, sub-env 1 acts at random and is truncated at 6 steps.

    The test keeps its own reference of each sub-env's episodes, skipping NEXT_STEP reset steps,
    and compares it with what was recorded.
    """
    sink: list[Trajectory] = []
    vec = gym.make_vec(
        ENV_ID,
        num_envs=2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": mode},
        wrappers=[RecorderKeysOnly],
        max_steps=6,
    )
    env = RecordVectorTrajectories(vec, sink, policy_id="mixed")
    cores = [sub.unwrapped for sub in vec.envs]  # type: ignore[attr-defined]
    random_agent = RandomAgent(vec.envs[1], seed=0)  # type: ignore[attr-defined]
    obs, info = env.reset(seed=10)
    reference: list[list[list[tuple[str, float]]]] = [[[]], [[]]]
    resetting = [False, False]
    for _ in range(40):
        actions = tuple(
            "ignored" if resetting[i] else (cores[0].oracle_action() if i == 0 else random_agent.act(obs[i], {}))
            for i in range(2)
        )
        env.annotate(log_prob=np.array([-1.0, -2.0]))
        obs, rewards, terminations, truncations, info = env.step(actions)
        for i in range(2):
            if resetting[i]:
                resetting[i] = False
                continue
            reference[i][-1].append((actions[i], float(rewards[i])))
            if terminations[i] or truncations[i]:
                reference[i].append([])
                resetting[i] = mode == AutoresetMode.NEXT_STEP
    env.close()
    finished = [[ep for ep in reference[i][:-1]] for i in range(2)]
    partial = [reference[i][-1] for i in range(2)]
    assert len(finished[0]) >= 3 and len(finished[1]) >= 3
    recorded = {i: [t for t in sink if t.steps[0].log_prob == -1.0 - i] for i in range(2)}
    for i in range(2):
        expected = finished[i] + ([partial[i]] if partial[i] else [])
        got = [[(s.action, s.reward) for s in t.steps] for t in recorded[i]]
        assert sorted(got) == sorted(expected), f"sub-env {i}"
        assert all("ignored" not in s.action for t in recorded[i] for s in t.steps)
        for t in recorded[i]:  # each episode starts from its own reset observation, not the last one's end
            assert "Episode finished" not in t.steps[0].prompt and "episode truncated" not in t.steps[0].prompt
            assert t.task_id and t.steps[0].prompt
    assert [t.seed for t in recorded[0] if t.HasField("seed")] == [10]
    assert [t.seed for t in recorded[1] if t.HasField("seed")] == [11]
    assert all(t.success for t in recorded[0] if t.terminated)
    assert all(len(t.steps) == 6 and t.truncated for t in recorded[1] if t.truncated)
    with pytest.raises(ValueError, match="one value per sub-env"):
        env.annotate(value=[1.0])
    with pytest.raises(TypeError, match=r"one value per sub-env \(2\), got float"):
        env.annotate(log_prob=0.5)  # a scalar was a raw len() TypeError
    with pytest.raises(TypeError, match="use a number"):
        env.annotate(value=["a", "b"])


def test_vector_env_with_autoreset_disabled() -> None:
    """DISABLED autoreset: a done sub-env idles until the caller resets it with ``reset_mask``."""
    sink: list[Trajectory] = []
    vec = gym.make_vec(
        ENV_ID,
        num_envs=2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},
        wrappers=[RecorderKeysOnly],
    )
    env = RecordVectorTrajectories(vec, sink)
    cores = [sub.unwrapped for sub in vec.envs]  # type: ignore[attr-defined]
    env.reset(seed=5)
    finish = '{"name": "finish", "arguments": {"answer": "0"}}'
    sql = '{"name": "sql", "arguments": {"query": "SELECT 1"}}'
    _, _, terminations, _, _ = env.step((finish, sql))  # sub-env 0 ends at once
    assert terminations.tolist() == [True, False] and len(sink) == 1 and sink[0].seed == 5
    env.reset(options={"reset_mask": np.array([True, False])})  # restart only sub-env 0
    env.step((cores[0].oracle_action(), finish))
    assert len(sink) == 2 and [s.action for s in sink[1].steps] == [sql, finish] and sink[1].seed == 6
    env.close()  # sub-env 0's new episode is recorded as partial
    assert len(sink) == 3 and len(sink[2].steps) == 1 and not sink[2].HasField("seed")


def test_a_seed_past_int64_is_refused_before_the_episode_in_progress_is_touched() -> None:
    # the trajectory's seed field is an int64: 2**63 failed inside protobuf after the env had reset
    # (and after the episode in progress had been flushed), leaving that episode unrecorded
    sink: list[Trajectory] = []
    env = RecordTrajectories(gym.make(ENV_ID), sink)
    env.reset(seed=1)
    core = env.unwrapped
    env.step(core.oracle_action())  # type: ignore[attr-defined]
    for seed in (2**63, np.uint64(2**63), 10**5000):
        with pytest.raises(ValueError, match=r"int64; use a seed from 0 to 2\*\*63 - 1"):
            env.reset(seed=seed)
    assert sink == []  # nothing flushed
    env.step(core.oracle_action())  # type: ignore[attr-defined]  # the episode goes on
    env.reset(seed=2**63 - 1)  # the largest storable seed is recorded as is
    env.step(core.oracle_action())  # type: ignore[attr-defined]
    env.close()
    assert [t.seed for t in sink] == [1, 2**63 - 1] and len(sink[0].steps) == 2
    vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", wrappers=[RecorderKeysOnly])
    venv = RecordVectorTrajectories(vec, sink)
    with pytest.raises(ValueError, match=f"use a seed from 0 to {2**63 - 2}"):
        venv.reset(seed=2**63 - 1)  # sub-env 1 would get 2**63
    venv.reset(seed=2**63 - 2)
    venv.close()
