"""``agentrl-envs mcp`` through the ``mcp`` SDK's own client, over stdio and streamable HTTP.

The oracle's calls solve every registered id over HTTP, with and without faults, and each step's
observation and reward equal ``gym.make``'s on the same seed; stdio runs a representative pair.
Hostile input (unknown tool, wrong argument types, a huge action, malformed JSON-RPC, oversized
bodies, a full server, an expired session) gets an error and leaves other sessions working.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import gymnasium as gym
import httpx
import pytest

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import parse_action
from agentrl_envs.testing import start_cli_server, stop_process

from .conftest import require, run_example

require("mcp")

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

_ACCEPT = {"accept": "application/json, text/event-stream"}
_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}


async def _play(client: Client, env_id: str, seed: int, profile: str) -> None:
    """The oracle's episode over MCP in lockstep with gym.make: same task, observations, rewards; solved."""
    local = gym.make(env_id, error_profile=profile)
    try:
        reset = await client.call_tool("reset", {"seed": seed})
        observation, info = local.reset(seed=seed)
        assert reset.content[0].text == observation  # type: ignore[union-attr]
        oracle, done, remote, rewards = OracleAgent(local), False, [], []
        while not done:
            action = oracle.act(observation, info)
            call = parse_action(action, local.unwrapped.tools)  # type: ignore[attr-defined]
            observation, reward, terminated, truncated, info = local.step(action)
            done = terminated or truncated
            result: Any = await client.call_tool(call.name, call.arguments)
            step = result.structured_content
            assert (step["observation"], step["done"]) == (observation, done)
            assert result.content[0].text == observation and result.is_error == (not info["tool_result"]["ok"])
            remote.append(step["reward"])
            rewards.append(float(reward))
        assert remote == rewards and info["success"], (env_id, seed, profile, remote, rewards)
    finally:
        local.close()


async def _hostile(client: Client) -> None:
    """Hostile calls get tool errors; the session still plays afterwards."""
    await client.call_tool("reset", {"seed": 0})
    unknown = await client.call_tool("no_such_tool", {"x": 1})
    assert unknown.is_error and "unknown_tool" in unknown.content[0].text  # type: ignore[union-attr]
    wrong = await client.call_tool("sql", {"query": 12})
    assert wrong.is_error and "bad_arguments" in wrong.content[0].text  # type: ignore[union-attr]
    huge = await client.call_tool("sql", {"query": "x" * 300_000})
    assert huge.is_error and "too_long" in huge.content[0].text  # type: ignore[union-attr]
    for bad in ({"seed": "a"}, {"seed": -1}, {"other": 1}):
        refused = await client.call_tool("reset", bad)
        assert refused.is_error and refused.structured_content is None
    with pytest.raises(Exception, match="unknown resource"):
        await client.read_resource("agentrl://nope")


def test_stdio_lists_tools_plays_the_oracle_and_survives_hostile_calls() -> None:
    async def main() -> None:
        for env_id, profile in (("AgentRL/SQL-v0", "none"), ("AgentRL/Workplace-v1", "flaky")):
            params = StdioServerParameters(
                command=sys.executable, args=["-m", "agentrl_envs", "mcp", env_id, "--error-profile", profile, "--seed", "4"]
            )
            async with Client(stdio_client(params)) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                core: Any = gym.make(env_id).unwrapped
                assert set(tools) == {*core.tools, "reset"}
                for name, tool in core.tools.items():
                    assert tools[name].input_schema == tool.schema()["function"]["parameters"]
                # before any reset, the task is the --seed episode's
                task = (await client.read_resource("agentrl://task")).contents[0].text  # type: ignore[union-attr]
                assert task == gym.make(env_id, error_profile=profile).reset(seed=4)[0]
                prompt = await client.get_prompt("task")
                assert prompt.messages[0].content.text == task  # type: ignore[union-attr]
                await _play(client, env_id, 11, profile)
                ended = await client.call_tool("finish", {"answer": "again"})
                assert ended.is_error and "call reset" in ended.content[0].text  # type: ignore[union-attr]
                await _hostile(client)
                await _play(client, env_id, 12, profile)

    anyio.run(main)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[tuple[str, str], str]]:
    """One HTTP server per id and profile, on 127.0.0.1."""
    keys = [(env_id, profile) for env_id in agentrl_envs.ENV_IDS for profile in ("none", "flaky")]
    with ThreadPoolExecutor(len(keys)) as pool:  # they start side by side
        futures = {
            key: pool.submit(start_cli_server, ["mcp", key[0], "--transport", "http", "--error-profile", key[1]], "stderr")
            for key in keys
        }
    started = {key: future.result() for key, future in futures.items() if future.exception() is None}
    try:
        assert len(started) == len(keys), [str(f.exception()) for f in futures.values() if f.exception()]
        yield {key: url + "/mcp" for key, (_, url) in started.items()}
    finally:
        for proc, _ in started.values():
            stop_process(proc)


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_http_oracle_solves_every_id_with_gym_make_rewards(servers: dict[tuple[str, str], str], profile: str) -> None:
    async def main() -> None:
        for env_id in agentrl_envs.ENV_IDS:
            async with Client(servers[(env_id, profile)]) as client:
                assert "reset" in {t.name for t in (await client.list_tools()).tools}
                for seed in (0, 1):
                    await _play(client, env_id, seed, profile)

    anyio.run(main)


def test_http_sessions_are_apart_and_a_hostile_one_leaves_the_others_working() -> None:
    proc, root = start_cli_server(
        ["mcp", "AgentRL/SQL-v0", "--transport", "http", "--max-sessions", "3", "--idle-s", "1"], "stderr"
    )
    url = root + "/mcp"
    try:

        async def main() -> None:
            async with Client(url) as first, Client(url) as second:
                await first.call_tool("reset", {"seed": 1})
                await _hostile(second)
                # a malformed JSON-RPC body, an oversized body, an unknown session, a 2026-era request
                assert httpx.post(url, content=b"{not json", headers=_ACCEPT).status_code == 400
                assert httpx.post(url, content=b"x" * (2 << 20), headers=_ACCEPT).status_code == 413
                assert httpx.post(url, json=_INIT, headers={**_ACCEPT, "mcp-session-id": "nope"}).status_code == 404
                modern = httpx.post(url, json=_INIT, headers={**_ACCEPT, "mcp-protocol-version": "2026-07-28"})
                assert modern.status_code == 400 and "initialize" in modern.json()["error"]["message"]
                # the third session fits, the fourth gets 503; a session never closed expires (--idle-s 1)
                third = httpx.post(url, json=_INIT, headers=_ACCEPT)
                assert third.status_code == 200
                full = httpx.post(url, json=_INIT, headers=_ACCEPT)
                assert full.status_code == 503 and "3 sessions" in full.json()["error"]["message"]
                await _play(first, "AgentRL/SQL-v0", 1, "none")  # each call keeps it alive
                await _play(second, "AgentRL/SQL-v0", 2, "none")

        anyio.run(main)
        deadline = time.monotonic() + 20
        while httpx.post(url, json=_INIT, headers=_ACCEPT).status_code != 200:  # the idle sessions expire
            assert time.monotonic() < deadline, "idle sessions were not closed"
            time.sleep(0.5)
    finally:
        stop_process(proc)


def test_mcp_client_example_runs() -> None:
    out = run_example("mcp_client.py", "--env-id", "AgentRL/SQLPythonSMTP-v1", "--transport", "http", "--episodes", "2")
    assert out.count("(gym.make same), solved") == 2, out


#: Session-creating requests in the 10,000-session test (the issue's hostile count).
SESSION_ATTEMPTS = 10_000


def test_ten_thousand_initialize_requests_get_503_and_a_live_session_keeps_playing() -> None:
    """10,000 ``initialize`` requests (each would open a session) through one keep-alive connection."""
    proc, root = start_cli_server(["mcp", "AgentRL/SQL-v0", "--transport", "http", "--max-sessions", "2"], "stderr")
    url = root + "/mcp"
    try:

        async def main() -> None:
            async with Client(url) as live, httpx.AsyncClient(timeout=60) as http:
                await live.call_tool("reset", {"seed": 1})
                created, refusals = [], set()
                for _ in range(SESSION_ATTEMPTS):
                    answer = await http.post(url, json=_INIT, headers=_ACCEPT)
                    if answer.status_code == 200:
                        created.append(answer.headers["mcp-session-id"])
                    else:
                        refusals.add((answer.status_code, answer.json()["error"]["message"]))
                assert len(created) == 1
                assert refusals == {(503, "the server holds 2 sessions (its limit); close one (DELETE) or try later")}
                await _play(live, "AgentRL/SQL-v0", 1, "none")  # the live session is untouched
                gone = await http.delete(url, headers={**_ACCEPT, "mcp-session-id": created[0]})
                assert gone.status_code == 200
            async with Client(url) as again:  # the freed place takes a new session
                await _play(again, "AgentRL/SQL-v0", 2, "none")

        anyio.run(main)
    finally:
        stop_process(proc)
