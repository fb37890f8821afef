"""Wrappers that give the text envs the spaces classic RL libraries expect.

:class:`CandidatesDiscrete` turns an env made with ``candidates=K`` into ``Discrete(K)`` actions
and a fixed-size ``Box`` observation, so Stable-Baselines3, CleanRL or any ``Box``/``Discrete``
learner trains on it unchanged (``check_env`` of Gymnasium and SB3 pass; it works inside
``gym.make_vec(..., wrappers=[CandidatesDiscrete])`` and SB3's ``make_vec_env(wrapper_class=...)``).
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agentrl_envs.candidates import overlap_tokens, word_tokens
from agentrl_envs.core import ToolUseEnv
from agentrl_envs.errors import ConfigError

__all__ = ["CandidatesDiscrete", "hashed_features"]


def hashed_features(text: str, features: int) -> np.ndarray:
    """0/1 vector of length ``features``: bucket ``crc32(token) % features`` is 1 for each distinct token.

    Tokens are :func:`~agentrl_envs.candidates.overlap_tokens` (lower-cased words and numbers) and
    their adjacent pairs in order of appearance (``"sum amount"``). CRC-32 is the same in every
    process and on every machine, unlike Python's salted ``hash``.
    """
    words = word_tokens(text)
    grams = set(words) | {f"{a} {b}" for a, b in itertools.pairwise(words)}
    out = np.zeros(features, dtype=np.float32)
    for gram in grams:
        out[zlib.crc32(gram.encode("utf-8")) % features] = 1.0
    return out


class CandidatesDiscrete(gym.Wrapper[Any, Any, Any, Any], gym.utils.RecordConstructorArgs):
    """``Discrete(K)`` over ``info["candidates"]`` with a hashed n-gram ``Box`` observation.

    Action ``i`` sends ``info["candidates"][i]`` (the K shuffled actions of the last step) to the env.

    The observation is a float32 vector of ``(K + 1) * features + K`` values in [0, 1]:

    - block 0: :func:`hashed_features` of the instruction and the last observation;
    - block ``1 + i``: :func:`hashed_features` of candidate ``i``;
    - the last K values: the share of candidate ``i``'s distinct tokens that occur in block 0's text
      (the overlap heuristic's signal, normalized).

    After the episode's last step there are no candidates: their blocks are zeros. ``info`` gains
    ``observation_text`` (the text observation) and, after a step, ``action_text`` (the call sent).

    Args:
        env: an agentrl env made with ``candidates=K`` (K >= 2), wrapped or not.
        features: hash buckets per block (default 128).
    """

    def __init__(self, env: gym.Env[Any, Any], features: int = 128) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, features=features)
        gym.Wrapper.__init__(self, env)
        core = env.unwrapped
        if not isinstance(core, ToolUseEnv):
            raise ConfigError(f"CandidatesDiscrete wraps an agentrl env, got {type(core).__name__}")
        if core.candidates < 2:
            raise ConfigError(f"CandidatesDiscrete needs the env made with candidates=K >= 2, got candidates={core.candidates}")
        if not isinstance(features, int) or isinstance(features, bool) or features < 1:
            raise ConfigError(f"features={features!r}: use a positive int (hash buckets per block), e.g. 128")
        self.k = core.candidates
        self.features = features
        self.action_space = spaces.Discrete(self.k)
        self.observation_space = spaces.Box(0.0, 1.0, shape=((self.k + 1) * features + self.k,), dtype=np.float32)
        self._candidates: list[str] = []
        self._instruction = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._instruction = str(info.get("instruction", ""))
        info["observation_text"] = observation
        return self._encode(observation, info), info

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        try:  # an int, a numpy int or a 0-d int array; not 1.7 or "1" (int() would play them as 1)
            index = int(action) if int(action) == action else -1
        except (TypeError, ValueError):  # None, NaN, "abc", an array of several actions
            index = -1
        if not 0 <= index < self.k or not self._candidates:
            raise ConfigError(f"action {action!r}: use an int in 0..{self.k - 1}, after reset()")
        observation, reward, terminated, truncated, info = self.env.step(self._candidates[index])
        info["action_text"] = self._candidates[index]
        info["observation_text"] = observation
        return self._encode(observation, info), reward, terminated, truncated, info

    def _encode(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        context = f"{self._instruction}\n{observation}"
        self._candidates = list(info.get("candidates") or [])
        out = np.zeros(((self.k + 1) * self.features + self.k,), dtype=np.float32)
        f = self.features
        out[:f] = hashed_features(context, f)
        tokens = overlap_tokens(context)
        for i, candidate in enumerate(self._candidates[: self.k]):
            out[(i + 1) * f : (i + 2) * f] = hashed_features(candidate, f)
            own = overlap_tokens(candidate)
            out[(self.k + 1) * f + i] = len(own & tokens) / max(1, len(own))
        return out
