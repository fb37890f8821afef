"""Session-wide real servers for the integration tests (started once, stopped at the end)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.servers import PostgresCluster, agentrl_leftovers, postgres_cluster, simulator_server, smtp_server


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """The cluster; after the suite, no ``agentrl_*`` schema or role may be left in it."""
    with postgres_cluster() as cluster:
        yield cluster
        gc.collect()  # envs a failed test left open close in __del__
        left = agentrl_leftovers(cluster.super_url)
        assert left == [], f"the PostgreSQL tests left {len(left)} schema(s)/role(s) behind: {left[:10]}"


@pytest.fixture(scope="session")
def pg_url(pg_cluster: PostgresCluster) -> str:
    """The least-privilege account of docs/guide/backends.md (CREATEROLE, CREATE on the database; no superuser)."""
    return pg_cluster.url


@pytest.fixture(scope="session")
def smtp() -> Iterator[tuple[str, list[Any]]]:
    with smtp_server() as server:
        yield server


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    with simulator_server() as (url, _proc):
        yield url
