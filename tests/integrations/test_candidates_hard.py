"""candidates_difficulty="hard": wrong candidates keep the instruction's entities, and the overlap heuristic is no better than chance."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401
from agentrl_envs.agents import OverlapAgent, RandomCandidateAgent
from agentrl_envs.errors import ConfigError

SEEDS = range(60)


def _success(env_id: str, agent: object, difficulty: str) -> float:
    env = gym.make(env_id, candidates=4, candidates_difficulty=difficulty)
    solved = 0
    for seed in SEEDS:
        observation, info = env.reset(seed=seed)
        done = False
        while not done:
            observation, _, terminated, truncated, info = env.step(agent.act(observation, info))  # type: ignore[attr-defined]
            done = terminated or truncated
        solved += bool(info["success"])
    env.close()
    return solved / len(SEEDS)


def test_overlap_beats_random_on_easy_and_not_on_hard() -> None:
    easy_gap = _success("AgentRL/SQL-v0", OverlapAgent(seed=0), "easy") - _success(
        "AgentRL/SQL-v0", RandomCandidateAgent(seed=0), "easy"
    )
    hard_gap = _success("AgentRL/SQL-v0", OverlapAgent(seed=0), "hard") - _success(
        "AgentRL/SQL-v0", RandomCandidateAgent(seed=0), "hard"
    )
    assert easy_gap > 0.1  # the surface heuristic works on easy candidates...
    assert abs(hard_gap) <= 0.1  # ...and scores within 0.1 of random on hard ones


def test_hard_candidates_reuse_the_instruction_and_hold_the_oracle_once() -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1", candidates=4, candidates_difficulty="hard")
    for seed in range(5):
        observation, info = env.reset(seed=seed)
        done = False
        while not done:
            oracle = env.unwrapped.oracle_action()
            candidates = info["candidates"]
            assert len(candidates) == len(set(candidates)) == 4 and candidates.count(oracle) == 1
            observation, _, terminated, truncated, info = env.step(oracle)
            done = terminated or truncated
        assert info["success"]
    env.close()


def test_easy_is_the_default_and_unchanged() -> None:
    a, b = gym.make("AgentRL/SQL-v0", candidates=4), gym.make("AgentRL/SQL-v0", candidates=4, candidates_difficulty="easy")
    assert a.reset(seed=2)[1]["candidates"] == b.reset(seed=2)[1]["candidates"]
    a.close()
    b.close()


def test_bad_difficulty_and_agents_without_candidates() -> None:
    with pytest.raises(ConfigError, match="candidates_difficulty"):
        gym.make("AgentRL/SQL-v0", candidates=4, candidates_difficulty="medium")
    env = gym.make("AgentRL/SQL-v0")
    observation, info = env.reset(seed=0)
    with pytest.raises(ConfigError, match="candidates=K"):
        OverlapAgent().act(observation, info)
    env.close()
