"""Reference agents: an oracle that follows the gold plan, random baselines and a no-model heuristic.

All have ``act(observation, info) -> str`` and work on a single env (wrapped or not). The candidate
agents (:class:`OverlapAgent`, :class:`RandomCandidateAgent`) need ``candidates=K`` and read only
what a learner sees (the instruction, the last observation, ``info["candidates"]``); their
``choose`` gives the index, for a ``Discrete(K)`` view such as
:class:`~agentrl_envs.wrappers.CandidatesDiscrete`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from agentrl_envs.actions import format_call
from agentrl_envs.candidates import overlap_score, overlap_tokens
from agentrl_envs.core import ToolUseEnv
from agentrl_envs.errors import ConfigError
from agentrl_envs.openai_agent import OpenAIChatAgent
from agentrl_envs.tasks.domains import DOMAINS

__all__ = ["OpenAIChatAgent", "OracleAgent", "OverlapAgent", "RandomAgent", "RandomCandidateAgent"]


def _core(env: gym.Env[Any, Any]) -> ToolUseEnv:
    core = env.unwrapped
    if not isinstance(core, ToolUseEnv):
        raise TypeError(f"expected an agentrl env, got {type(core).__name__}")
    return core


class OracleAgent:
    """Follows the task's gold plan from whatever state the episode is in.

    It reads the env's progress, not the observation, so it recovers from any state its own or
    candidate actions lead to: a wrong query is simply followed by the right one.
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        self.env = _core(env)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return self.env.oracle_action()


class RandomAgent:
    """Uniformly random tool calls with plausible arguments: a floor for learning curves.

    Args:
        env: the env to act in (for its tools and the task's schema).
        seed: seed of the agent's own generator.
    """

    def __init__(self, env: gym.Env[Any, Any], seed: int | None = None) -> None:
        self.env = _core(env)
        self.rng = np.random.default_rng(seed)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        task = self.env.task
        tool = str(self.rng.choice(list(self.env.tools)))
        domain = DOMAINS[task.domain] if task is not None else DOMAINS["retail"]
        number = round(float(self.rng.uniform(0, domain.scale * 10)), 2)
        return format_call(tool, self.env.tools[tool].random_arguments(task, self.rng, number))


def _candidates(info: dict[str, Any]) -> list[str]:
    candidates = info.get("candidates")
    if not candidates:
        raise ConfigError("this agent picks from info['candidates']: make the env with candidates=K (K >= 1)")
    return list(candidates)


class RandomCandidateAgent:
    """Picks one of ``info["candidates"]`` uniformly: the chance level of the candidates view.

    Args:
        seed: seed of the agent's own generator.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, observation: str, info: dict[str, Any]) -> int:
        return int(self.rng.integers(len(_candidates(info))))

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return _candidates(info)[self.choose(observation, info)]


class OverlapAgent:
    """No-model heuristic: the candidate sharing the most words and numbers with the context.

    The context is the episode's instruction (from the reset ``info``, remembered) and the last
    observation; the score is :func:`~agentrl_envs.candidates.overlap_score` (distinct lower-cased
    words and numbers in common). Ties are broken uniformly by the agent's generator. It solves
    most tasks with ``candidates_difficulty="easy"`` and scores like :class:`RandomCandidateAgent`
    with ``"hard"``; read a learning curve against both.

    Args:
        seed: seed of the generator that breaks ties.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.instruction = ""

    def scores(self, observation: str, info: dict[str, Any]) -> list[int]:
        """The overlap score of each candidate (remembers ``info["instruction"]`` when present)."""
        if isinstance(info.get("instruction"), str):
            self.instruction = info["instruction"]
        tokens = overlap_tokens(f"{self.instruction}\n{observation}")
        return [overlap_score(c, tokens) for c in _candidates(info)]

    def choose(self, observation: str, info: dict[str, Any]) -> int:
        scores = self.scores(observation, info)
        best = [i for i, s in enumerate(scores) if s == max(scores)]
        return best[int(self.rng.integers(len(best)))]

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return _candidates(info)[self.choose(observation, info)]
