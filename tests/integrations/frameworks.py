"""Helpers for the verifiers, SkyRL-Gym and GEM tests: import the library or skip, and step a gym.make twin."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import gymnasium as gym
import pytest

from ..conftest import require_integration

HOSTILE_ACTIONS = {
    "garbage": "<tool_call>{not json at all</tool_call>",
    "unknown_tool": '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
    "huge": '<tool_call>{"name": "sql", "arguments": {"query": "' + "x" * 250_000 + '"}}</tool_call>',
    "no_call": "I think the answer is 42.",
}


def import_or_skip(module: str, extra: str) -> ModuleType:
    """``module``, or a skip that names the extra to install; a failure under AGENTRL_REQUIRE_INTEGRATION=1."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if require_integration():
            pytest.fail(f"{module} is required under AGENTRL_REQUIRE_INTEGRATION=1: pip install -e '.[{extra}]' ({exc})")
        pytest.skip(f"{module} is not installed: pip install -e '.[{extra}]'")


def gym_twin(env_id: str, seed: int, **make_kwargs: Any) -> tuple[gym.Env[str, str], str, dict[str, Any]]:
    """``gym.make(env_id, **make_kwargs)`` reset with ``seed``: the env, its instruction and info."""
    env = gym.make(env_id, **make_kwargs)
    observation, info = env.reset(seed=seed)
    return env, observation, info


def replay(env_id: str, seed: int, actions: list[str], **make_kwargs: Any) -> dict[str, Any]:
    """The episode's return, summed reward components, success and observations when ``actions`` are played."""
    env, _, _ = gym_twin(env_id, seed, **make_kwargs)
    out: dict[str, Any] = {"return": 0.0, "components": {}, "success": False, "observations": [], "faults": 0}
    try:
        for action in actions:
            observation, reward, terminated, truncated, info = env.step(action)
            out["return"] += float(reward)
            for name, value in info["reward_components"].items():
                out["components"][name] = out["components"].get(name, 0.0) + float(value)
            out["success"] = bool(info.get("success", out["success"]))
            out["observations"].append(observation)
            out["faults"] += bool(info.get("fault"))
            if terminated or truncated:
                break
    finally:
        env.close()
    return out
