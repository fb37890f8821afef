"""info["tools"] tells the agent what the services offer (numpy in the Python sandbox)."""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import pytest

from agentrl_envs.core.actions import parse_action
from agentrl_envs.errors import ActionError
from agentrl_envs.tools import TOOLS


def python_description(info: dict) -> str:  # type: ignore[type-arg]
    (entry,) = [t for t in info["tools"] if t["function"]["name"] == "python"]
    return str(entry["function"]["description"])


def test_sandbox_with_numpy_says_so() -> None:
    env = gym.make("AgentRL/Python-v0")
    _, info = env.reset(seed=0)
    runner = env.unwrapped._backend.app.runner  # type: ignore[attr-defined]
    assert runner.numpy_available, "numpy is installed with the package; the sandbox should offer it"
    assert "numpy" in python_description(info)
    _, _, _, _, info = env.step('{"name": "python", "arguments": {"code": "import numpy; print(numpy.median([1, 2, 9]))"}}')
    assert info["tool_result"]["ok"] and info["tool_result"]["stdout"].strip() == "2.0"
    env.close()


def test_plain_runner_without_numpy_says_standard_library_only() -> None:
    # The plain runner starts `python -I -S`, which cannot import site-packages.
    env = gym.make("AgentRL/Python-v0", python_sandbox=False)
    _, info = env.reset(seed=0)
    assert "standard library only" in python_description(info) and "numpy" not in python_description(info)
    _, _, _, _, info = env.step('{"name": "python", "arguments": {"code": "import numpy"}}')
    assert not info["tool_result"]["ok"] and "ModuleNotFoundError" in info["tool_result"]["stderr"]
    env.close()


def test_default_schema_is_unchanged_without_facts() -> None:
    for tool in TOOLS.values():
        assert tool.schema()["function"]["description"] == tool.description
        assert tool.schema({})["function"] == tool.schema(None)["function"]
    assert TOOLS["python"].schema({"numpy": True}) != TOOLS["python"].schema()


def test_editing_info_tools_changes_no_other_env_nor_the_argument_checks() -> None:
    kept = {name: copy.deepcopy(tool.parameters) for name, tool in TOOLS.items()}
    env = gym.make("AgentRL/SQLPythonSMTP-v1", python_sandbox=False)
    fresh = gym.make("AgentRL/SQLPythonSMTP-v1", python_sandbox=False)
    try:
        _, info = env.reset(seed=0)
        before = json.dumps(info["tools"])
        for entry in info["tools"]:
            parameters = entry["function"]["parameters"]
            parameters["properties"].clear()
            parameters["required"].append("nothing")
            parameters["type"] = "array"
        _, info = fresh.reset(seed=0)
        assert json.dumps(info["tools"]) == before
        assert {name: tool.parameters for name, tool in TOOLS.items()} == kept
        assert parse_action('{"name": "sql", "arguments": {"query": "SELECT 1"}}').arguments == {"query": "SELECT 1"}
        with pytest.raises(ActionError, match="query"):
            parse_action('{"name": "sql", "arguments": {}}')
        _, _, _, _, info = fresh.step('{"name": "sql", "arguments": {"query": "SELECT 1"}}')
        assert info["tool_result"]["ok"], info["tool_result"]
    finally:
        env.close()
        fresh.close()
        for name, tool in TOOLS.items():  # undo what the old code let the edit reach, for the tests after this one
            tool.parameters.clear()
            tool.parameters.update(kept[name])
