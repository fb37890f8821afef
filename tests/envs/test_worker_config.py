"""The config a `agentrl-envs serve --workers N` worker starts with travels as JSON, never a pickle."""

from __future__ import annotations

import json

import pytest

from agentrl_envs.faults.profile import load_profile
from agentrl_envs.server.processes import WorkerConfig
from agentrl_envs.server.simulator import ServeLimits


@pytest.mark.parametrize("profile", [None, "realistic"])
def test_the_worker_config_round_trips_through_json(profile: str | None) -> None:
    limits = ServeLimits(python_workers=3, per_client=7, max_episodes=11, episode_idle_s=12.5)
    config = WorkerConfig(load_profile(profile) if profile else None, 1.5, 4.0, "tok", limits)
    data = config.to_json()
    json.loads(data)  # plain JSON
    back = WorkerConfig.from_json(data)
    assert back.limits == limits and back.token == "tok" and (back.sql_deadline_s, back.python_timeout_s) == (1.5, 4.0)
    assert (back.profile is None) == (profile is None)
    if profile:
        assert back.profile.to_yaml() == config.profile.to_yaml()


def test_bytes_that_are_not_a_worker_config_are_refused() -> None:
    for bad in (b"", b"\x80\x04K\x01.", b"[]", b'{"profile": null}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            WorkerConfig.from_json(bad)
