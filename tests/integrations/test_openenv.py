"""``agentrl-envs openenv`` through OpenEnv's own client (``GenericEnvClient`` over ``/ws``).

One server on 127.0.0.1; each session's reset picks the id and the fault profile. The oracle solves
every registered id with and without faults, and each step's observation and reward equal
``gym.make``'s on the same seed. Hostile input gets an error and leaves other sessions working.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import gymnasium as gym
import httpx
import pytest

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import parse_action
from agentrl_envs.testing import start_cli_server, stop_process

from .conftest import require, run_example

require("openenv.core.env_server")

from openenv.core import GenericEnvClient  # noqa: E402


def _play(remote: object, env_id: str, seed: int, profile: str) -> None:
    """The oracle's episode over OpenEnv in lockstep with gym.make: same task, observations, rewards; solved."""
    local = gym.make(env_id, error_profile=profile)
    try:
        result = remote.reset(seed=seed, env_id=env_id, error_profile=profile)  # type: ignore[attr-defined]
        observation, info = local.reset(seed=seed)
        assert result.observation["text"] == observation
        assert [t["name"] for t in result.observation["tools"]] == list(local.unwrapped.tools)  # type: ignore[attr-defined]
        oracle, done, remote_rewards, rewards = OracleAgent(local), False, [], []
        while not done:
            action = oracle.act(observation, info)
            call = parse_action(action, local.unwrapped.tools)  # type: ignore[attr-defined]
            observation, reward, terminated, truncated, info = local.step(action)
            done = terminated or truncated
            result = remote.step({"tool": call.name, "arguments": call.arguments})  # type: ignore[attr-defined]
            assert (result.observation["text"], result.done, result.observation["terminated"]) == (observation, done, terminated)
            remote_rewards.append(result.reward)
            rewards.append(float(reward))
        assert remote_rewards == rewards and info["success"], (env_id, seed, profile, remote_rewards, rewards)
        state = remote.state()  # type: ignore[attr-defined]
        assert state["done"] and state["env_id"] == env_id and state["step_count"] == len(rewards)
    finally:
        local.close()


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_openenv_client_solves_every_id_with_gym_make_rewards(openenv_url: str, profile: str) -> None:
    with GenericEnvClient(base_url=openenv_url).sync() as remote:
        for env_id in agentrl_envs.ENV_IDS:
            for seed in (0, 1):
                _play(remote, env_id, seed, profile)


def test_health_schema_and_one_shot_http_reset(openenv_url: str) -> None:
    assert httpx.get(openenv_url + "/health").json()["status"] == "healthy"
    schema = httpx.get(openenv_url + "/schema").json()
    assert {"tool", "arguments", "text"} <= set(schema["action"]["properties"])
    assert {"text", "terminated", "truncated", "info", "tools"} <= set(schema["observation"]["properties"])
    reset = httpx.post(openenv_url + "/reset", json={"seed": 5, "split": "test"}).json()
    assert reset["observation"]["text"] == gym.make("AgentRL/SQL-v0", split="test").reset(seed=5)[0]


def test_hostile_input_gets_errors_and_other_sessions_keep_working(openenv_url: str) -> None:
    with GenericEnvClient(base_url=openenv_url).sync() as good, GenericEnvClient(base_url=openenv_url).sync() as bad:
        good.reset(seed=3)
        refusals = {
            "session keyword": lambda: bad.reset(bogus=1),
            "shipped profile": lambda: bad.reset(error_profile="/etc/passwd"),
            "backend": lambda: bad.reset(backend="http://10.0.0.1:80"),
            "unknown environment": lambda: bad.reset(env_id="AgentRL/Nope-v0"),
            "send a reset first": lambda: bad.step({"tool": "sql", "arguments": {"query": "SELECT 1"}}),
        }
        for message, call in refusals.items():
            with pytest.raises(RuntimeError, match=message):
                call()
        bad.reset(seed=1)
        for action in ({"nope": 1}, {"tool": "sql", "text": "x"}, {}):
            with pytest.raises(RuntimeError, match="Invalid message"):
                bad.step(action)
        refused = bad.step({"tool": "sql", "arguments": {"query": 12}})
        assert refused.reward == pytest.approx(-0.1) and "bad_arguments" in refused.observation["text"]
        garbage = bad.step({"text": "<tool_call>{" * 50_000})
        assert "too_long" in garbage.observation["text"] or "bad_json" in garbage.observation["text"]
        _play(good, "AgentRL/SQL-v0", 3, "none")
    assert httpx.post(openenv_url + "/reset", content=b"x" * (2 << 20)).status_code == 413
    assert (
        httpx.post(openenv_url + "/step", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    )


def test_session_limit(openenv_url: str) -> None:
    clients = [GenericEnvClient(base_url=openenv_url).sync() for _ in range(5)]
    try:
        for client in clients[:4]:
            client.connect()
            client.reset(seed=0)
        clients[4].connect()
        with pytest.raises(Exception):  # noqa: B017 - OpenEnv sends CAPACITY_REACHED and closes; its client reports either
            clients[4].reset(seed=0)
        clients[0].close()
        with GenericEnvClient(base_url=openenv_url).sync() as again:  # a closed session frees its place
            again.reset(seed=0)
        assert clients[1].state()["env_id"] == "AgentRL/SQL-v0"  # the others are untouched
    finally:
        for client in clients:
            try:
                client.close()
            except Exception:
                pass


def test_openenv_client_example_runs() -> None:
    out = run_example("openenv_client.py", "--episodes", "1", "--error-profile", "flaky")
    assert out.count("(gym.make same), solved") == len(agentrl_envs.ENV_IDS), out


#: Session-creating requests in the 10,000-session test (the issue's hostile count).
SESSION_ATTEMPTS = 10_000


def test_ten_thousand_session_attempts_are_refused_and_a_live_session_keeps_playing() -> None:
    """OpenEnv's HTTP ``openenv/session/create`` (the cheapest session it opens) 10,000 times through one connection."""
    proc, root = start_cli_server(["openenv", "AgentRL/SQL-v0", "--max-sessions", "2"], "stdout")
    conn = http.client.HTTPConnection(root.removeprefix("http://"), timeout=60)  # keep-alive, and lighter than httpx

    def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
        conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        return json.loads(conn.getresponse().read())  # type: ignore[no-any-return]

    try:
        with GenericEnvClient(base_url=root).sync() as live:
            live.reset(seed=3)
            created, refusals = [], set()
            for _ in range(SESSION_ATTEMPTS):
                reply = rpc("openenv/session/create", {})
                if "result" in reply:
                    created.append(reply["result"]["session_id"])
                else:
                    refusals.add(reply["error"]["message"])
            assert len(created) == 1 and refusals == {"Server at capacity: 2/2 sessions active. Cannot accept new connections."}
            with GenericEnvClient(base_url=root).sync() as extra, pytest.raises(Exception):  # noqa: B017 - CAPACITY_REACHED
                extra.reset(seed=0)
            _play(live, "AgentRL/SQL-v0", 3, "none")  # the live session is untouched
            assert rpc("openenv/session/close", {"session_id": created[0]})["result"]["closed"] is True
            with GenericEnvClient(base_url=root).sync() as again:  # the freed place takes a new session
                _play(again, "AgentRL/SQL-v0", 4, "none")
    finally:
        conn.close()
        stop_process(proc)
