"""GEM (``gem-llm``): every agentrl id as a ``gem.core.Env`` in GEM's registry.

::

    import gem
    import agentrl_envs.integrations.gem_env  # registers AgentRL/SQL-v0, ... with gem

    env = gem.make("AgentRL/SQL-v0", error_profile="flaky")
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step('<tool_call>{"name": ...}</tool_call>')

GEM's step contract is Gymnasium's (a text action in; observation, reward, terminated, truncated,
info out), so :class:`AgentRLGemEnv` hands each call to the env of ``gym.make(env_id, **kwargs)``
unchanged: the same seed gives the same task, the same observations and the same rewards as
``gym.make``, and faults, the virtual clock and backends come from the same keyword arguments. The
system prompt with the tool schemas is ``info["system_prompt"]`` of ``reset``, as in the env.

GEM's ``reset`` seeds Python's and numpy's global generators; this env does not (every random
choice flows from the env's own seeded generator), so a GEM run that seeds one env leaves the
others alone. ``gem.make_vec`` passes ``seed`` to the constructor: it is the seed of the first
``reset()`` that names none.
"""

from __future__ import annotations

from typing import Any

import gem
import gymnasium as gym
from gem.envs.registration import ENV_REGISTRY

import agentrl_envs
from agentrl_envs.agents import RandomAgent
from agentrl_envs.errors import ConfigError

__all__ = ["AgentRLGemEnv", "register_gem_envs"]


class AgentRLGemEnv(gem.Env):
    """One agentrl env behind GEM's ``Env`` interface.

    Args:
        agentrl_id: a registered agentrl id (the registry fills it in for ``gem.make``; not ``env_id``,
            which is the name of ``gem.register``'s own first argument and the attribute ``gem.make`` sets).
        seed: the seed of the first ``reset()`` called without one (``gem.make_vec`` sets it).
        **make_kwargs: passed to ``gym.make`` (``split``, ``error_profile``, ``backend``, ...).

    Raises:
        ConfigError: unknown ``env_id`` or keyword argument (from ``gym.make``).
    """

    def __init__(self, agentrl_id: str, seed: int | None = None, **make_kwargs: Any) -> None:
        super().__init__()
        if agentrl_id not in agentrl_envs.ENV_IDS:
            raise ConfigError(f"unknown environment {str(agentrl_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
        self.agentrl_id = agentrl_id
        self.make_kwargs = dict(make_kwargs)
        self.env: gym.Env[str, str] = gym.make(agentrl_id, **make_kwargs)
        self._first_seed = seed
        self._info: dict[str, Any] = {}
        self._random = RandomAgent(self.env, seed)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if seed is None:
            seed, self._first_seed = self._first_seed, None
        observation, self._info = self.env.reset(seed=seed)
        return observation, self._info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._info = info
        return observation, float(reward), bool(terminated), bool(truncated), info

    def sample_random_action(self) -> str:
        """A random well-formed call (the env's :class:`~agentrl_envs.agents.RandomAgent`)."""
        return self._random.act("", self._info)

    def spawn(self, same_state: bool = False, **kwargs: Any) -> AgentRLGemEnv:
        """A fresh env with this one's arguments, ``kwargs`` overriding them.

        Raises:
            NotImplementedError: ``same_state=True``: an episode's simulator state cannot be copied;
                replay its actions on a fresh env with the same seed instead.
        """
        if same_state:
            raise NotImplementedError("same_state=True: reset a spawned env with the episode's seed and replay its actions")
        return AgentRLGemEnv(self.agentrl_id, **{**self.make_kwargs, **kwargs})

    def close(self) -> None:
        self.env.close()


def register_gem_envs() -> list[str]:
    """Register every agentrl id with GEM (idempotent); returns the ids."""
    for env_id in agentrl_envs.ENV_IDS:
        if env_id not in ENV_REGISTRY:
            gem.register(env_id, f"{__name__}:AgentRLGemEnv", agentrl_id=env_id)
    return list(agentrl_envs.ENV_IDS)


register_gem_envs()
