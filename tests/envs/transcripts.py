"""Recorded transcripts that pin episode behaviour across refactors of the env's plumbing.

``tests/envs/transcripts_v0.json`` holds, for a few seeds of every env id, each step's action,
reward and end flags plus a digest of the observation and info. It was recorded before reset
started caching tasks (issue #16), so :func:`test_transcripts.test_transcripts_match_the_fixture`
shows that caching changed nothing an agent or a trainer can see.

Regenerate only when a change of behaviour is intended (and bump the env's ``-vN``)::

    .venv/bin/python -m tests.envs.transcripts
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym

import agentrl_envs  # noqa: F401 (registers the envs)
from agentrl_envs.agents import OracleAgent, RandomAgent

FIXTURE = Path(__file__).with_name("transcripts_v0.json")

#: (env id, gym.make keywords, seeds, agent): small, but every tool, candidates, faults and long
#: horizon are on some path.
CASES: tuple[tuple[str, dict[str, Any], tuple[int, ...], str], ...] = (
    ("AgentRL/SQL-v0", {"candidates": 3}, (0, 5, 42), "oracle"),
    ("AgentRL/SQL-v0", {}, (1, 9), "random"),
    ("AgentRL/Python-v0", {"candidates": 3}, (0, 5), "oracle"),
    ("AgentRL/Python-v0", {}, (2,), "random"),
    ("AgentRL/SMTP-v0", {"candidates": 3}, (0, 5, 42), "oracle"),
    ("AgentRL/SMTP-v0", {}, (3, 8), "random"),
    ("AgentRL/SQLPythonSMTP-v0", {"candidates": 3}, (0, 5), "oracle"),
    ("AgentRL/SQLPythonSMTP-v0", {"error_profile": "flaky"}, (4,), "oracle"),
    ("AgentRL/SQLPythonSMTP-v0", {"split": "heldout"}, (6,), "random"),
    ("AgentRL/SQL-v0", {"split": "test"}, (7,), "oracle"),
)
#: Keys that describe the machine rather than the episode (the sandbox tier this host reaches).
_MACHINE_KEYS = frozenset({"sandbox_tier"})


def _digest(value: Any) -> str:
    text = json.dumps(_strip(value), sort_keys=True, default=repr, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _MACHINE_KEYS}
    if isinstance(value, (list, tuple)):
        return [_strip(v) for v in value]
    return value


def record_episode(env: gym.Env[str, str], seed: int, agent_name: str) -> list[list[Any]]:
    """One episode as rows ``[action, reward, terminated, truncated, obs head, digest(obs, info)]``."""
    agent: Any = OracleAgent(env) if agent_name == "oracle" else RandomAgent(env, seed=seed)
    obs, info = env.reset(seed=seed)
    rows: list[list[Any]] = [["<reset>", 0.0, False, False, obs[:80], _digest([obs, info])]]
    done = False
    while not done:
        action = agent.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        rows.append([action[:120], float(reward), terminated, truncated, obs[:80], _digest([obs, info])])
        done = terminated or truncated
    return rows


def record_all() -> dict[str, list[list[Any]]]:
    """Every case of :data:`CASES`, keyed ``env_id|kwargs|seed|agent``."""
    out: dict[str, list[list[Any]]] = {}
    for env_id, kwargs, seeds, agent_name in CASES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make(env_id, **kwargs)
        try:
            for seed in seeds:
                out[case_key(env_id, kwargs, seed, agent_name)] = record_episode(env, seed, agent_name)
        finally:
            env.close()
    return out


def case_key(env_id: str, kwargs: dict[str, Any], seed: int, agent_name: str) -> str:
    return f"{env_id}|{json.dumps(kwargs, sort_keys=True)}|{seed}|{agent_name}"


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record_all(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}")
