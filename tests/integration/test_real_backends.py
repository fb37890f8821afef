"""Real backends under hostile queries, bad URLs, unreachable and dying servers."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import psycopg
import pytest

from agentrl_envs import ConfigError, PermanentError, TransientError
from agentrl_envs.agents import OracleAgent
from agentrl_envs.backends.postgres import sweep
from agentrl_envs.core.actions import format_call
from tests.integration.servers import free_port, simulator_server

pytestmark = pytest.mark.integration


def finish_with_oracle(env: gym.Env[str, str], obs: str, info: dict[str, Any]) -> dict[str, Any]:
    agent = OracleAgent(env)
    done = False
    while not done:
        obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
        done = terminated or truncated
    return info


HOSTILE_SQL = [
    ("insert", "INSERT INTO staff VALUES (99, 'x', 'x@x.io', 'manager', 'north')", "denied"),
    ("update", "UPDATE staff SET email = 'evil@x.io'", "denied"),
    ("delete", "DELETE FROM staff", "denied"),
    ("drop", "DROP TABLE staff", "denied"),
    ("create", "CREATE TABLE t (a int)", "denied"),
    ("temp", "CREATE TEMP TABLE t (a int)", "denied"),
    ("copy_program", "COPY (SELECT 1) TO PROGRAM 'id'", "denied"),
    ("read_file", "SELECT pg_read_file('/etc/passwd')", "denied"),
    ("set_role", "SET ROLE agentrl", "denied"),
    ("sleep_past_deadline", "SELECT pg_sleep(30)", "timeout"),
    ("multi", "SELECT 1; SELECT 2", "bad_request"),
    ("syntax", "SELEC 1", "syntax"),
    ("catalog_other_schemas", "SELECT count(*) FROM agentrl_tpl_x.staff", "unknown_name"),
]


@pytest.mark.parametrize(("name", "query", "kind"), HOSTILE_SQL, ids=[c[0] for c in HOSTILE_SQL])
def test_hostile_sql_on_postgres(name: str, query: str, kind: str, pg_url: str) -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1", backend={"sql": pg_url}, sql_deadline_s=1.0)
    obs, info = env.reset(seed=1)
    start = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step(format_call("sql", {"query": query}))
    assert time.perf_counter() - start < 5.0
    assert info["tool_result"]["ok"] is False
    assert info["tool_result"]["error_type"] in (kind, "denied", "unknown_name"), obs
    assert obs.startswith("sql error")
    assert finish_with_oracle(env, obs, info)["success"]
    env.close()


def test_statement_timeout_cannot_be_switched_off(pg_url: str) -> None:
    env = gym.make("AgentRL/SQL-v0", backend={"sql": pg_url}, sql_deadline_s=1.0)
    env.reset(seed=2)
    env.step(format_call("sql", {"query": "SET statement_timeout = 0"}))
    start = time.perf_counter()
    _, _, _, _, info = env.step(format_call("sql", {"query": "SELECT pg_sleep(20)"}))
    assert info["tool_result"]["error_type"] == "timeout"
    assert time.perf_counter() - start < 4.0, "the client-side deadline did not cancel the query"
    env.step(format_call("sql", {"query": "BEGIN"}))
    _, _, _, _, info = env.step(format_call("sql", {"query": "SELECT count(*) AS n FROM staff"}))
    assert info["tool_result"]["ok"], info["tool_result"]
    env.close()


def test_episodes_cannot_see_each_other(pg_url: str) -> None:
    a = gym.make("AgentRL/SQL-v0", backend={"sql": pg_url})
    b = gym.make("AgentRL/SQL-v0", backend={"sql": pg_url})
    a.reset(seed=1)
    b.reset(seed=2)
    _, _, _, _, info = a.step(format_call("sql", {"query": "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'agentrl_ep_%'"}))
    schemas = [r for r in info["tool_result"].get("columns", [])]
    assert schemas == ["nspname"]
    other = b.unwrapped._backend.routes["sql"]._episodes[b.unwrapped._episode_id].schema  # type: ignore[union-attr]
    _, _, _, _, info = a.step(format_call("sql", {"query": f"SELECT count(*) FROM {other}.staff"}))
    assert info["tool_result"]["ok"] is False and info["tool_result"]["error_type"] in ("denied", "unknown_name")
    a.close()
    b.close()


def test_nothing_left_in_postgres_after_close(pg_url: str) -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1", backend={"sql": pg_url})
    names: set[str] = set()
    for seed in range(3):
        env.reset(seed=seed)
        backend = env.unwrapped._backend.routes["sql"]  # type: ignore[union-attr]
        names |= {e.schema for e in backend._episodes.values()} | set(backend._templates)
    assert len(names) >= 4
    env.close()
    with psycopg.connect(pg_url) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (list(names),)).fetchall()
        roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (list(names),)).fetchall()
    assert left == [] and roles == []


def test_unreachable_postgres_is_a_clear_error() -> None:
    port = free_port()
    start = time.perf_counter()
    with pytest.raises(TransientError, match="cannot connect to PostgreSQL"):
        env = gym.make("AgentRL/SQL-v0", backend={"sql": f"postgresql://x:y@127.0.0.1:{port}/db"})
        env.reset(seed=0)
    assert time.perf_counter() - start < 15


def test_a_wrong_password_is_a_permanent_error(pg_url: str) -> None:
    # it was a TransientError, so retry loops kept trying a password that could never work
    wrong = pg_url.replace("agentrl-test@", "wrong-password@")
    assert wrong != pg_url
    with pytest.raises(PermanentError, match=r"password authentication failed.*retrying will not help"):
        env = gym.make("AgentRL/SQL-v0", backend={"sql": wrong})
        env.reset(seed=0)
    with pytest.raises(PermanentError, match="password authentication failed"):
        sweep(wrong, dry_run=True)


@pytest.mark.parametrize(
    "backend",
    [
        "ftp://example.com",
        "http://",
        "http://127.0.0.1:99999",
        {"sql": "smtp://127.0.0.1:25"},
        {"smtp": "postgresql://x@127.0.0.1/db"},
        {"python": "postgresql://x@127.0.0.1/db"},
        {"mail": "sim"},
        {"smtp": "smtp://"},
        {"sql": 42},
    ],
    ids=repr,
)
def test_bad_backend_specs(backend: Any) -> None:
    with pytest.raises(ConfigError):
        env = gym.make("AgentRL/SQL-v0", backend=backend)
        env.reset(seed=0)


def test_unreachable_http_server_is_a_clear_error() -> None:
    env = gym.make("AgentRL/SQL-v0", backend=f"http://127.0.0.1:{free_port()}")
    start = time.perf_counter()
    with pytest.raises(TransientError, match="cannot reach the simulator"):
        env.reset(seed=0)
    assert time.perf_counter() - start < 10


def test_http_server_dying_mid_episode_is_a_fault_not_a_crash() -> None:
    with simulator_server() as (url, proc):
        env = gym.make("AgentRL/SQLPythonSMTP-v1", backend=url)
        obs, info = env.reset(seed=0)
        obs, *_ = env.step(OracleAgent(env).act(obs, info))
        proc.kill()
        proc.wait()
        start = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(OracleAgent(env).act(obs, info))
        assert time.perf_counter() - start < 10
        assert info["fault"] and info["fault"]["type"] in ("connection_reset", "timeout")
        assert info["fault"]["origin"] == "service"
        assert info["reward_components"]["fault"] < 0
        assert obs.startswith(("python error", "sql error", "smtp error"))
        env.close()


def test_smtp_server_down_mid_episode_is_a_fault(smtp: tuple[str, list[Any]]) -> None:
    port = free_port()  # nobody listens here
    env = gym.make("AgentRL/SMTP-v0", backend={"smtp": f"smtp://127.0.0.1:{port}"})
    obs, info = env.reset(seed=0)
    obs, _, _, _, info = env.step(OracleAgent(env).act(obs, info))
    assert info["fault"] == {"type": "connection_reset", "status": 599, "origin": "service"}
    assert info["reward_components"]["fault"] < 0
    env.close()


def test_smtp_refused_recipient_is_a_tool_error() -> None:
    from aiosmtpd.controller import Controller

    class Refusing:
        async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
            return "550 no such user"

    port = free_port()
    controller = Controller(Refusing(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        env = gym.make("AgentRL/SMTP-v0", backend={"smtp": f"smtp://127.0.0.1:{port}"})
        obs, info = env.reset(seed=0)
        obs, _, _, _, info = env.step(OracleAgent(env).act(obs, info))
        assert info["tool_result"]["ok"] is False and info["tool_result"]["error_type"] == "rejected"
        assert "550" in obs
        env.close()
    finally:
        controller.stop()


def test_server_side_profile_faults_replay_by_seed() -> None:
    with simulator_server("flaky") as (url, _proc):

        def run(seed: int) -> list[Any]:
            env = gym.make("AgentRL/SQLPythonSMTP-v1", backend=url, max_steps=40)
            obs, info = env.reset(seed=seed)
            faults = []
            done = False
            agent = OracleAgent(env)
            while not done:
                obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
                faults.append(info["fault"])
                done = terminated or truncated
            env.close()
            return faults

        runs = [run(s) for s in range(6)]
        assert runs == [run(s) for s in range(6)]
        injected = [f for r in runs for f in r if f and f["origin"] == "injected"]
        assert injected, "the flaky profile injected nothing server-side in six episodes"


def test_concurrent_calls_for_one_episode_do_not_hang(sim_url: str) -> None:
    """A client may send several calls for the same episode at once; they are served one by one."""
    import threading

    import httpx

    env = gym.make("AgentRL/SQL-v0", backend=sim_url)
    env.reset(seed=0)
    episode = env.unwrapped._episode_id
    token = env.unwrapped._backend._server(episode)._tokens[episode]  # the owner's token: other clients are refused
    statuses: list[int] = []

    def worker() -> None:
        with httpx.Client(base_url=sim_url, timeout=10, headers={"X-AgentRL-Episode-Token": token}) as client:
            for _ in range(15):
                statuses.append(
                    client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT count(*) AS n FROM staff"}).status_code
                )

    threads = [threading.Thread(target=worker) for _ in range(6)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert time.perf_counter() - start < 30
    assert statuses == [200] * 90
    env.close()


def test_http_backend_reports_numpy_in_the_tool_description(sim_url: str) -> None:
    import httpx

    health = httpx.get(sim_url + "/health", timeout=10).json()["result"]
    assert health["numpy"] is True
    env = gym.make("AgentRL/Python-v0", backend=sim_url)
    _, info = env.reset(seed=0)
    (python,) = [t for t in info["tools"] if t["function"]["name"] == "python"]
    assert "numpy" in python["function"]["description"]
    env.close()
