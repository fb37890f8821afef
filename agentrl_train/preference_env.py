"""``AgentRL/Preference-v0``: one call on a single-call task, rewarded by a reward model.

The ``preference`` stage of :mod:`agentrl_train.stages` trains on it. Each episode is the first step of
an episode of ``base_env`` (default ``AgentRL/SQL-v0``: the policy writes the query): the observation,
tools and ``info["candidates"]`` are the base env's, the episode ends after the one action, and the
reward is the reward model's score of that action given the task's instruction (the same prompt
make-rm-data writes for a first call). ``info["success"]`` is ``score > 0``; ``info["rm_score"]`` the
score. The reward model is loaded once per process and folder.

Arguments: ``rm`` (a reward-model folder, required), ``base_env``, and everything else goes to
``gym.make(base_env, ...)`` (``split``, ``candidates``, ``error_profile``, ...).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import gymnasium as gym
import torch

from agentrl_envs.errors import ConfigError

__all__ = ["ENV_ID", "PreferenceEnv", "register"]

ENV_ID = "AgentRL/Preference-v0"


@lru_cache(maxsize=4)
def _reward_model(folder: str) -> Any:
    from agentrl_train.reward_model import load_rm

    return load_rm(folder, device="cpu", log=lambda *a, **k: None)


class PreferenceEnv(gym.Env[str, str]):
    """A one-step env: the base env's first observation, reward = RM score of the action."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (gymnasium convention)

    def __init__(self, rm: str = "", base_env: str = "AgentRL/SQL-v0", **kwargs: Any) -> None:
        if not rm:
            raise ConfigError(f"{ENV_ID} needs rm=<reward-model folder> (env_kwargs: {{rm: runs/rm}})")
        self.rm_folder = str(rm)
        _reward_model(self.rm_folder)  # fail at construction, not at the first step
        self.env = gym.make(base_env, **kwargs)
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self._instruction = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._instruction = self.env.unwrapped.task.instruction  # type: ignore[attr-defined]
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        with torch.no_grad():
            score = float(_reward_model(self.rm_folder).score([self._instruction], [str(action)])[0])
        obs, _, _, _, info = self.env.step(action)
        info = {**info, "rm_score": score, "success": score > 0}
        return obs, score, True, False, info

    def set_training_step(self, step: int) -> None:
        """Passed on to the base env (its auxiliary reward schedule; the reward here is the RM's alone)."""
        self.env.get_wrapper_attr("set_training_step")(step)

    def close(self) -> None:
        self.env.close()


def register() -> None:
    """Register :data:`ENV_ID` (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=PreferenceEnv, disable_env_checker=True, order_enforce=False)
