"""``agentrl-envs openenv``'s tools through OpenEnv's own MCP client (``MCPToolClient``).

Over ``/ws`` (``ListToolsAction`` / ``CallToolAction`` steps) each session's reset picks the id and
the fault profile: the tools are listed with the env's schemas, and the oracle's calls solve every
registered id with and without faults, each call's observation and reward equal to ``gym.make``'s
on the same seed. Over HTTP ``/mcp`` (the client's production mode) a session plays the server's
own id and profile from its ``--seed``. Hostile calls get tool errors and the server keeps answering.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import httpx
import pytest

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import parse_action
from agentrl_envs.testing import start_cli_server, stop_process

from .conftest import require, run_example

require("openenv.core.mcp_client")

from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ToolErrorType  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402


def _schemas(env: gym.Env[Any, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The env's tools as (name, description, JSON schema of the arguments)."""
    core: Any = env.unwrapped
    functions = [tool.schema()["function"] for tool in core.tools.values()]
    return [(f["name"], f["description"], f["parameters"]) for f in functions]


def _listed(remote: Any) -> list[tuple[str, str, dict[str, Any]]]:
    return [(t.name, t.description, t.input_schema) for t in remote.list_tools(use_cache=False)]


def _play(remote: Any, env_id: str, seed: int, profile: str) -> None:
    """The oracle's episode as MCP tool calls in lockstep with gym.make: same tools, observations, rewards; solved."""
    local = gym.make(env_id, error_profile=profile)
    try:
        reset = remote.reset(seed=seed, env_id=env_id, error_profile=profile)
        observation, info = local.reset(seed=seed)
        core: Any = local.unwrapped
        assert [t.name for t in reset.observation.tools] == list(core.tools)  # MCPToolClient reads a reset's tools
        assert _listed(remote) == _schemas(local)
        oracle, done, remote_rewards, rewards = OracleAgent(local), False, [], []
        while not done:
            action = oracle.act(observation, info)
            call = parse_action(action, core.tools)
            observation, reward, terminated, truncated, info = local.step(action)
            done = terminated or truncated
            result = remote.step(CallToolAction(tool_name=call.name, arguments=call.arguments))
            answer: CallToolObservation = result.observation
            step = answer.result["structured_content"]
            assert answer.result["content"][0]["text"] == step["observation"] == observation
            assert (step["done"], step["terminated"], result.done, result.reward) == (done, terminated, done, step["reward"])
            ok = info["tool_result"]["ok"]
            assert answer.result["is_error"] == (not ok)
            assert answer.error is None if ok else answer.error.message == observation  # type: ignore[union-attr]
            remote_rewards.append(result.reward)
            rewards.append(float(reward))
        assert remote_rewards == rewards and info["success"] and step["info"]["success"], (env_id, seed, profile)
        assert remote.state().step_count == len(rewards)
    finally:
        local.close()


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_mcp_tool_client_lists_the_tools_and_solves_every_id(openenv_url: str, profile: str) -> None:
    with MCPToolClient(base_url=openenv_url).sync() as remote:
        for env_id in agentrl_envs.ENV_IDS:
            _play(remote, env_id, 0 if profile == "none" else 1, profile)


def test_tools_before_a_reset_are_the_server_ids_and_a_first_call_starts_an_episode(openenv_url: str) -> None:
    with MCPToolClient(base_url=openenv_url).sync() as remote:
        assert _listed(remote) == _schemas(gym.make("AgentRL/SQL-v0"))
        first = remote.call_tool("sql", query="SELECT 1")  # a call before any reset: an episode with a fresh seed
        assert first["info"]["step"] == 1 and first["observation"].startswith("sql ok")
        assert remote.state().step_count == 1


def test_hostile_calls_get_tool_errors_and_the_server_keeps_answering(openenv_url: str) -> None:
    with MCPToolClient(base_url=openenv_url).sync() as remote, MCPToolClient(base_url=openenv_url).sync() as other:
        other.reset(seed=3)
        remote.reset(seed=0)
        unknown = remote.step(CallToolAction(tool_name="no_such_tool", arguments={"x": 1})).observation
        assert unknown.error.error_type == ToolErrorType.TOOL_NOT_FOUND and "no_such_tool" in unknown.error.message
        nameless = remote.step(CallToolAction(tool_name="", arguments={})).observation
        assert nameless.error.error_type == ToolErrorType.TOOL_NOT_FOUND
        wrong = remote.step(CallToolAction(tool_name="sql", arguments={"query": 12}))
        assert wrong.reward == pytest.approx(-0.1) and "bad_arguments" in wrong.observation.error.message
        refusals = {
            "bad_arguments": lambda: remote.call_tool("sql"),  # no arguments
            "not_an_object|bad_arguments": lambda: remote.call_tool("sql", query=None, extra=[1] * 10),
            "too_long": lambda: remote.call_tool("sql", query="x" * 1_000_000),  # 1 MB
            "Unknown tool": lambda: remote.call_tool("reset"),  # reserved by OpenEnv: not a tool
        }
        for message, call in refusals.items():
            with pytest.raises(RuntimeError, match=message):
                call()
        with pytest.raises(RuntimeError, match="Invalid message"):  # arguments that are not an object
            remote.step(CallToolAction.model_construct(tool_name="sql", arguments="SELECT 1"))
        _play(remote, "AgentRL/SQL-v0", 2, "none")  # the session still plays
        _play(other, "AgentRL/SQL-v0", 3, "none")  # and the other one too
    mcp = openenv_url + "/mcp"
    garbage = httpx.post(mcp, content=b"{not json", headers={"content-type": "application/json"}).json()
    assert garbage["error"]["code"] == -32700
    for body in (
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "sql", "arguments": {"query": []}}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "nope"}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": "x"},
    ):
        assert "error" in httpx.post(mcp, json=body).json(), body
    assert httpx.post(mcp, content=b"x" * (2 << 20)).status_code == 413
    listed = httpx.post(mcp, json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"}).json()
    assert [t["name"] for t in listed["result"]["tools"]] == ["sql", "finish"]


def test_production_mode_plays_the_servers_id_over_http_mcp() -> None:
    """OpenEnv's HTTP MCP (``openenv/session/create``, then ``tools/call`` with the session): the server's episode."""
    env_id, profile, seed = "AgentRL/Workplace-v1", "flaky", 4
    proc, root = start_cli_server(["openenv", env_id, "--error-profile", profile, "--seed", str(seed)], "stdout")
    local = gym.make(env_id, error_profile=profile)
    try:
        client = MCPToolClient(base_url=root)
        client.use_production_mode = True  # tools/list and tools/call at POST /mcp, in one OpenEnv session
        with client.sync() as remote:
            assert _listed(remote) == _schemas(local)
            observation, info = local.reset(seed=seed)
            core: Any = local.unwrapped
            oracle, done, failures = OracleAgent(local), False, 0
            while not done:
                action = oracle.act(observation, info)
                call = parse_action(action, core.tools)
                observation, reward, terminated, truncated, info = local.step(action)
                done = terminated or truncated
                if info["tool_result"]["ok"]:
                    step = remote.call_tool(call.name, **call.arguments)
                    assert (step["observation"], step["reward"], step["done"]) == (observation, float(reward), done)
                else:  # an error result is a JSON-RPC error, its message the observation
                    with pytest.raises(RuntimeError) as failed:
                        remote.call_tool(call.name, **call.arguments)
                    assert str(failed.value) == f"Tool '{call.name}' failed: {observation}"
                    failures += 1
            assert info["success"] and step["info"]["success"] and failures > 0
            with pytest.raises(RuntimeError, match="call reset"):  # the episode has ended: reset is OpenEnv's
                remote.call_tool("finish", answer="again")
    finally:
        local.close()
        stop_process(proc)


def test_openenv_client_example_runs_over_mcp() -> None:
    out = run_example("openenv_client.py", "--episodes", "1", "--mcp", "--error-profile", "flaky")
    assert out.count("(gym.make same), solved") == len(agentrl_envs.ENV_IDS), out
