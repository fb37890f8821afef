"""``AgentRL/HTTP-v0`` on a real HTTP upstream: parity with the simulator, allow-lists and hostile calls.

The upstream is :class:`simulators.http.upstream.CompanyServer` (the company service over a real
socket on 127.0.0.1, a free port), started by the tests with the episode's own data. A second
server, the decoy, stands for every host outside the allow-list: no call may ever reach it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the ids
from agentrl_envs.agents import OracleAgent, RandomAgent
from agentrl_envs.backends.base import ToolRequest
from agentrl_envs.backends.rest import RESTBackend
from agentrl_envs.core.actions import format_call
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks import TaskSampler
from simulators.http import CompanyAPI
from simulators.http.request import MAX_BODY_BYTES
from simulators.http.upstream import CompanyServer

ENV_ID = "AgentRL/HTTP-v0"
TASK_SEEDS = (0, 1, 2, 3, 5)  # the five templates appear among these (checked below)


def _tables(task_seed: int) -> dict[str, Any]:
    task = TaskSampler("http").sample(task_seed)
    assert task.database is not None
    return json.loads(json.dumps(task.database.tables))


@pytest.fixture
def decoy() -> Iterator[CompanyServer]:
    server = CompanyServer(CompanyAPI.from_tables(_tables(0)))
    yield server
    server.close()
    assert server.requests == [], f"a call reached a host outside the allow-list: {server.requests}"


def make(backend: Any, **kwargs: Any) -> gym.Env[str, str]:
    # No Python tool here: the plain runner spares each env the sandbox's start-up.
    return gym.make(ENV_ID, backend=backend, candidates=3, python_sandbox=False, **kwargs)


def play(env: gym.Env[str, str], task_seed: int, agent: str = "oracle") -> list[Any]:
    player = OracleAgent(env) if agent == "oracle" else RandomAgent(env, seed=task_seed)
    obs, info = env.reset(seed=task_seed, options={"task_seed": task_seed})
    out: list[Any] = [obs, info]
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(player.act(obs, info))
        out.append((obs, reward, terminated, truncated, {k: v for k, v in info.items() if k != "sandbox_tier"}))
        done = terminated or truncated
    if agent == "oracle":
        assert info["success"], (task_seed, info["task_components"])
    return out


@pytest.fixture
def upstream() -> Iterator[CompanyServer]:
    server = CompanyServer(CompanyAPI.from_tables(_tables(0)))
    yield server
    server.close()
    server.api.close()


def _fresh(server: CompanyServer, task_seed: int) -> None:
    """The upstream's data set back to the episode's own (a real service would be reset the same way)."""
    old, server.api = server.api, CompanyAPI.from_tables(_tables(task_seed))
    old.close()


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_real_upstream_gives_the_simulator_transcripts(profile: str, upstream: CompanyServer, decoy: CompanyServer) -> None:
    envs = {name: make(b, error_profile=profile) for name, b in (("sim", "sim"), ("direct", "direct"))}
    envs["real"] = make({"default": "sim", "http": upstream.url}, error_profile=profile)
    try:
        for seed in TASK_SEEDS:
            reference = play(envs["sim"], seed)
            assert play(envs["direct"], seed) == reference
            _fresh(upstream, seed)
            before = len(upstream.requests)
            assert play(envs["real"], seed) == reference
            assert len(upstream.requests) > before, "the real upstream received no call"
    finally:
        for env in envs.values():
            env.close()
    assert {TaskSampler("http").sample(s).subtasks[0].template for s in TASK_SEEDS} == {
        "http.lookup",
        "http.ticket_count",
        "http.create_ticket",
        "http.close_ticket",
        "http.reassign",
    }


def test_random_agent_on_the_upstream_matches_too(upstream: CompanyServer, decoy: CompanyServer) -> None:
    """Random calls (writes, deletes, bad requests) answer alike on both."""
    sim, real = make("sim"), make({"http": upstream.url})
    try:
        for seed in (0, 3):
            _fresh(upstream, seed)
            assert play(real, seed, agent="random") == play(sim, seed, agent="random")
    finally:
        sim.close()
        real.close()


def test_allow_lists_are_checked_when_the_backend_is_made() -> None:
    with pytest.raises(ConfigError, match="allow_hosts"):
        RESTBackend("http://127.0.0.1:1", allow_hosts=["gateway.internal"])
    with pytest.raises(ConfigError, match="allow_methods"):
        RESTBackend("http://127.0.0.1:1", allow_methods=["PUT"])
    for bad in ("ftp://x", "http://", "http://h:99999", "http://h/?q=1"):
        with pytest.raises(ConfigError):
            RESTBackend(bad)


def _hostile(decoy_url: str) -> list[tuple[str, dict[str, Any], str]]:
    host = decoy_url.removeprefix("http://")
    return [
        ("absolute_url", {"method": "GET", "path": decoy_url + "/v1/tickets"}, "bad_path"),
        ("scheme_relative", {"method": "GET", "path": f"//{host}/v1/tickets"}, "bad_path"),
        ("userinfo_host", {"method": "GET", "path": f"@{host}/v1"}, "bad_path"),
        ("traversal", {"method": "GET", "path": "/v1/../../../etc/passwd"}, "bad_path"),
        ("encoded_traversal", {"method": "GET", "path": "/%2e%2e/%2e%2e/etc/passwd"}, "bad_path"),
        ("header_injection_path", {"method": "GET", "path": f"/v1\r\nHost: {host}\r\n"}, "bad_path"),
        ("header_injection_encoded", {"method": "GET", "path": f"/v1%0d%0aHost:%20{host}"}, "bad_path"),
        ("header_injection_query", {"method": "GET", "path": "/v1/tickets", "query": {"q": f"x\r\nHost: {host}"}}, "bad_request"),
        ("huge_body", {"method": "POST", "path": "/v1/tickets", "body": {"title": "x" * (2 * MAX_BODY_BYTES)}}, "too_large"),
        ("huge_path", {"method": "GET", "path": "/" + "a" * 100_000}, "too_large"),
        ("method_put", {"method": "PUT", "path": "/v1/tickets/1"}, "bad_arguments"),
        ("method_connect", {"method": "CONNECT", "path": host}, "bad_arguments"),
        ("method_lowercase", {"method": "get", "path": "/v1"}, "bad_arguments"),
        ("headers_argument", {"method": "GET", "path": "/v1", "headers": {"Host": host}}, "bad_arguments"),
        ("url_argument", {"method": "GET", "path": "/v1", "url": decoy_url}, "bad_arguments"),
    ]


def test_hostile_calls_never_leave_the_allow_list(upstream: CompanyServer, decoy: CompanyServer) -> None:
    """Straight to the backend (no tool checks in front): every call is refused before it is sent."""
    backend, read_only = RESTBackend(upstream.url), RESTBackend(upstream.url, allow_methods=("GET",))
    try:
        for case, arguments, kind in _hostile(decoy.url):
            response = backend.handle(ToolRequest("ep", "http", arguments))
            assert not response.ok and response.error_type == kind and 400 <= response.status < 500, (case, response)
        for method in ("POST", "PATCH", "DELETE"):
            response = read_only.handle(ToolRequest("ep", "http", {"method": method, "path": "/v1/tickets/1"}))
            assert response.status == 405 and response.error_type == "method_not_allowed"
        assert upstream.requests == []
        ok = read_only.handle(ToolRequest("ep", "http", {"method": "GET", "path": "/v1/tickets/1"}))
        assert ok.ok and ok.result["body"]["ticket_id"] == 1 and upstream.requests == [("GET", "/v1/tickets/1")]
    finally:
        backend.close()
        read_only.close()


def test_redirects_are_not_followed(decoy: CompanyServer) -> None:
    bouncer = CompanyServer(CompanyAPI.from_tables(_tables(0)), redirect_to=decoy.url + "/v1/tickets")
    backend = RESTBackend(bouncer.url)
    try:
        response = backend.handle(ToolRequest("ep", "http", {"method": "GET", "path": "/v1/tickets"}))
        assert not response.ok and response.status == 302 and response.error_type == "redirect"
        assert bouncer.requests == [("GET", "/v1/tickets")]
    finally:
        backend.close()
        bouncer.close()


def test_an_unreachable_upstream_is_a_service_fault() -> None:
    server = CompanyServer(CompanyAPI.from_tables(_tables(0)))
    url = server.url
    server.close()
    backend = RESTBackend(url, timeout_s=2.0)
    try:
        response = backend.handle(ToolRequest("ep", "http", {"method": "GET", "path": "/v1"}))
        assert not response.ok and response.fault == {"type": "connection_reset", "status": 599, "origin": "service"}
    finally:
        backend.close()


def test_hostile_actions_in_the_env_are_errors_and_the_episode_survives(upstream: CompanyServer, decoy: CompanyServer) -> None:
    env = make({"http": upstream.url})
    try:
        for case, arguments, _kind in _hostile(decoy.url):
            _fresh(upstream, 2)
            obs, info = env.reset(seed=2, options={"task_seed": 2})
            obs, reward, terminated, truncated, info = env.step(format_call("http", arguments))
            assert not terminated and not truncated and env.observation_space.contains(obs), case
            assert obs.startswith("action error [bad_arguments]") and info["reward_components"]["format"] < 0, (case, obs[:200])
            agent = OracleAgent(env)
            while not (terminated or truncated):
                obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
            assert info["success"], case
        assert all(not path.startswith(("/..", "//")) for _, path in upstream.requests)
    finally:
        env.close()


def test_a_write_the_service_refuses_is_the_agents_error_not_a_fault() -> None:
    env = make("sim")
    try:
        env.reset(seed=0, options={"task_seed": 2})
        obs, reward, _, _, info = env.step(
            format_call("http", {"method": "PATCH", "path": "/v1/tickets/1", "body": {"status": "gone"}})
        )
        assert obs.startswith("http error [validation, status 422]") and reward == 0.0
        assert info["fault"]["origin"] == "agent" and info["tool_result"]["ok"] is False
        obs, *_ = env.step(format_call("http", {"method": "GET", "path": "/openapi.json"}))
        assert obs.startswith("http ok [HTTP 200]") and "/v1/tickets" in obs
    finally:
        env.close()


@pytest.mark.parametrize(("env_id", "mode"), [(ENV_ID, "sync"), (ENV_ID, "async"), ("AgentRL/Workplace-v1", "async")])
def test_vector_envs_solve_the_new_ids(env_id: str, mode: str) -> None:
    """The registry-wide vector test runs on SQLPythonSMTP-v1 only; the http envs get theirs here."""
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode)
    try:
        obs, _info = venv.reset(seed=20)
        assert len(set(obs)) == 2 and all(o.startswith("You are an analytics agent") for o in obs)
        solved = [False, False]
        for _ in range(40):
            obs, rewards, terminated, truncated, _info = venv.step(venv.call("oracle_action"))
            assert all(isinstance(o, str) and o.strip("0") for o in obs), "stale shared-memory observation"
            for i in range(2):
                solved[i] |= bool(terminated[i] and rewards[i] >= 1.0)
                assert not truncated[i]
            if all(solved):
                break
        assert all(solved)
    finally:
        venv.close()


_EDGE_CALLS = [
    {"method": "GET", "path": "/v1/customers", "query": {"name": 24, "limit": "2"}},
    {"method": "GET", "path": "/v1/customers", "query": {"tier": True}},
    {"method": "GET", "path": "/v1/tickets", "query": {"ticket_id": 1.0}},
    {"method": "GET", "path": "/v1/tickets", "query": {"ticket_id": 1.5, "offset": "x"}},
    {"method": "GET", "path": "/v1/tickets/%31"},
    {"method": "GET", "path": "/v1/tickets/1'"},
    {"method": "GET", "path": "/v1/staff", "query": {"name": "Zoë ✓ & = ?"}},
    {"method": "GET", "path": "/v1/tickets/", "body": {}},
    {"method": "PATCH", "path": "/v1/tickets/2", "body": {"title": "naïve \u2028 line", "priority": "high"}},
    {
        "method": "POST",
        "path": "/v1/tickets",
        "body": {"title": "x", "priority": "low", "assignee": "nobody@x", "customer_id": 1},
    },
    {"method": "DELETE", "path": "/v1/tickets/3"},
    {"method": "DELETE", "path": "/v1/tickets/3"},
    {"method": "GET", "path": "/openapi.json"},
]


def test_edge_calls_answer_alike_on_the_simulator_and_the_upstream(upstream: CompanyServer) -> None:
    """Values that a URL carries as text (numbers, booleans, escapes, non-ASCII) mean the same on both."""
    sim, real = make("sim", max_steps=40), make({"http": upstream.url}, max_steps=40)
    try:
        seed = 0  # a retail task: the customers collection exists
        _fresh(upstream, seed)
        seen = []
        for env in (sim, real):
            env.reset(seed=seed, options={"task_seed": seed})
            seen.append([env.step(format_call("http", call))[::4] for call in _EDGE_CALLS])
        assert seen[0] == seen[1]
        assert sum(info["tool_result"]["ok"] for _, info in seen[0]) >= 5  # not only errors
    finally:
        sim.close()
        real.close()
