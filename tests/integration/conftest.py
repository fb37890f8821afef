"""Session-wide real servers for the integration tests (started once, stopped at the end)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.servers import postgres_cluster, simulator_server, smtp_server


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with postgres_cluster() as url:
        yield url


@pytest.fixture(scope="session")
def smtp() -> Iterator[tuple[str, list[Any]]]:
    with smtp_server() as server:
        yield server


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    with simulator_server() as (url, _proc):
        yield url
