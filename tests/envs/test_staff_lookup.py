"""The v1 gold plan looks an email's recipients up in the ``staff`` table before sending it.

v0's oracle emailed addresses that no earlier turn showed, so a model trained on its transcripts
could not learn where they come from (SFT on them: recipients right in 0 of 32 test episodes). v1's
oracle queries ``staff`` first; the lookup is the oracle's, not a component, and v0 stays registered
as it was (its golden transcripts are ``tests/envs/test_golden_transcripts.py``).
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs
from agentrl_envs.core.actions import parse_action
from agentrl_envs.core.progress import Progress
from agentrl_envs.tasks.domains.base import Staff
from agentrl_envs.tasks.template_base import staff_lookup_sql

ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def _call(action: str) -> tuple[str, dict[str, Any]]:
    call = parse_action(action)
    return call.name, call.arguments


def _oracle_episode(env_id: str, seed: int, **kwargs: Any) -> tuple[list[tuple[str, dict[str, Any], str, float, dict]], dict]:
    """[(tool, arguments, observation, reward, info)] of one oracle episode, and the reset info."""
    env = gym.make(env_id, **kwargs)
    try:
        obs, first = env.reset(seed=seed)
        steps = []
        done = False
        while not done:
            action = env.unwrapped.oracle_action()
            name, arguments = _call(action)
            obs, reward, terminated, truncated, info = env.step(action)
            steps.append((name, arguments, obs, reward, info))
            done = terminated or truncated
        return steps, first
    finally:
        env.close()


def _unseen_addresses(steps: list[tuple[str, dict[str, Any], str, float, dict]], instruction: str) -> list[str]:
    """Addresses the oracle emails that neither the instruction nor an earlier observation showed."""
    seen = instruction
    unseen = []
    for name, arguments, obs, _, _ in steps:
        if name == "smtp":
            unseen += [a for a in (*arguments["to"], *arguments.get("cc", [])) if a not in seen]
        seen += "\n" + obs
    return unseen


@pytest.mark.parametrize("split", ["train", "test", "heldout"])
def test_v1_oracle_emails_only_addresses_it_has_seen_and_succeeds(split: str) -> None:
    for seed in range(5):
        steps, first = _oracle_episode("AgentRL/SQLPythonSMTP-v1", seed, split=split)
        names = [s[0] for s in steps]
        assert names == ["sql", "python", "sql", "smtp", "finish"], names
        lookup = steps[2][1]["query"]
        assert lookup.startswith("SELECT name, email, role, unit FROM staff WHERE "), lookup
        assert _unseen_addresses(steps, first["instruction"]) == []
        assert steps[-1][4]["success"] is True


def test_v0_oracle_emails_addresses_no_turn_showed() -> None:
    """The defect v1 mends, kept in v0: without the lookup the addresses come from nowhere."""
    steps, first = _oracle_episode("AgentRL/SQLPythonSMTP-v0", 0, split="test")
    assert [s[0] for s in steps] == ["sql", "python", "smtp", "finish"]
    assert _unseen_addresses(steps, first["instruction"]), "v0's oracle should email addresses it never looked up"
    assert steps[-1][4]["success"] is True


def test_the_lookup_is_no_component_and_earns_nothing() -> None:
    steps, _ = _oracle_episode("AgentRL/SQLPythonSMTP-v1", 3, split="train")
    name, _, obs, reward, info = steps[2]
    assert name == "sql" and "email" in obs
    assert info["reward_components"]["aux"] == 0.0 and reward == 0.0
    total = sum(s[3] for s in steps)
    v0_total = sum(s[3] for s in _oracle_episode("AgentRL/SQLPythonSMTP-v0", 3, split="train")[0])
    assert total == pytest.approx(v0_total)  # same components, same rewards: only the plan has a step more


def test_long_horizon_and_workplace_oracles_look_up_and_succeed() -> None:
    for env_id, kwargs in (("AgentRL/SQLPythonSMTP-v1", {"long_horizon": True}), ("AgentRL/Workplace-v1", {})):
        for seed in range(3):
            steps, first = _oracle_episode(env_id, seed, split="test", **kwargs)
            assert _unseen_addresses(steps, first["instruction"]) == [], (env_id, seed)
            assert steps[-1][4]["success"] is True
            emails = sum(s[0] == "smtp" for s in steps)
            lookups = sum(s[0] == "sql" and "FROM staff" in s[1]["query"] for s in steps)
            assert 1 <= lookups <= emails  # one per email, less where an earlier lookup showed the addresses


def test_a_result_that_already_showed_the_addresses_skips_the_lookup() -> None:
    """An agent that read the whole staff table first gets no lookup from the oracle after it."""
    env = gym.make("AgentRL/SQLPythonSMTP-v1", split="test")
    try:
        env.reset(seed=1)
        env.step('<tool_call>{"name": "sql", "arguments": {"query": "SELECT * FROM staff"}}</tool_call>')
        names = []
        done = False
        while not done:
            action = env.unwrapped.oracle_action()
            names.append(_call(action)[0])
            _, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        assert names == ["sql", "python", "smtp", "finish"], names
        assert info["success"] is True
    finally:
        env.close()


def test_default_max_steps_counts_the_lookup() -> None:
    expected = {
        ("AgentRL/SQLPythonSMTP-v1", False): 19,
        ("AgentRL/SQLPythonSMTP-v0", False): 16,
        ("AgentRL/SQLPythonSMTP-v1", True): 67,
        ("AgentRL/SQLPythonSMTP-v0", True): 52,
    }
    for (env_id, long_horizon), steps in expected.items():
        env = gym.make(env_id, long_horizon=long_horizon)
        _, info = env.reset(seed=0)
        assert info["max_steps"] == steps, (env_id, long_horizon)
        env.close()
    for env_id, steps in (("AgentRL/Workplace-v1", 37), ("AgentRL/Workplace-v0", 31)):
        env = gym.make(env_id)
        assert env.reset(seed=0)[1]["max_steps"] == steps
        env.close()


@pytest.mark.parametrize("difficulty", ["easy", "hard"])
def test_candidates_at_the_lookup_step_hold_the_oracle_and_other_queries(difficulty: str) -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1", candidates=4, candidates_difficulty=difficulty)
    try:
        _, info = env.reset(seed=2)
        for _ in range(2):
            _, _, _, _, info = env.step(env.unwrapped.oracle_action())
        oracle = env.unwrapped.oracle_action()
        assert "FROM staff" in oracle
        assert oracle in info["candidates"] and len(set(info["candidates"])) == 4
    finally:
        env.close()


def test_the_lookup_query_names_people_as_the_instruction_does() -> None:
    manager = Staff(name="A B", email="a.b@x.example", role="manager", unit="north")
    director = Staff(name="C D", email="c.d@x.example", role="director", unit="all")
    analysts = [Staff(name=f"E{i}", email=f"e{i}@x.example", role="analyst", unit=u) for i, u in enumerate("ab")]
    assert staff_lookup_sql([manager]) == (
        "SELECT name, email, role, unit FROM staff WHERE (role = 'manager' AND unit = 'north') ORDER BY staff_id"
    )
    assert "WHERE role = 'director' OR (role = 'manager' AND unit = 'north')" in staff_lookup_sql([director, manager])
    assert "WHERE role = 'analyst' ORDER BY" in staff_lookup_sql(analysts)  # all analysts: one term, once
    assert "unit = 'o''brien'" in staff_lookup_sql([Staff("n", "n@x.example", "manager", "o'brien")])  # quoted


def test_progress_without_lookups_is_v0s_plan() -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1")
    try:
        env.reset(seed=0)
        task = env.unwrapped.task
    finally:
        env.close()
    assert task.subtasks[0].lookup_sql is not None
    assert Progress(task).next_gold_call()[0] == "sql"
    assert Progress(task).lookups is False and Progress(task, lookups=True).lookups is True


def test_earlier_ids_are_registered_apart_from_the_current_ones() -> None:
    assert set(agentrl_envs.EARLIER_IDS) == {"AgentRL/SQLPythonSMTP-v0", "AgentRL/Workplace-v0"}
    assert {"AgentRL/SQLPythonSMTP-v1", "AgentRL/Workplace-v1"} <= set(agentrl_envs.ENV_IDS)
    for env_id in agentrl_envs.EARLIER_IDS:
        assert gym.spec(env_id) is not None
        assert f"``{env_id}``" in type(gym.make(env_id).unwrapped).__doc__.split("\n", 1)[0]


def test_the_cli_and_the_integrations_take_the_earlier_ids(capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl_envs.cli.main import main
    from agentrl_envs.integrations.trl import environment_factory

    assert main(["eval", "AgentRL/SQLPythonSMTP-v0", "--episodes", "2", "--json", "--no-progress"]) == 0
    assert '"success_rate": 1.0' in capsys.readouterr().out
    assert environment_factory("AgentRL/Workplace-v0") is not None
    with pytest.raises(agentrl_envs.ConfigError, match="unknown environment 'AgentRL/SQLPythonSMTP-v9'"):
        environment_factory("AgentRL/SQLPythonSMTP-v9")
