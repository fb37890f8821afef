"""Wrappers that give the text envs the spaces classic RL libraries expect.

:class:`CandidatesDiscrete` turns an env made with ``candidates=K`` into ``Discrete(K)`` actions
and a fixed-size ``Box`` observation, so Stable-Baselines3, CleanRL or any ``Box``/``Discrete``
learner trains on it unchanged (``check_env`` of Gymnasium and SB3 pass; it works inside
``gym.make_vec(..., wrappers=[CandidatesDiscrete])`` and SB3's ``make_vec_env(wrapper_class=...)``).
"""

from __future__ import annotations

import itertools
import math
import numbers
import zlib
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agentrl_envs.core.candidates import overlap_tokens, word_tokens
from agentrl_envs.core.env import ToolUseEnv
from agentrl_envs.errors import ConfigError, EpisodeError

__all__ = ["MAX_FEATURES", "CandidatesDiscrete", "hashed_features"]

#: ``features`` at most: 10**9 buckets made a Box of 4e9 floats and the process was killed for memory
MAX_FEATURES = 65536
#: The observation's length at most (float32 values: 64 MiB), whatever K and ``features``
MAX_OBSERVATION_VALUES = 1 << 24


def hashed_features(text: str, features: int) -> np.ndarray:
    """0/1 vector of length ``features``: bucket ``crc32(token) % features`` is 1 for each distinct token.

    Tokens are :func:`~agentrl_envs.core.candidates.overlap_tokens` (lower-cased words and numbers) and
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
        features: hash buckets per block (default 128, at most :data:`MAX_FEATURES`).

    Raises:
        ConfigError: a bad ``env`` or ``features``; at ``step()``, an action that is not an int in
            0..K-1 (a bool, a float with a fraction, a string, an array of several values).
        EpisodeError: ``step()`` before ``reset()`` or after the episode ended.
    """

    def __init__(self, env: gym.Env[Any, Any], features: int = 128) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, features=features)
        gym.Wrapper.__init__(self, env)
        core = env.unwrapped
        if not isinstance(core, ToolUseEnv):
            raise ConfigError(f"CandidatesDiscrete wraps an agentrl env, got {type(core).__name__}")
        if core.candidates < 2:
            raise ConfigError(f"CandidatesDiscrete needs the env made with candidates=K >= 2, got candidates={core.candidates}")
        if not isinstance(features, (int, np.integer)) or isinstance(features, bool) or not 1 <= int(features) <= MAX_FEATURES:
            raise ConfigError(
                f"features={features!r}: use a positive int up to {MAX_FEATURES} (hash buckets per block), e.g. 128"
            )
        features = int(features)
        if (core.candidates + 1) * features + core.candidates > MAX_OBSERVATION_VALUES:
            raise ConfigError(
                f"features={features} with candidates={core.candidates}: the observation would hold "
                f"{(core.candidates + 1) * features + core.candidates} values, over {MAX_OBSERVATION_VALUES}; "
                "use fewer features or fewer candidates"
            )
        self.k = core.candidates
        self.features = features
        self.action_space = spaces.Discrete(self.k)
        self.observation_space = spaces.Box(0.0, 1.0, shape=((self.k + 1) * features + self.k,), dtype=np.float32)
        self._candidates: list[str] = []
        self._instruction = ""
        self._started = False  # reset() was called; step() before it is an EpisodeError

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._instruction = str(info.get("instruction", ""))
        self._started = True
        info["observation_text"] = observation
        return self._encode(observation, info), info

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        index = _index(action)
        if index is None or not 0 <= index < self.k:
            raise ConfigError(f"action {_short(action)}: use an int in 0..{self.k - 1}")
        if not self._started:
            raise EpisodeError("call reset() before step()")
        if not self._candidates:
            raise EpisodeError("the episode has ended; call reset() to start a new one")
        observation, reward, terminated, truncated, info = self.env.step(self._candidates[index])
        info["action_text"] = self._candidates[index]
        info["observation_text"] = observation
        return self._encode(observation, info), reward, terminated, truncated, info

    def close(self) -> None:
        self._candidates = []
        self._started = False
        super().close()

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


def _index(action: Any) -> int | None:
    """The candidate index of ``action``, or None when it is no whole number.

    An int, a numpy int, a whole float (3.0), or an array holding one of them (0-d, or ``(1,)`` as
    SB3's ``predict`` gives for a batch of one); not 1.7 or "1" (``int()`` would play them as 1), not
    a bool or a bool array (``True`` would be played as 1), not inf or NaN, not several actions.
    """
    if isinstance(action, np.ndarray):
        if action.size != 1 or action.dtype == np.bool_:
            return None
        action = action.reshape(()).item()
    if isinstance(action, (bool, np.bool_)):
        return None
    if isinstance(action, numbers.Integral):
        return int(action)
    if isinstance(action, numbers.Real) and math.isfinite(action) and float(action).is_integer():
        return int(float(action))
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({type(value).__name__}, {len(text)} characters as repr)"
