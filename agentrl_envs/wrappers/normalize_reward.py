"""Reward normalization wrappers: z-score over the vector batch, or scale-only by a running return std.

Both keep the raw reward in ``info["raw_reward"]`` (for vector envs an ``[N]`` array with the
``info["_raw_reward"]`` mask, Gymnasium's convention), so logs and success metrics stay in task units.
Neither changes observations, actions or episode ends.
"""

from __future__ import annotations

import numbers
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.wrappers.utils import RunningMeanStd

from agentrl_envs.errors import ConfigError

__all__ = ["MODES", "NormalizeRewardBatch", "NormalizeRewardSingleEnv"]

MODES = ("zscore", "scale")


class NormalizeRewardBatch(VectorWrapper):
    """Normalizes a vector env's rewards: per-step z-score across the batch, or scale-only.

    Modes:

    - ``"zscore"``: at every step, ``(r_i - mean(r)) / max(std(r), min_sigma)`` over the N envs of that
      step. Rows that are NEXT_STEP autoreset steps (the step after an env's episode ended) are left
      out of the statistics and get 0. With every env on the same reward, std is 0 and is clipped to
      ``min_sigma``: the rewards become 0, never NaN.
    - ``"scale"``: ``r_i / max(std(G), min_sigma)``, where G is each env's running discounted return
      (reset at episode ends) and std(G) a running estimate over all envs and steps, as in
      Gymnasium's ``NormalizeReward``. No mean is subtracted, so the sign of every reward is kept.

    Why the mean shift matters: an episode of L steps sees its return shifted by about
    ``-L * mean / std``. In a multi-step episode that is a per-step bonus or penalty the task never
    asked for. When the batch mean is negative (format and fault penalties dominate, as early in
    training), every step earns a positive constant: a living bonus that pays the agent to stall
    until the step limit instead of calling ``finish``. When the mean is positive (dense auxiliary
    rewards), every step costs a constant: a living penalty that pays it to finish early, solved or
    not. Either way the optimal policy changes, because here the agent controls episode length.
    Scaling alone multiplies every return by one positive number and leaves the optimal policy
    unchanged.

    Prefer ``"scale"`` for these envs (variable-length episodes that the agent ends with ``finish``),
    and whenever the trainer already normalizes advantages. Early in a run the running std comes from
    few, often similar returns and can be tiny, which multiplies early rewards by hundreds (as in
    Gymnasium's wrapper): in ``"scale"`` mode pass a ``min_sigma`` near the reward scale (0.1). ``"zscore"`` fits one-step settings
    (bandits, scoring ``info["candidates"]`` per state) or fixed-length episodes, where the shift is
    the same for every policy. It needs at least 2 envs: over a batch of one it would zero every reward.

    Args:
        env: the vector env.
        min_sigma: lower clip of the standard deviation (> 0).
        mode: ``"zscore"`` or ``"scale"``.
        gamma: discount of the running return (``"scale"`` only).
    """

    def __init__(self, env: VectorEnv[Any, Any, Any], min_sigma: float = 1e-8, mode: str = "zscore", gamma: float = 0.99) -> None:
        super().__init__(env)
        _check(mode, min_sigma, gamma)
        if mode == "zscore" and self.num_envs < 2:
            raise ConfigError("mode='zscore' needs at least 2 envs (over one env it makes every reward 0); use mode='scale'")
        self.mode = mode
        self.min_sigma = float(min_sigma)
        self.gamma = float(gamma)
        self.return_rms = RunningMeanStd(shape=())
        self.returns = np.zeros(self.num_envs)
        self._autoreset_mode = self.env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self._prev_done = np.zeros(self.num_envs, dtype=bool)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.returns[:] = 0.0
        self._prev_done[:] = False
        return super().reset(seed=seed, options=options)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        raw = np.asarray(rewards, dtype=np.float64)
        if self._autoreset_mode == AutoresetMode.SAME_STEP:
            live = np.ones(self.num_envs, dtype=bool)
        else:
            live = ~self._prev_done
        done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        out = np.zeros_like(raw)
        if self.mode == "zscore":
            if live.any():
                batch = raw[live]
                sigma = max(float(batch.std()), self.min_sigma)
                # A constant batch gives exact zeros (mean() can be off by an ulp, which /min_sigma would amplify).
                out[live] = 0.0 if batch.min() == batch.max() else (batch - batch.mean()) / sigma
        else:
            self.returns[live] = self.returns[live] * self.gamma + raw[live]
            if live.any():
                self.return_rms.update(self.returns[live])
            out = raw / self.sigma
            out[~live] = 0.0
            self.returns[done] = 0.0
        self._prev_done = done
        info = dict(info)
        info["raw_reward"] = raw
        info["_raw_reward"] = np.ones(self.num_envs, dtype=bool)
        return obs, out, terminated, truncated, info

    @property
    def sigma(self) -> float:
        """The scale ``"scale"`` mode divides by: the running return std, clipped below at ``min_sigma``."""
        return max(float(np.sqrt(self.return_rms.var)), self.min_sigma)


class NormalizeRewardSingleEnv(gym.Wrapper[Any, Any, Any, Any]):
    """Single-env counterpart of :class:`NormalizeRewardBatch`, with running statistics over steps.

    Not Gymnasium's ``NormalizeReward``: it keeps the raw reward, clips sigma and has a z-score mode.

    ``"scale"``: ``r / max(std(G), min_sigma)`` with G the running discounted return (reset at episode
    ends). ``"zscore"``: ``(r - mean) / max(std, min_sigma)`` with the running mean and std of step
    rewards; the mean shift is a living bonus or penalty in multi-step episodes (see
    :class:`NormalizeRewardBatch`), so prefer ``"scale"`` here. The raw reward is in
    ``info["raw_reward"]``.

    Args:
        env: the env to wrap.
        min_sigma: lower clip of the standard deviation (> 0).
        mode: ``"scale"`` (default) or ``"zscore"``.
        gamma: discount of the running return (``"scale"`` only).
    """

    def __init__(self, env: gym.Env[Any, Any], min_sigma: float = 1e-8, mode: str = "scale", gamma: float = 0.99) -> None:
        super().__init__(env)
        _check(mode, min_sigma, gamma)
        self.mode = mode
        self.min_sigma = float(min_sigma)
        self.gamma = float(gamma)
        self.rms = RunningMeanStd(shape=())
        self.ret = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.ret = 0.0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        raw = float(reward)
        if self.mode == "scale":
            self.ret = self.ret * self.gamma + raw
            self.rms.update(np.array([self.ret]))
            out = raw / max(float(np.sqrt(self.rms.var)), self.min_sigma)
        else:
            self.rms.update(np.array([raw]))
            out = (raw - float(self.rms.mean)) / max(float(np.sqrt(self.rms.var)), self.min_sigma)
        if terminated or truncated:
            self.ret = 0.0
        info = dict(info)
        info["raw_reward"] = raw
        return obs, out, terminated, truncated, info


def _check(mode: str, min_sigma: float, gamma: float) -> None:
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r}: use 'zscore' (per-step batch z-score) or 'scale' (divide by the return std)")
    if (
        not isinstance(min_sigma, numbers.Real)
        or isinstance(min_sigma, bool)
        or not float(min_sigma) > 0
        or not np.isfinite(min_sigma)
    ):
        raise ConfigError(f"min_sigma={min_sigma!r}: use a small positive number such as 1e-8")
    if not isinstance(gamma, numbers.Real) or isinstance(gamma, bool) or not 0.0 <= float(gamma) <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: use a discount in [0, 1]")
