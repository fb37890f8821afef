"""Reference agents: an oracle that follows the gold plan, random baselines and a no-model heuristic.

All have ``act(observation, info) -> str`` and work on a single env (wrapped or not). The candidate
agents (:class:`OverlapAgent`, :class:`RandomCandidateAgent`) need ``candidates=K`` and read only
what a learner sees (the instruction, the last observation, ``info["candidates"]``); their
``choose`` gives the index, for a ``Discrete(K)`` view such as
:class:`~agentrl_envs.wrappers.candidates_discrete.CandidatesDiscrete`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl_envs.core.actions import format_call
from agentrl_envs.core.candidates import overlap_score, overlap_tokens
from agentrl_envs.core.env import ToolUseEnv
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks.domains import DOMAINS

__all__ = ["OracleAgent", "OverlapAgent", "RandomAgent", "RandomCandidateAgent"]


def _core(env: gym.Env[Any, Any]) -> ToolUseEnv:
    core = getattr(env, "unwrapped", None)  # None or an env id raised a raw AttributeError
    if not isinstance(core, ToolUseEnv):
        raise TypeError(
            f"expected an agentrl env, got {type(core if core is not None else env).__name__}; "
            "pass the env itself, e.g. env = gym.make('AgentRL/SQL-v0')"
        )
    return core


def _rng(seed: Any) -> np.random.Generator:
    """The agent's generator; a seed numpy refuses (-1, 1.5, "x") is a ConfigError that says what to use."""
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0):
        raise ConfigError(f"seed={seed!r:.80}: use a non-negative int, or None for a fresh seed")
    return np.random.default_rng(None if seed is None else int(seed))


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
        self.rng = _rng(seed)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        task = self.env.task
        tool = str(self.rng.choice(list(self.env.tools)))
        domain = DOMAINS[task.domain] if task is not None else DOMAINS["retail"]
        number = round(float(self.rng.uniform(0, domain.scale * 10)), 2)
        return format_call(tool, self.env.tools[tool].random_arguments(task, self.rng, number))


def _candidates(info: dict[str, Any]) -> list[str]:
    if not isinstance(info, Mapping):  # None or a list raised a raw AttributeError
        raise TypeError(f"info must be the dict from env.reset() or env.step(), got {type(info).__name__}")
    candidates = info.get("candidates")
    if isinstance(candidates, np.ndarray):  # a vector env's info holds one row per sub-env
        candidates = candidates.tolist()
    if candidates is None or (isinstance(candidates, (list, tuple)) and not candidates):
        raise ConfigError("this agent picks from info['candidates']: make the env with candidates=K (K >= 1)")
    # a str was picked from letter by letter; ints and None went to the env or crashed the scorer
    if not isinstance(candidates, (list, tuple)) or not all(isinstance(c, str) for c in candidates):
        raise ConfigError(
            f"info['candidates'] must be a list of action strings, got {_describe(candidates)}; "
            "pass the info of a single env made with candidates=K (index a vector env's info per sub-env)"
        )
    return list(candidates)


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a {type(value).__name__} of {', '.join(kinds)}"
    return type(value).__name__


class RandomCandidateAgent:
    """Picks one of ``info["candidates"]`` uniformly: the chance level of the candidates view.

    Args:
        seed: seed of the agent's own generator.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = _rng(seed)

    def choose(self, observation: str, info: dict[str, Any]) -> int:
        return int(self.rng.integers(len(_candidates(info))))

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return _candidates(info)[self.choose(observation, info)]


class OverlapAgent:
    """No-model heuristic: the candidate sharing the most words and numbers with the context.

    The context is the episode's instruction (from the reset ``info``, remembered) and the last
    observation; the score is :func:`~agentrl_envs.core.candidates.overlap_score` (distinct lower-cased
    words and numbers in common). Ties are broken uniformly by the agent's generator. It solves
    most tasks with ``candidates_difficulty="easy"`` and scores like :class:`RandomCandidateAgent`
    with ``"hard"``; read a learning curve against both.

    Args:
        seed: seed of the generator that breaks ties.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = _rng(seed)
        self.instruction = ""

    def scores(self, observation: str, info: dict[str, Any]) -> list[int]:
        """The overlap score of each candidate (remembers ``info["instruction"]`` when present)."""
        candidates = _candidates(info)
        if not isinstance(observation, str):
            raise TypeError(f"observation must be the str from env.reset() or env.step(), got {type(observation).__name__}")
        if isinstance(info.get("instruction"), str):
            self.instruction = info["instruction"]
        tokens = overlap_tokens(f"{self.instruction}\n{observation}")
        return [overlap_score(c, tokens) for c in candidates]

    def choose(self, observation: str, info: dict[str, Any]) -> int:
        scores = self.scores(observation, info)
        best = [i for i, s in enumerate(scores) if s == max(scores)]
        return best[int(self.rng.integers(len(best)))]

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return _candidates(info)[self.choose(observation, info)]
