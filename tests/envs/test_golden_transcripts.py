"""Golden transcripts of the v0 envs, recorded before the tool registry refactor (issue #15).

The oracle and a fixed-seed random agent play a few seeds of every v0 env, with and without a
fault profile and with candidates on; the observations, rewards, candidates and the info keys
that matter must match the committed fixture exactly. A refactor that changes what an agent sees
or is paid fails here. Regenerate the fixture only for a deliberate behaviour change (and bump the
env's version): ``.venv/bin/python -m tests.envs.test_golden_transcripts``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the ids
from agentrl_envs.agents import OracleAgent, RandomAgent

FIXTURE = Path(__file__).with_name("golden_transcripts.json")
V0_IDS = ("AgentRL/SQL-v0", "AgentRL/Python-v0", "AgentRL/SMTP-v0", "AgentRL/SQLPythonSMTP-v0")
SEEDS = (0, 1)
PROFILES = ("none", "flaky")
AGENTS = ("oracle", "random")
# Info keys compared at every step (sandbox_tier is left out: it depends on the machine's kernel).
STEP_KEYS = (
    "task_id",
    "domain",
    "split",
    "step",
    "tool",
    "tool_result",
    "fault",
    "virtual_time_s",
    "subtask_index",
    "subtask_boundary",
    "call_format",
    "reward_components",
    "candidates",
    "success",
    "task_components",
    "partial_credit",
    "fault_stats",
)
MAX_STEPS = 12  # bounds the random agent's episodes


def _digest(value: Any) -> Any:
    """Long strings become a prefix plus a hash, so the fixture stays small and diffs stay readable."""
    if isinstance(value, str) and len(value) > 160:
        return f"{value[:80]}...#{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"
    if isinstance(value, dict):
        return {str(k): _digest(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_digest(v) for v in value]
    if isinstance(value, float):
        return round(value, 9)
    return value


def make(env_id: str, profile: str) -> gym.Env[str, str]:
    return gym.make(env_id, error_profile=profile, candidates=3, max_steps=MAX_STEPS)


def play(env: gym.Env[str, str], seed: int, agent_name: str) -> dict[str, Any]:
    """One episode's record: reset observation and tool schemas, then every step."""
    agent = OracleAgent(env) if agent_name == "oracle" else RandomAgent(env, seed=seed)
    obs, info = env.reset(seed=seed)
    reset = {"obs": obs, "tools": info["tools"], "max_steps": info["max_steps"], "candidates": info.get("candidates")}
    record: dict[str, Any] = {"reset": _digest(reset), "steps": []}
    done = False
    while not done:
        action = agent.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        kept = {k: info[k] for k in STEP_KEYS if k in info}
        step = {"action": action, "obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated, "info": kept}
        record["steps"].append(_digest(step))
    return record


def play_all(env_id: str, profile: str) -> dict[str, Any]:
    """Every agent and seed on one env (reset with a seed starts afresh, so one env serves them all)."""
    env = make(env_id, profile)
    try:
        return {f"{env_id}|{profile}|{a}|{s}": play(env, s, a) for a in AGENTS for s in SEEDS}
    finally:
        env.close()


def _load() -> dict[str, Any]:
    return dict(json.loads(FIXTURE.read_text(encoding="utf-8")))


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("env_id", V0_IDS)
def test_transcripts_match_golden(env_id: str, profile: str) -> None:
    golden = _load()
    # A JSON round trip, so tuples and lists compare alike.
    got = json.loads(json.dumps(play_all(env_id, profile)))
    for key, record in got.items():
        assert key in golden, f"no golden transcript for {key}; regenerate the fixture (see the module docstring)"
        want = golden[key]
        assert record["reset"] == want["reset"], key
        assert len(record["steps"]) == len(want["steps"]), key
        for i, (g, w) in enumerate(zip(record["steps"], want["steps"], strict=True)):
            assert g == w, f"{key}: step {i + 1} differs"


def test_fixture_covers_oracle_successes_and_faults() -> None:
    """The fixture is only a guard if it holds solved episodes and injected faults."""
    golden = _load()
    assert len(golden) == len(V0_IDS) * len(PROFILES) * len(AGENTS) * len(SEEDS)
    solved = [k for k, r in golden.items() if "|oracle|" in k and r["steps"][-1]["info"].get("success")]
    faulted = [k for k, r in golden.items() if any(s["info"]["fault"].get("origin") == "injected" for s in r["steps"])]
    assert len(solved) >= len(V0_IDS) * len(SEEDS)
    assert faulted


if __name__ == "__main__":
    records = {k: v for e in V0_IDS for p in PROFILES for k, v in play_all(e, p).items()}
    FIXTURE.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}")
