"""Reward normalization wrappers on scripted batches and on the real envs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from agentrl_envs import ConfigError
from agentrl_envs.agents import OracleAgent
from agentrl_envs.wrappers.normalize_reward import NormalizeRewardBatch, NormalizeRewardSingleEnv


class ScriptedVectorEnv(VectorEnv[Any, Any, Any]):
    """A vector env that returns scripted rewards and episode ends, row by row."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}  # noqa: RUF012

    def __init__(self, rewards: Any, terminated: Any = None, truncated: Any = None) -> None:
        self.rewards = np.asarray(rewards, dtype=float)
        self.num_envs = self.rewards.shape[1]
        zeros = np.zeros(self.rewards.shape, bool)
        self.terminated = zeros if terminated is None else np.asarray(terminated, bool)
        self.truncated = zeros if truncated is None else np.asarray(truncated, bool)
        self.single_observation_space = spaces.Discrete(2)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = spaces.MultiDiscrete([2] * self.num_envs)
        self.action_space = spaces.MultiDiscrete([2] * self.num_envs)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return np.zeros(self.num_envs, int), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        t = self.t
        self.t += 1
        return np.zeros(self.num_envs, int), self.rewards[t], self.terminated[t], self.truncated[t], {"t": t}


def run(wrapper: Any, steps: int) -> tuple[np.ndarray, np.ndarray]:
    wrapper.reset(seed=0)
    out, raw = [], []
    for _ in range(steps):
        _, reward, _, _, info = wrapper.step(np.zeros(wrapper.num_envs, int))
        out.append(reward)
        raw.append(info["raw_reward"])
        assert info["_raw_reward"].all() and info["t"] == len(out) - 1  # the inner info is kept
    return np.array(out), np.array(raw)


def test_zscore_on_a_known_batch() -> None:
    rewards = [[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]]
    out, raw = run(NormalizeRewardBatch(ScriptedVectorEnv(rewards)), 2)
    np.testing.assert_allclose(raw, rewards)
    np.testing.assert_allclose(out[0], [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])
    np.testing.assert_allclose(out[1], [-np.sqrt(0.5), -np.sqrt(0.5), np.sqrt(2.0)])
    np.testing.assert_allclose(out.mean(axis=1), 0.0, atol=1e-12)


def test_constant_rewards_clip_sigma_and_never_nan() -> None:
    rewards = [[0.5, 0.5, 0.5, 0.5]] * 3 + [[0.0] * 4]
    out, _ = run(NormalizeRewardBatch(ScriptedVectorEnv(rewards), min_sigma=1e-8), 4)
    assert np.all(np.isfinite(out)) and np.all(out == 0.0)
    scaled, _ = run(NormalizeRewardBatch(ScriptedVectorEnv(rewards), mode="scale"), 4)
    assert np.all(np.isfinite(scaled))


def test_zscore_leaves_next_step_reset_rows_out() -> None:
    # Env 0 ends at row 0, so row 1 is its reset step (reward 0): not in the statistics, output 0.
    rewards = [[1.0, 1.0, 1.0], [0.0, 2.0, 4.0]]
    term = [[True, False, False], [False, False, False]]
    out, _ = run(NormalizeRewardBatch(ScriptedVectorEnv(rewards, term)), 2)
    np.testing.assert_allclose(out[1], [0.0, -1.0, 1.0])


def test_scale_mode_keeps_signs_and_matches_gymnasium() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.normal(0.3, 1.0, size=(50, 4))
    out, raw = run(NormalizeRewardBatch(ScriptedVectorEnv(rewards), mode="scale", gamma=0.9), 50)
    assert np.all(np.sign(out) == np.sign(raw))
    ratio = raw / out
    np.testing.assert_allclose(ratio.std(axis=1), 0.0, atol=1e-9)  # one positive scale per step, no shift
    theirs = gym.wrappers.vector.NormalizeReward(ScriptedVectorEnv(rewards), gamma=0.9)
    theirs.reset(seed=0)
    expected = np.array([theirs.step(np.zeros(4, int))[1] for _ in range(50)])
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_scale_mode_single_env_and_episode_ends() -> None:
    rewards = [[0.0], [0.0], [1.0], [0.0], [0.0], [1.0]]
    term = [[False], [False], [True], [False], [False], [True]]
    wrapper = NormalizeRewardBatch(ScriptedVectorEnv(rewards, term), mode="scale")
    out, _ = run(wrapper, 6)
    assert np.all(np.isfinite(out)) and out[2, 0] > 0 and out[3, 0] == 0.0
    assert wrapper.sigma > 0


def test_zscore_over_one_env_is_refused() -> None:
    with pytest.raises(ConfigError, match="scale"):
        NormalizeRewardBatch(ScriptedVectorEnv([[1.0]]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "z"},
        {"mode": None},
        {"min_sigma": 0},
        {"min_sigma": -1.0},
        {"min_sigma": float("nan")},
        {"min_sigma": float("inf")},
        {"min_sigma": "1"},
        {"gamma": 1.5},
        {"gamma": True},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        NormalizeRewardBatch(ScriptedVectorEnv([[1.0, 2.0]]), **kwargs)
    with pytest.raises(ConfigError):
        NormalizeRewardSingleEnv(gym.make("AgentRL/SMTP-v0"), **kwargs)


def test_on_a_real_vector_env_keeps_raw_rewards() -> None:
    envs = NormalizeRewardBatch(gym.make_vec("AgentRL/SQL-v0", num_envs=3, vectorization_mode="sync"))
    try:
        envs.reset(seed=0)
        _, reward, _, _, info = envs.step(("not a call", "{}", "<tool_call>nope</tool_call>"))
        np.testing.assert_allclose(info["raw_reward"], [-0.1, -0.1, -0.1])
        np.testing.assert_array_equal(reward, [0.0, 0.0, 0.0])  # constant batch: clipped sigma, no NaN
        assert "reward_components" in info
    finally:
        envs.close()


def test_single_env_wrapper_with_the_oracle() -> None:
    for mode in ("scale", "zscore"):
        env = NormalizeRewardSingleEnv(gym.make("AgentRL/SQLPythonSMTP-v1"), mode=mode)
        agent = OracleAgent(env)
        try:
            for seed in range(2):
                obs, info = env.reset(seed=seed)
                done = False
                while not done:
                    obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
                    assert np.isfinite(reward)
                    assert info["raw_reward"] == pytest.approx(sum(info["reward_components"].values()))
                    done = terminated or truncated
                if mode == "scale":
                    assert reward > 0  # the solving step stays positive
        finally:
            env.close()


def test_the_old_name_is_gone() -> None:
    # NormalizeReward is Gymnasium's wrapper; ours is NormalizeRewardSingleEnv (the 0.1.0 release note says so)
    with pytest.raises(ImportError, match="NormalizeReward"):
        from agentrl_envs.wrappers.normalize_reward import NormalizeReward  # noqa: F401
