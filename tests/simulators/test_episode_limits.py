"""Open episodes: idle expiry and a cap (issue #33: ``agentrl-envs serve`` kept 2,000 open for ever).

Time is a clock the tests move (no sleeps); limits are a cap of 3 and counts of episodes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import load_profile
from agentrl_envs.server.simulator import ServeLimits, SimulatorServer
from simulators import SimulatorApp
from simulators.episode_table import EpisodeTable

IDLE_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(clock: Clock) -> Iterator[SimulatorApp]:
    sim = SimulatorApp(python_sandbox=False, lazy_python=True, max_episodes=3, episode_idle_s=IDLE_S, clock=clock)
    yield sim
    sim.close()


def _open(app: SimulatorApp, episode_id: str, token: str | None = None) -> tuple[int, Any]:
    return app.call("POST", "/v1/episodes", {"episode_id": episode_id}, token)


def _token(app: SimulatorApp, episode_id: str) -> str:
    status, reply = _open(app, episode_id)
    assert status == 201, reply
    return str(reply["result"]["episode_token"])


def _write(app: SimulatorApp, episode_id: str, token: str) -> int:
    return app.call("PUT", f"/v1/episodes/{episode_id}/files/notes.txt", {"text": "x"}, token)[0]


def _open_count(app: SimulatorApp) -> int:
    status, reply = app.call("GET", "/health", {})
    assert status == 200
    return int(reply["result"]["episodes"])


def test_past_the_cap_a_new_episode_is_refused_and_none_is_closed(app: SimulatorApp) -> None:
    tokens = {e: _token(app, e) for e in ("a", "b", "c")}
    status, reply = _open(app, "d")
    assert status == 503 and reply["error"]["type"] == "too_many_episodes" and reply["error"]["max_episodes"] == 3
    assert "--max-episodes" in reply["error"]["message"] and "DELETE /v1/episodes" in reply["error"]["message"]
    assert all(_write(app, e, t) == 204 for e, t in tokens.items())  # every open episode still works
    assert _open(app, "a", tokens["a"])[0] == 201  # replacing one of them is not one more
    app.close_episode("b")
    assert _open(app, "d")[0] == 201 and _open_count(app) == 3


def test_idle_episodes_are_closed_and_a_used_one_is_kept(app: SimulatorApp, clock: Clock) -> None:
    tokens = {e: _token(app, e) for e in ("a", "b", "c")}
    workspace = app.workspace_of("b")
    assert workspace is not None and os.path.isdir(workspace)
    clock.now += IDLE_S * 0.6
    assert _write(app, "a", tokens["a"]) == 204  # a call on "a": its idle time starts again
    clock.now += IDLE_S * 0.6
    assert app.expire_idle() == 2 and _open_count(app) == 1
    assert not os.path.exists(workspace)  # its workspace went with it
    status, reply = app.call("PUT", "/v1/episodes/b/files/x.txt", {"text": "x"}, tokens["b"])
    assert status == 404 and reply["error"]["type"] == "unknown_episode" and f"idle for {IDLE_S:g} s" in reply["error"]["message"]
    assert _write(app, "a", tokens["a"]) == 204
    clock.now += IDLE_S
    assert _open_count(app) == 0  # every request expires what is due, before it is served


def test_an_idle_episode_makes_room_for_a_new_one(app: SimulatorApp, clock: Clock) -> None:
    for i in range(50):
        assert _open(app, f"e{i}")[0] == 201, i  # never closed by their clients
        clock.now += IDLE_S / 2.5  # so at most three are within IDLE_S of now
        assert _open_count(app) <= 3
    assert _open_count(app) >= 2


def test_the_table_is_least_recently_used_first_and_spares_busy_episodes(clock: Clock) -> None:
    table: EpisodeTable[str] = EpisodeTable(max_open=4, idle_s=IDLE_S, clock=clock)
    for name in "abcd":
        table.put(name, name.upper())
        clock.now += 1
    assert table.full() and table.touch("a") == "A" and table.touch("zz") is None
    clock.now += IDLE_S - 1.5  # b (opened at +1) and c (+2) are due; a was just touched, d (+3) not yet
    assert table.expire(busy=lambda episode: episode == "B") == [("c", "C")]
    assert table.ids() == ["d", "a", "b"]  # the busy one counts as used now
    clock.now += IDLE_S
    assert [e for e, _ in table.expire()] == ["d", "a", "b"] and len(table) == 0 and table.expired_count == 4


def test_without_limits_nothing_expires(clock: Clock) -> None:
    sim = SimulatorApp(python_sandbox=False, lazy_python=True, clock=clock)
    try:
        for i in range(20):
            assert _open(sim, f"e{i}")[0] == 201
        clock.now += 1e9
        assert sim.expire_idle() == 0 and _open_count(sim) == 20
    finally:
        sim.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_episodes", 0), ("max_episodes", -1), ("max_episodes", 2.5), ("episode_idle_s", 0.0), ("episode_idle_s", float("nan"))],
)
def test_bad_limits_are_refused_naming_the_value(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        ServeLimits(**{field: value})
    with pytest.raises(ValueError, match=field):
        SimulatorApp(python_sandbox=False, lazy_python=True, **{field: value})


def _post(server: SimulatorServer, path: str, body: dict[str, Any], token: str | None = None) -> tuple[int, Any]:
    status, data, _headers = server.dispatch("POST", path, json.dumps(body).encode(), 0.0, token)
    return status, json.loads(data) if data else None


def test_the_server_applies_its_limits() -> None:
    server = SimulatorServer(limits=ServeLimits(max_episodes=3, workers=1))
    try:
        assert all(_post(server, "/v1/episodes", {"episode_id": f"e{i}"})[0] == 201 for i in range(3))
        status, reply = _post(server, "/v1/episodes", {"episode_id": "e3"})
        assert status == 503 and reply["error"]["type"] == "too_many_episodes"
    finally:
        server.close()


def test_the_server_forgets_the_fault_state_of_expired_episodes(clock: Clock) -> None:
    sim = SimulatorApp(python_sandbox=False, lazy_python=True, max_episodes=3, episode_idle_s=IDLE_S, clock=clock)
    server = SimulatorServer(load_profile("flaky"), app=sim)
    try:
        assert server.faults is not None
        for i in range(3):
            assert _post(server, "/v1/episodes", {"episode_id": f"e{i}", "seed": i})[0] == 201
        clock.now += IDLE_S
        assert sim.expire_idle() == 3
        assert all(server.faults._episodes.get(f"e{i}") is None for i in range(3))
    finally:
        server.close()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-episodes", "0"),
        ("--max-episodes", "1.5"),
        ("--episode-idle-s", "0"),
        ("--episode-idle-s", "nan"),
        ("--episode-idle-s", "1e9"),
    ],
)
def test_serve_refuses_bad_episode_limits_at_parse_time(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl_envs.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "0", flag, value])
    assert exc.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err


def test_serve_passes_its_episode_limits_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl_envs.cli import main as cli

    seen: dict[str, Any] = {}
    monkeypatch.setattr("agentrl_envs.server.processes.serve", lambda *a, **kw: seen.update(kw) or 0)
    assert cli.main(["serve", "--port", "0", "--max-episodes", "3", "--episode-idle-s", "60"]) == 0
    assert (seen["limits"].max_episodes, seen["limits"].episode_idle_s) == (3, 60.0)
    defaults = ServeLimits()
    assert (defaults.max_episodes, defaults.episode_idle_s) == (8192, 900.0)
