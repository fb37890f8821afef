"""Checks of a run's env options against the registered envs, made before any model is built.

:class:`~agentrl_train.config.TrainConfig` checks each value on its own; these look the env up
(its Gymnasium id, its constructor's keywords, its fault profile), so a typo fails in a second,
not after a model was built or a run folder made. Each raises :class:`ConfigError` naming the
option to fix.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import load_profile
from agentrl_train.config import EnvConfig

__all__ = ["check_env_config", "check_env_id", "check_env_kwargs", "check_error_profile"]


def check_env_config(env: EnvConfig) -> None:
    """:func:`check_env_id`, :func:`check_env_kwargs` and :func:`check_error_profile` of ``--env``, ``--env-kwargs``, ``--error-profile``."""
    check_env_id(env.env)
    check_env_kwargs(env.env, env.env_kwargs)
    check_error_profile(env.error_profile)


def check_env_id(env_id: str) -> None:
    """Raise :class:`ConfigError` unless ``env_id`` is a registered Gymnasium id."""
    if env_id not in gym.registry:
        known = ", ".join(sorted(k for k in gym.registry if k.startswith("AgentRL/")))
        raise ConfigError(f"--env {env_id!r}: no such env id; use one of {known}")


def check_error_profile(profile: str) -> None:
    """Raise :class:`ConfigError` naming ``--error-profile`` when it is no fault profile."""
    try:
        load_profile(profile)
    except ConfigError as exc:  # the env's words name its keyword: error_profile='nosuch'
        text = str(exc)
        raise ConfigError(
            "--error-profile=" + text.removeprefix("error_profile=")
            if text.startswith("error_profile=")
            else f"--error-profile={profile[:200]!r}: {text}"
        ) from None


def check_env_kwargs(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` naming ``--env-kwargs`` when a key is no keyword of ``env_id``'s constructor or gym.make.

    An env whose constructor takes ``**kwargs`` accepts any key; its own checks then apply.
    """
    spec = gym.spec(env_id)
    creator: Any = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    try:
        params = inspect.signature(creator).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = (set(params) | set(inspect.signature(gym.make).parameters)) - {"id", "kwargs"}
    for key in env_kwargs:
        if key not in known:
            near = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"it takes {', '.join(sorted(known))}"
            raise ConfigError(f"--env-kwargs: {env_id} takes no keyword {key!r}; {hint}")
