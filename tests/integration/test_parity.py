"""Same seeds, same oracle transcripts on sim, direct, HTTP, and real PostgreSQL + SMTP."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

from agentrl_envs.agents import OracleAgent
from tests.conftest import ENV_IDS

pytestmark = pytest.mark.integration
SEEDS = (0, 1, 2, 3)


def transcript(env_id: str, backend: Any, seed: int, **kwargs: Any) -> list[Any]:
    env = gym.make(env_id, backend=backend, **kwargs)
    try:
        agent = OracleAgent(env)
        obs, info = env.reset(seed=seed)
        out: list[Any] = [obs, info]
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
            out.append((obs, reward, terminated, truncated, info))
            done = terminated or truncated
        assert info["success"], (env_id, seed, info["task_components"])
        return out
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_direct_and_http_match_sim(env_id: str, sim_url: str) -> None:
    for seed in SEEDS:
        reference = transcript(env_id, "sim", seed)
        assert transcript(env_id, "direct", seed) == reference
        assert transcript(env_id, sim_url, seed) == reference


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_postgres_and_smtp_match_sim(env_id: str, pg_url: str, smtp: tuple[str, list[Any]]) -> None:
    smtp_url, received = smtp
    before = len(received)
    for seed in SEEDS:
        reference = transcript(env_id, "sim", seed)
        real = transcript(env_id, {"default": "sim", "sql": pg_url, "smtp": smtp_url}, seed)
        assert real == reference
    if env_id in ("AgentRL/SMTP-v0", "AgentRL/SQLPythonSMTP-v1"):
        assert len(received) - before == len(SEEDS)  # one accepted message per episode reached the server


def test_all_real_with_python_over_http(pg_url: str, smtp: tuple[str, list[Any]], sim_url: str) -> None:
    backend = {"default": sim_url, "sql": pg_url, "smtp": smtp[0]}
    for seed in SEEDS:
        assert transcript("AgentRL/SQLPythonSMTP-v1", backend, seed) == transcript("AgentRL/SQLPythonSMTP-v1", "sim", seed)


def test_long_horizon_on_real_services(pg_url: str, smtp: tuple[str, list[Any]]) -> None:
    backend = {"default": "sim", "sql": pg_url, "smtp": smtp[0]}
    assert transcript("AgentRL/SQLPythonSMTP-v1", backend, 5, long_horizon=True) == transcript(
        "AgentRL/SQLPythonSMTP-v1", "sim", 5, long_horizon=True
    )


def test_http_tool_on_serve_and_on_a_real_upstream(sim_url: str) -> None:
    """AgentRL/HTTP-v0: sim, direct, serve, and the http tool on a real REST upstream (127.0.0.1, a free port)."""
    from simulators.http import CompanyAPI
    from simulators.http.upstream import CompanyServer

    env_id = "AgentRL/HTTP-v0"
    for seed in SEEDS:
        reference = transcript(env_id, "sim", seed)
        assert transcript(env_id, "direct", seed) == reference
        assert transcript(env_id, sim_url, seed) == reference
        probe = gym.make(env_id, python_sandbox=False)
        probe.reset(seed=seed)
        tables = probe.unwrapped.task.database.tables  # type: ignore[attr-defined]
        probe.close()
        upstream = CompanyServer(CompanyAPI.from_tables(tables))
        try:
            assert transcript(env_id, {"default": sim_url, "http": upstream.url}, seed) == reference
            assert upstream.requests, "no call reached the upstream"
        finally:
            upstream.close()
            upstream.api.close()
