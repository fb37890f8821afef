"""Success rates of the no-model candidate baselines, easy vs hard candidates.

Runs :class:`~agentrl_envs.agents.OverlapAgent` (most words and numbers shared with the instruction
and the last observation) and :class:`~agentrl_envs.agents.RandomCandidateAgent` on the same seeds::

    python examples/candidate_baselines.py --episodes 200 --candidates 4

and prints one row per env and difficulty. A learning curve on the candidates view should be read
against these two lines.
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym

import agentrl_envs
from agentrl_envs.agents import OverlapAgent, RandomCandidateAgent


def success_rate(env_id: str, agent: Any, episodes: int, candidates: int, difficulty: str, split: str = "train") -> float:
    """Share of ``episodes`` (seeds 0..episodes-1) the agent solves."""
    env = gym.make(env_id, candidates=candidates, candidates_difficulty=difficulty, split=split)
    solved = 0
    try:
        for seed in range(episodes):
            observation, info = env.reset(seed=seed)
            done = False
            while not done:
                observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
                done = terminated or truncated
            solved += bool(info["success"])
    finally:
        env.close()
    return solved / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--envs", default=",".join(agentrl_envs.ENV_IDS))
    args = parser.parse_args()
    print(f"{'env':28} {'candidates':10} {'overlap':>8} {'random':>8} {'gap':>7}")
    for env_id in args.envs.split(","):
        for difficulty in ("easy", "hard"):
            overlap = success_rate(env_id, OverlapAgent(seed=0), args.episodes, args.candidates, difficulty)
            rand = success_rate(env_id, RandomCandidateAgent(seed=0), args.episodes, args.candidates, difficulty)
            print(f"{env_id:28} {difficulty:10} {overlap:8.1%} {rand:8.1%} {overlap - rand:+7.1%}", flush=True)


if __name__ == "__main__":
    main()
