"""PostgreSQL under docs/guide/backends.md's least-privilege account: no writes, cleanup works, failures are loud, pg-sweep."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import psycopg
import pytest

from agentrl_envs import ConfigError
from agentrl_envs.backends.postgres import APP_PREFIX, CleanupWarning, sweep
from agentrl_envs.cli.main import main
from agentrl_envs.core.actions import format_call
from tests.integration.servers import PostgresCluster, agentrl_leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def sql_backend(env: gym.Env[str, str]) -> Any:
    return env.unwrapped._backend.routes["sql"]  # type: ignore[attr-defined]


def test_the_account_is_the_documented_least_privilege_role(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user").fetchone()
    assert row == (False, True, False)


TWO_STEP_WRITES = [
    ("temp_after_read_write", ["SET default_transaction_read_only = off", "CREATE TEMP TABLE t (a int)"]),
    (
        "temp_as_after_session_rw",
        ["SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE", "CREATE TEMP TABLE t AS SELECT 1 AS a"],
    ),
    ("insert_after_read_write", ["SET default_transaction_read_only = off", "INSERT INTO staff SELECT * FROM staff"]),
    ("create_in_public", ["SET default_transaction_read_only = off", "CREATE TABLE public.t (a int)"]),
    ("create_schema", ["SET default_transaction_read_only = off", "CREATE SCHEMA agentrl_mine"]),
]


@pytest.mark.parametrize(("name", "queries"), TWO_STEP_WRITES, ids=[c[0] for c in TWO_STEP_WRITES])
def test_a_read_write_session_still_cannot_write(name: str, queries: list[str], pg_url: str) -> None:
    """Read-only is a session default an agent can switch off; privileges are what stop writes."""
    env = gym.make("AgentRL/SQL-v0", backend={"sql": pg_url})
    env.reset(seed=0)
    *setup, attack = queries
    for query in setup:
        assert env.step(format_call("sql", {"query": query}))[4]["tool_result"]["ok"]
    obs, _, _, _, info = env.step(format_call("sql", {"query": attack}))
    assert info["tool_result"]["ok"] is False and info["tool_result"]["error_type"] == "denied", obs
    env.close()


def test_a_database_where_public_may_create_temp_tables_is_refused(pg_cluster: PostgresCluster) -> None:
    with psycopg.connect(pg_cluster.super_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE open_temp")
        conn.execute("GRANT CREATE ON DATABASE open_temp TO agentrl")
    try:
        url = pg_cluster.url.rsplit("/", 1)[0] + "/open_temp"
        env = gym.make("AgentRL/SQL-v0", backend={"sql": url})
        with pytest.raises(ConfigError, match="REVOKE TEMPORARY ON DATABASE"):
            env.reset(seed=0)
        env.close()
    finally:
        with psycopg.connect(pg_cluster.super_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE open_temp")


@pytest.mark.parametrize("env_id", ["AgentRL/SQL-v0", "AgentRL/SQLPythonSMTP-v1"])
def test_episodes_leave_nothing_behind(env_id: str, pg_cluster: PostgresCluster) -> None:
    env = gym.make(env_id, backend={"sql": pg_cluster.url})
    for seed in range(4):  # each reset drops the previous episode's schema and role
        env.reset(seed=seed)
        _, _, _, _, info = env.step(env.unwrapped.oracle_action())
        assert info["tool_result"]["ok"], info["tool_result"]
        live = [n for n in agentrl_leftovers(pg_cluster.super_url) if n.startswith(("schema agentrl_ep_", "role agentrl_ep_"))]
        assert len(live) == 2, live  # this episode's schema and role, nothing older
    backend = sql_backend(env)
    env.close()
    assert backend.cleanup_errors == []
    assert agentrl_leftovers(pg_cluster.super_url) == []


def test_a_failed_cleanup_warns_and_pg_sweep_removes_it(pg_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]) -> None:
    env = gym.make("AgentRL/SQL-v0", backend={"sql": pg_cluster.url})
    env.reset(seed=0)
    backend = sql_backend(env)
    (episode,) = backend._episodes.values()
    with psycopg.connect(pg_cluster.super_url, autocommit=True) as conn:
        conn.execute(f'REVOKE "{episode.schema}" FROM agentrl')  # the admin loses what cleanup needs
    with pytest.warns(CleanupWarning, match="pg-sweep"):
        env.close()
    assert len(backend.cleanup_errors) == 1 and episode.schema in backend.cleanup_errors[0]
    assert f"role {episode.schema}" in agentrl_leftovers(pg_cluster.super_url)
    wait_until_disconnected(pg_cluster.super_url, [episode.schema], [backend._token])
    assert main(["pg-sweep", pg_cluster.url]) == 0
    out = capsys.readouterr().out
    assert f"dropped role {episode.schema}" in out and f"dropped schema {episode.schema}" in out
    assert agentrl_leftovers(pg_cluster.super_url) == []


CHILD = """
import sys
import gymnasium as gym
import agentrl_envs
env = gym.make(sys.argv[1], backend={"sql": sys.argv[2]})
env.reset(seed=int(sys.argv[3]))
backend = env.unwrapped._backend.routes["sql"]
print(" ".join([e.schema for e in backend._episodes.values()] + sorted(backend._templates)), flush=True)
sys.stdin.read()
"""


def start_child(url: str, env_id: str = "AgentRL/SQLPythonSMTP-v1", seed: int = 0) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, env_id, url, str(seed)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    names = proc.stdout.readline().split()
    assert names, "the child process did not open an episode"
    return proc, names


def wait_until_disconnected(super_url: str, roles: list[str], tokens: list[str], tries: int = 600) -> None:
    """Wait until no session of these episode roles or backend tokens is left (a closed or killed client's)."""
    # Bounded by a count: the server notices closed client sockets on its own schedule.
    apps = [APP_PREFIX + t for t in tokens]
    with psycopg.connect(super_url, autocommit=True) as conn:
        for _ in range(tries):
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = ANY(%s) OR application_name = ANY(%s)", (roles, apps)
            ).fetchone()
            if busy is not None and busy[0] == 0:
                return
            time.sleep(0.05)
    pytest.fail(f"sessions of {roles} / {apps} were still connected after {tries} checks")


def test_pg_sweep_removes_what_a_killed_process_left(pg_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]) -> None:
    proc, names = start_child(pg_cluster.url)
    episode_schema = names[0]
    proc.kill()
    proc.wait()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.stdout.close()
    wait_until_disconnected(pg_cluster.super_url, [episode_schema], [names[1].split("_")[2]])
    left = agentrl_leftovers(pg_cluster.super_url)
    assert f"schema {episode_schema}" in left and f"role {episode_schema}" in left
    assert all(f"schema {n}" in left for n in names[1:])  # the dead backend's template schemas

    live = gym.make("AgentRL/SQL-v0", backend={"sql": pg_cluster.url})
    live.reset(seed=1)
    try:
        assert main(["pg-sweep", pg_cluster.url, "--dry-run"]) == 0
        out = capsys.readouterr().out
        for name in names:
            assert f"would drop schema {name}" in out
        assert f"would drop role {episode_schema}" in out
        assert set(left) <= set(agentrl_leftovers(pg_cluster.super_url))  # a dry run drops nothing

        report = sweep(pg_cluster.url)
        assert sorted(report.schemas) == sorted(names) and report.roles == [episode_schema] and report.errors == []
        live_names = {e.schema for e in sql_backend(live)._episodes.values()} | set(sql_backend(live)._templates)
        assert live_names <= set(report.kept)  # a live backend's schemas and role are left alone
        _, _, _, _, info = live.step(format_call("sql", {"query": "SELECT count(*) AS n FROM staff"}))
        assert info["tool_result"]["ok"], info["tool_result"]
        assert main(["pg-sweep", pg_cluster.url]) == 0  # nothing more to do
        assert "0 schema(s) and 0 role(s) dropped" in capsys.readouterr().out
    finally:
        live.close()
    assert agentrl_leftovers(pg_cluster.super_url) == []


def test_pg_sweep_keeps_an_episode_whose_role_is_connected(pg_cluster: PostgresCluster) -> None:
    """A role with a session open is in use even when its name carries no live token (older versions)."""
    env = gym.make("AgentRL/SQL-v0", backend={"sql": pg_cluster.url})
    env.reset(seed=2)
    backend = sql_backend(env)
    (episode,) = backend._episodes.values()
    backend._admin.close()  # the backend's advertised token disappears; the episode's session stays
    try:
        report = sweep(pg_cluster.url, dry_run=True)
        assert episode.schema in report.kept
        assert episode.schema not in report.roles
    finally:
        with pytest.warns(CleanupWarning):
            env.close()  # its admin connection is gone, so cleanup fails loudly
        wait_until_disconnected(pg_cluster.super_url, [episode.schema], [backend._token])
        assert sweep(pg_cluster.url).errors == []
    assert agentrl_leftovers(pg_cluster.super_url) == []
