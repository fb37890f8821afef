"""Shared fixtures. Every test module imports agentrl_envs through here, which registers the envs."""

from __future__ import annotations

import os

import pytest

import agentrl_envs

ENV_IDS = tuple(agentrl_envs.ENV_IDS)
SPLITS = ("train", "test", "heldout")


def require_integration() -> bool:
    """Under CI (AGENTRL_REQUIRE_INTEGRATION=1) a missing server is a failure, not a skip."""
    return os.environ.get("AGENTRL_REQUIRE_INTEGRATION") == "1"


@pytest.fixture(params=ENV_IDS)
def env_id(request: pytest.FixtureRequest) -> str:
    return str(request.param)
