"""The contract every registered tool meets, checked over the registry (as test_envs does over ids).

:func:`contract_failures` runs each check of one tool and names the ones that fail: the schema
renders through a chat template, hostile arguments get the format penalty, a profile that fails
every call injects faults into it (with their penalties), its aux term is accepted, a per-tool
backend mount reaches it, the simulator declares its route and the OpenAPI document lists it,
``fit-profile`` maps its log name to it, it has a progress rule, and the oracle (with candidates
on) solves an env that uses it. The last tests show that a tool missing one piece of its wiring fails the contract.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym
import pytest

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.backends import SHARED_SCHEMES
from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.backends.mounts import MountedBackend, make_mounted
from agentrl_envs.core.actions import format_call, parse_action
from agentrl_envs.errors import ActionError, ConfigError
from agentrl_envs.faults import load_profile, parse_profile
from agentrl_envs.faults.injector import FaultInjectingBackend
from agentrl_envs.faults.logs import _tool_of
from agentrl_envs.rewards.schedule import default_terms, parse_aux_reward
from agentrl_envs.tools import TOOLS, Tool, get_tool, service_tools
from simulators.openapi import OPENAPI, tool_paths
from simulators.tools import TOOL_ROUTES
from tests.faults.fakes import FakeBackend

# A Hermes-style tools block, as Qwen's and Hermes' chat templates write it.
_TEMPLATE = "<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>"
_HOSTILE: list[Any] = [{"no_such_argument": 1}, {}, {"\ud800": "x"}]


def _profile(data: dict[str, Any]) -> Any:
    return parse_profile(json.dumps(data))


def _fail_everything() -> Any:
    return _profile({"name": "fail-all", "defaults": {"rates": {"http_500": 1.0}}, "penalties": {"http_500": -2.0}})


_ENVS: dict[str, gym.Env[str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_envs() -> Any:
    yield
    for env in _ENVS.values():
        env.close()
    _ENVS.clear()


def _env(env_id: str) -> gym.Env[str, str]:
    """One env per id for the whole module (making one starts services; a seeded reset starts afresh)."""
    if env_id not in _ENVS:
        _ENVS[env_id] = gym.make(env_id, format_penalty=-0.25, candidates=3)
    return _ENVS[env_id]


def _env_for(tool: str) -> str | None:
    """The registered env id with the fewest tools that offers ``tool``."""
    found = []
    for env_id in agentrl_envs.ENV_IDS:
        module, _, name = str(gym.spec(env_id).entry_point).partition(":")
        names = getattr(importlib.import_module(module), name).tool_names
        if tool in names:
            found.append((len(names), env_id))
    return min(found)[1] if found else None


def check_schema(tool: Tool) -> None:
    jinja2 = pytest.importorskip("jinja2")
    schema = tool.schema({})
    assert schema["function"]["name"] == tool.name and schema["function"]["description"]
    assert schema["function"]["parameters"]["type"] == "object"
    text = jinja2.Environment().from_string(_TEMPLATE).render(tools=[schema])
    assert json.loads(text.removeprefix("<tools>\n").removesuffix("\n</tools>")) == schema


def check_hostile_arguments(tool: Tool) -> None:
    for arguments in _HOSTILE:
        with pytest.raises(ActionError):
            parse_action(format_call(tool.name, arguments), {tool.name: tool})
    env_id = _env_for(tool.name)
    assert env_id is not None, f"no registered env offers {tool.name!r}"
    env = _env(env_id)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(format_call(tool.name, {"no_such_argument": 1}))
    assert info["reward_components"]["format"] == -0.25 and reward == -0.25
    assert info["tool_result"]["ok"] is False


def check_faults(tool: Tool) -> None:
    inner = FakeBackend()
    profile = _fail_everything()
    backend = FaultInjectingBackend(inner, profile)
    backend.open_episode(EpisodeSetup("ep", None, seed=1))
    for i in range(5):
        response = backend.handle(ToolRequest("ep", tool.name, {}, at_s=float(i)))
        assert response.fault is not None and response.fault["origin"] == "injected", response
        assert not tool.succeeded(response)
    assert inner.calls == [], "a call that should have faulted reached the service"
    assert profile.penalty("http_500") == -2.0
    assert _profile({"name": "one-tool", "tools": {tool.name: {"rates": {"timeout": 0.5}}}}).for_tool(tool.name).rates


def check_aux_term(tool: Tool) -> None:
    assert tool.name in default_terms(), f"{tool.name} has no aux_term"
    assert parse_aux_reward({"terms": {tool.name: 0.7}}).terms[tool.name] == 0.7


def check_mounts(tool: Tool) -> None:
    default, own = FakeBackend(), FakeBackend()
    mounted = make_mounted({"default": default, tool.name: own})
    mounted.handle(ToolRequest("ep", tool.name, {}))
    assert [r.tool for r in own.calls] == [tool.name] and default.calls == []
    others = [name for name in service_tools() if name != tool.name]
    for scheme in tool.backend_schemes:
        if scheme.startswith(SHARED_SCHEMES):
            # A scheme `agentrl-envs serve` shares (http://): the tool's real service only under its own key.
            own = make_mounted({"default": default, tool.name: scheme + "host:1"})
            assert isinstance(own, MountedBackend)
            kind = type(own.routes[tool.name])
            real = tool.real_backend(scheme + "host:1")
            assert kind is type(real)
            real.close()
            for other in others:
                mounted = make_mounted({"default": default, other: scheme + "host:1"})
                assert isinstance(mounted, MountedBackend) and not isinstance(mounted.routes[other], kind)
                mounted.close()
            own.close()
            continue
        for other in others:
            with pytest.raises(ConfigError):
                make_mounted({"default": default, other: scheme + "host/x"})


def check_simulator(tool: Tool) -> None:
    route = TOOL_ROUTES.get(tool.name)
    assert route is not None, f"simulators/ declares no route for {tool.name!r} (simulators/tools.py)"
    paths, schemas = tool_paths(TOOL_ROUTES)
    path = f"/v1/episodes/{{episode_id}}/{tool.name}"
    assert path in paths and path in OPENAPI["paths"], f"the OpenAPI document does not list {path}"
    assert route.result_name in schemas
    assert set(tool.parameters.get("required", [])) <= set(route.request.get("required", []))


def check_summary(tool: Tool) -> None:
    good = ToolResponse(ok=True, status=200, result={})
    bad = ToolResponse(ok=False, status=500, error_type="http_500", error="boom")
    for response in (good, bad):
        summary = tool.summarize(response)
        assert {"tool", "ok", "status", "error_type", "error"} <= set(summary) and summary["tool"] == tool.name
        assert isinstance(tool.render(response), str)
    assert tool.summarize(bad)["ok"] is False


def check_log_names(tool: Tool) -> None:
    assert tool.log_names, f"{tool.name} has no log_names for fit-profile"
    assert _tool_of(tool.name, []) == tool.name
    assert _tool_of(f"POST /api/{tool.log_names[0]}", []) == tool.name


def check_progress(tool: Tool) -> None:
    assert tool.component, f"{tool.name} has no progress rule (Tool.component, observe, gold_call)"
    assert type(tool).observe is not Tool.observe and type(tool).gold_call is not Tool.gold_call


def check_oracle_and_candidates(tool: Tool) -> None:
    env_id = _env_for(tool.name)
    assert env_id is not None, f"no registered env offers {tool.name!r}"
    env = _env(env_id)
    agent = OracleAgent(env)
    obs, info = env.reset(seed=0)
    called, done = False, False
    while not done:
        action = agent.act(obs, info)
        assert action in info["candidates"]
        obs, _, terminated, truncated, info = env.step(action)
        called |= info["tool"] == tool.name
        done = terminated or truncated
    assert called and info["success"], f"the oracle did not solve {env_id} with {tool.name}"


CHECKS: dict[str, Callable[[Tool], None]] = {
    "schema": check_schema,
    "hostile_arguments": check_hostile_arguments,
    "faults": check_faults,
    "aux_term": check_aux_term,
    "mounts": check_mounts,
    "simulator": check_simulator,
    "summary": check_summary,
    "log_names": check_log_names,
    "progress": check_progress,
    "oracle_and_candidates": check_oracle_and_candidates,
}


def contract_failures(tool: Tool, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """The checks ``tool`` fails, by name, with what failed (each check runs even when another failed)."""
    failed: dict[str, str] = {}
    for name, check in CHECKS.items():
        if name in skip:
            continue
        try:
            check(tool)
        except pytest.skip.Exception:
            raise
        except (Exception, pytest.fail.Exception) as exc:  # an assertion, a failed pytest.raises or any error
            failed[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return failed


@pytest.mark.parametrize("name", service_tools())
def test_registered_tool_meets_the_contract(name: str) -> None:
    assert contract_failures(get_tool(name)) == {}


def test_registries_agree() -> None:
    """The env suite's tools and the simulator's routes are the same set; unknown names are errors."""
    assert set(service_tools()) == set(TOOL_ROUTES)
    assert "finish" in TOOLS and not TOOLS["finish"].service
    with pytest.raises(ConfigError, match="unknown tool"):
        get_tool("nope")


def test_unknown_tool_is_an_error_everywhere() -> None:
    inner = FakeBackend()
    backend = FaultInjectingBackend(inner, load_profile("flaky"))
    backend.open_episode(EpisodeSetup("ep", None, seed=0))
    response = backend.handle(ToolRequest("ep", "nope", {}))
    assert response.status == 404 and response.error_type == "unknown_tool" and inner.calls == []
    with pytest.raises(ConfigError, match="unknown tool"):
        _profile({"name": "x", "tools": {"nope": {"rates": {"timeout": 0.1}}}})
    with pytest.raises(ConfigError, match="unknown tool"):
        parse_aux_reward({"terms": {"nope": 0.1}})
    with pytest.raises(ConfigError, match="unknown key"):
        make_mounted({"nope": "sim"})


class _EchoTool(Tool):
    """A test-only tool: a schema and a render, and none of the rest of the wiring."""

    name: ClassVar[str] = "echo"
    description: ClassVar[str] = "Echo the text back."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Callable[[Tool], None]:
    def register(tool: Tool) -> None:
        monkeypatch.setitem(TOOLS, tool.name, tool)

    return register


def test_a_tool_with_only_schema_and_render_fails_the_contract(registered: Callable[[Tool], None]) -> None:
    registered(_EchoTool())
    failed = contract_failures(_EchoTool())
    # Faults, mounts and summaries come from the registry, so registering is enough for them.
    assert set(failed) == {"aux_term", "simulator", "log_names", "progress", "hostile_arguments", "oracle_and_candidates"}, failed


def test_removing_one_piece_fails_the_contract(registered: Callable[[Tool], None], monkeypatch: pytest.MonkeyPatch) -> None:
    sql = get_tool("sql")

    class NoAuxSQL(type(sql)):  # type: ignore[misc]
        aux_term: ClassVar[float | None] = None

    registered(NoAuxSQL())
    assert set(contract_failures(NoAuxSQL(), skip=("hostile_arguments", "oracle_and_candidates"))) == {"aux_term"}
    monkeypatch.setitem(TOOLS, "sql", sql)
    monkeypatch.delitem(TOOL_ROUTES, "sql")
    assert set(contract_failures(sql, skip=("hostile_arguments", "oracle_and_candidates"))) == {"simulator"}


def test_an_unregistered_tool_gets_no_faults_and_no_mount() -> None:
    """Without its registration line a tool is refused, never passed through silently."""
    assert "faults" in contract_failures(_EchoTool(), skip=("hostile_arguments", "oracle_and_candidates"))
    assert "mounts" in contract_failures(_EchoTool(), skip=("hostile_arguments", "oracle_and_candidates"))
