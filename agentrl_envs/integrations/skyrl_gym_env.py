"""SkyRL-Gym: every agentrl id as a ``BaseTextEnv`` in ``skyrl_gym``'s registry.

::

    import skyrl_gym
    import agentrl_envs.integrations.skyrl_gym_env  # registers AgentRL/SQL-v0, ... with skyrl_gym

    env = skyrl_gym.make("AgentRL/SQL-v0", env_config={"error_profile": "flaky"}, extras={"seed": 0})
    chat, metadata = env.init([])  # [system prompt with the tools, the task's instruction]
    out = env.step('<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"}}</tool_call>')
    out["observations"], out["reward"], out["done"], out["metadata"]

SkyRL's generator builds one env per sample as ``skyrl_gym.make(env_class, env_config=...,
extras=...)``: ``env_config`` is the env class's section of the trainer config and ``extras`` the
dataset row's ``env_extras``. Here both hold ``gym.make`` keyword arguments (``split``,
``error_profile``, ``backend``, ``max_steps``, ...; a row's value wins over the config's), and
``extras["seed"]`` is the episode's seed: the same seed gives the same task, observations and
rewards as ``gym.make``. Keys SkyRL itself puts in a row (``reward_spec``, ``data``) are ignored: the
env grades its own episodes. Ray workers must import this module (or name it in the entry point) so
the ids are registered in their process.

Each ``step`` takes the model's whole reply as text (the env parses the ``<tool_call>``; text that
is no call gets the env's format penalty and an error that says what to write) and returns the
observation as a ``user`` message, none once the episode is over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

import agentrl_envs
from agentrl_envs.errors import ConfigError

__all__ = ["AgentRLTextEnv", "register_skyrl_gym_envs"]

#: Keys of a SkyRL dataset row's ``env_extras`` that are SkyRL's, not ``gym.make``'s.
SKYRL_ROW_KEYS = frozenset({"seed", "reward_spec", "data", "max_turns", "uid"})


class AgentRLTextEnv(BaseTextEnv):
    """One agentrl episode behind SkyRL's text-in, messages-out interface.

    Args:
        env_id: a registered agentrl id (the registry fills it in for ``skyrl_gym.make``).
        env_config: ``gym.make`` keyword arguments shared by every sample (a dict or an OmegaConf config).
        extras: the sample's ``env_extras``: ``seed`` and more ``gym.make`` keyword arguments.

    Raises:
        ConfigError: unknown ``env_id``, a bad keyword argument or a seed that is not an int >= 0.
    """

    def __init__(self, env_id: str, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if env_id not in agentrl_envs.ENV_IDS:
            raise ConfigError(f"unknown environment {str(env_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
        row = dict(extras or {})
        seed = row.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ConfigError(f"extras['seed']={seed!r:.80}: use an int >= 0, one per dataset row")
        self.agentrl_id = env_id
        self.seed: int | None = seed
        self.make_kwargs = {**dict(env_config or {}), **{k: v for k, v in row.items() if k not in SKYRL_ROW_KEYS}}
        self.env: gym.Env[str, str] = gym.make(env_id, **self.make_kwargs)
        self.episode_return = 0.0
        self.info: dict[str, Any] = {}

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode; the dataset's prompt is replaced by the env's system prompt and instruction."""
        observation, self.info = self.env.reset(seed=self.seed)
        self.turns, self.max_turns, self.episode_return = 0, int(self.info["max_steps"]), 0.0
        chat = [{"role": "system", "content": self.info["system_prompt"]}, {"role": "user", "content": observation}]
        return chat, {"task_id": self.info["task_id"], "seed": self.seed, "tools": self.info["tools"]}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        observation, reward, terminated, truncated, self.info = self.env.step(action)
        self.turns += 1
        self.episode_return += float(reward)
        done = bool(terminated or truncated)
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": observation}],
            reward=float(reward),
            done=done,
            metadata={
                "observation": observation,
                "reward_components": dict(self.info["reward_components"]),
                "success": self.info.get("success"),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
            },
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        """The episode's return, success and length (SkyRL averages them over episodes)."""
        return {"return": self.episode_return, "success": float(bool(self.info.get("success"))), "steps": self.turns}

    def close(self) -> None:
        self.env.close()


def register_skyrl_gym_envs() -> list[str]:
    """Register every agentrl id with ``skyrl_gym`` (idempotent); returns the ids."""
    for env_id in agentrl_envs.ENV_IDS:
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=f"{__name__}:AgentRLTextEnv", kwargs={"env_id": env_id})
    return list(agentrl_envs.ENV_IDS)


register_skyrl_gym_envs()
