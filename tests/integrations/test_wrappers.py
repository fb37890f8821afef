"""CandidatesDiscrete: spaces, check_env (Gymnasium and SB3), vector envs, and the SB3 example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl_envs  # noqa: F401
from agentrl_envs.errors import ConfigError, EpisodeError
from agentrl_envs.wrappers.candidates_discrete import MAX_FEATURES, CandidatesDiscrete, hashed_features

from .conftest import run_example


def _env(**kw: object) -> CandidatesDiscrete:
    return CandidatesDiscrete(gym.make("AgentRL/SQL-v0", candidates=4, **kw), features=32)


def test_spaces_and_a_step() -> None:
    env = _env()
    assert env.action_space == gym.spaces.Discrete(4)
    assert env.observation_space.shape == (5 * 32 + 4,)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and env.observation_space.contains(obs)
    oracle = env.unwrapped.oracle_action()
    index = info["candidates"].index(oracle)
    obs, reward, terminated, truncated, info = env.step(index)
    assert info["action_text"] == oracle and env.observation_space.contains(obs)
    env.close()


def test_gymnasium_check_env_and_determinism() -> None:
    env = _env()
    check_env(env, skip_render_check=True)
    a, _ = env.reset(seed=3)
    b, _ = env.reset(seed=3)
    assert np.array_equal(a, b)
    env.close()


def test_sb3_check_env() -> None:
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    env = _env(candidates_difficulty="hard")
    sb3_checker.check_env(env, warn=True)
    env.close()


def test_vector_env() -> None:
    vec = gym.make_vec("AgentRL/SQL-v0", num_envs=2, vectorization_mode="sync", wrappers=[CandidatesDiscrete], candidates=3)
    obs, info = vec.reset(seed=0)
    assert obs.shape == (2, 4 * 128 + 3)
    for _ in range(6):
        obs, reward, terminated, truncated, info = vec.step(np.array([0, 1]))
        assert obs.shape == (2, 4 * 128 + 3) and np.isfinite(reward).all()
    vec.close()


FRAMEWORKS_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "frameworks.md"


def test_the_guides_sb3_make_vec_env_recipe_runs_as_written() -> None:
    # make_vec_env passes render_mode="rgb_array" unless env_kwargs names one: the recipe failed as written
    env_util = pytest.importorskip("stable_baselines3.common.env_util")
    (recipe,) = re.findall(r"`(make_vec_env\(id, [^`]*\))`", FRAMEWORKS_GUIDE.read_text())
    namespace = {"make_vec_env": env_util.make_vec_env, "CandidatesDiscrete": CandidatesDiscrete, "id": "AgentRL/SQL-v0"}
    vec = eval(recipe, namespace)
    try:
        assert vec.action_space == gym.spaces.Discrete(4)
        obs = vec.reset()
        assert obs.shape == (1, 5 * 128 + 4)
        obs, reward, done, info = vec.step(np.array([0]))
        assert obs.shape == (1, 5 * 128 + 4) and np.isfinite(reward).all()
    finally:
        vec.close()


@pytest.mark.parametrize("render_mode", ["rgb_array", "human", "", "\x00\x1b[31m", "x" * 10_000])
def test_an_unsupported_render_mode_says_what_to_use(render_mode: object) -> None:
    with pytest.raises(ConfigError, match="use 'ansi' or None") as info:
        gym.make("AgentRL/SQL-v0", render_mode=render_mode)
    assert len(str(info.value)) < 300
    assert ("env_kwargs holds 'render_mode': None" in str(info.value)) == (render_mode == "rgb_array")


def test_hashed_features_are_stable_and_bounded() -> None:
    a = hashed_features("SELECT SUM(amount) FROM orders", 16)
    assert np.array_equal(a, hashed_features("select sum(amount) from orders", 16))
    assert set(np.unique(a)) <= {0.0, 1.0} and a.sum() > 0
    assert hashed_features("", 16).sum() == 0


def test_bad_configuration() -> None:
    with pytest.raises(ConfigError, match="candidates"):
        CandidatesDiscrete(gym.make("AgentRL/SQL-v0"))
    with pytest.raises(ConfigError, match="features"):
        CandidatesDiscrete(gym.make("AgentRL/SQL-v0", candidates=4), features=0)
    env = _env()
    env.reset(seed=0)
    with pytest.raises(ConfigError, match=r"0\.\.3"):
        env.step(4)
    for bad in (1.7, "1", "abc", None, float("nan"), np.array([1, 2])):  # a traceback, or 1.7 played as 1
        with pytest.raises(ConfigError, match=r"use an int in 0\.\.3"):
            env.step(bad)
    for good in (np.int64(1), np.array(2), 3.0, np.array([1])):  # [1]: SB3's predict on a batch of one
        _, info = env.reset(seed=0)
        assert env.step(good)[-1]["action_text"] == info["candidates"][int(np.asarray(good).item())]
    env.close()


@pytest.mark.parametrize("features", [10**9, 10**12, MAX_FEATURES + 1, True, np.bool_(True), 0.0, 8.0, float("inf")], ids=repr)
def test_features_out_of_range_is_refused_before_any_allocation(features: object) -> None:
    # 10**9 built a Box of 4e9 float32 values: the process was killed for memory, no message
    with pytest.raises(ConfigError, match=f"features=.*up to {MAX_FEATURES}"):
        CandidatesDiscrete(gym.make("AgentRL/SQL-v0", candidates=3), features=features)


def test_features_and_candidates_together_are_bounded() -> None:
    with pytest.raises(ConfigError, match="fewer features or fewer candidates"):
        CandidatesDiscrete(gym.make("AgentRL/SQL-v0", candidates=1024), features=MAX_FEATURES)


def test_a_numpy_int_is_a_valid_features_value() -> None:
    env = CandidatesDiscrete(gym.make("AgentRL/SQL-v0", candidates=3), features=np.int64(8))
    assert env.features == 8 and type(env.features) is int and env.observation_space.shape == (4 * 8 + 3,)
    env.close()


@pytest.mark.parametrize(
    "action",
    [True, False, np.bool_(True), np.array(True), float("inf"), float("-inf"), np.float64("inf"), 10**30, 1 + 0j, b"1"],
    ids=repr,
)
def test_bools_infinities_and_non_numbers_are_refused_not_played(action: object) -> None:
    # True was played as candidate 1 and False as 0; inf raised a raw OverflowError
    env = _env()
    env.reset(seed=0)
    with pytest.raises(ConfigError, match=r"use an int in 0\.\.3"):
        env.step(action)
    env.close()


def test_a_huge_action_is_named_shortly_in_the_error() -> None:
    env = _env()
    env.reset(seed=0)
    with pytest.raises(ConfigError) as caught:
        env.step("x" * 1_000_000)
    assert len(str(caught.value)) < 300
    env.close()


def test_step_out_of_order_is_an_episode_error() -> None:
    env = _env()
    with pytest.raises(EpisodeError, match=r"reset\(\) before step\(\)"):
        env.step(0)
    _, info = env.reset(seed=0)
    while True:  # the oracle's index each step, to the episode's end
        _, _, terminated, truncated, info = env.step(info["candidates"].index(env.unwrapped.oracle_action()))
        if terminated or truncated:
            break
    # a valid index after the end: the message says the episode ended, not "use an int in 0..3"
    with pytest.raises(EpisodeError, match="episode has ended"):
        env.step(0)
    env.close()
    env.close()  # twice is fine
    with pytest.raises(EpisodeError, match=r"reset\(\) before step\(\)"):
        env.step(0)
    obs, _ = env.reset(seed=0)  # and a closed env can start again
    assert env.observation_space.contains(obs)
    env.close()


@pytest.mark.slow
def test_sb3_ppo_example(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = run_example("sb3_ppo.py", "--timesteps", "2048", "--eval-episodes", "5", extra_env={"TMPDIR": str(tmp_path)})
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("SB3-")]  # SB3's default logger folder
    assert "sb3 check_env: ok" in out
    result = json.loads(re.search(r"^sb3 result: (.*)$", out, flags=re.M).group(1))
    assert result["timesteps"] == 2048
    assert all(0.0 <= result[k] <= 1.0 for k in ("ppo", "random", "overlap"))
