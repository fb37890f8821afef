"""agentrl_envs.integrations.gem_env: every id through ``gem.make``, step for step against ``gym.make``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl_envs.errors import ConfigError

from ..conftest import ENV_IDS
from .conftest import run_example
from .frameworks import HOSTILE_ACTIONS, gym_twin, import_or_skip

gem = import_or_skip("gem", "gem")
from agentrl_envs.integrations.gem_env import AgentRLGemEnv  # noqa: E402

SEED = 3


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_the_oracle_succeeds_through_gem_make_with_gym_makes_rewards(env_id: str, profile: str) -> None:
    env = gem.make(env_id, error_profile=profile)
    twin, instruction, twin_info = gym_twin(env_id, SEED, error_profile=profile)
    try:
        observation, info = env.reset(seed=SEED)
        assert isinstance(env, AgentRLGemEnv) and env.env_id == env_id
        assert (observation, info["task_id"], info["system_prompt"]) == (
            instruction,
            twin_info["task_id"],
            twin_info["system_prompt"],
        )
        while True:
            action = env.env.unwrapped.oracle_action()
            observation, reward, terminated, truncated, info = env.step(action)
            want = twin.step(action)
            assert (observation, reward, terminated, truncated) == want[:4]
            assert (info["reward_components"], info["fault"]) == (want[4]["reward_components"], want[4]["fault"])
            if terminated or truncated:
                break
        assert info["success"] is True
    finally:
        env.close()
        twin.close()


def test_faults_of_the_flaky_profile_reach_gem() -> None:
    env = gem.make("AgentRL/Workplace-v1", error_profile="flaky")
    env.reset(seed=0)
    faults = []
    while True:
        _, _, terminated, truncated, info = env.step(env.env.unwrapped.oracle_action())
        faults.append(info["fault"])
        if terminated or truncated:
            break
    env.close()
    assert any(faults) and info["success"] is True


@pytest.mark.parametrize("kind", sorted(HOSTILE_ACTIONS))
def test_hostile_actions_get_an_error_and_the_format_penalty(kind: str) -> None:
    env = gem.make("AgentRL/SQL-v0")
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step(HOSTILE_ACTIONS[kind])
    assert observation.startswith("action error [") and not (terminated or truncated)
    assert info["reward_components"]["format"] < 0
    assert env.step(env.env.unwrapped.oracle_action())[0].startswith("sql ok")  # the episode goes on
    env.close()


def test_constructor_seed_spawn_and_random_action() -> None:
    env = gem.make("AgentRL/SQL-v0", seed=7)
    twin, instruction, _ = gym_twin("AgentRL/SQL-v0", 7)
    assert env.reset()[0] == instruction  # the constructor's seed (what gem.make_vec passes) seeds the first reset
    child = env.spawn(split="test")
    assert child.make_kwargs == {"split": "test"} and child.reset(seed=7)[1]["split"] == "test"
    with pytest.raises(NotImplementedError, match="replay"):
        env.spawn(same_state=True)
    assert env.sample_random_action().startswith("<tool_call>")
    for e in (env, child, twin):
        e.close()
    with pytest.raises(ConfigError, match="unknown environment"):
        AgentRLGemEnv("AgentRL/Nope-v0")


def test_every_id_is_registered_once() -> None:
    from agentrl_envs.integrations.gem_env import register_gem_envs

    assert register_gem_envs() == list(ENV_IDS)  # a second registration is a no-op, not gem's "already registered"
    from gem.envs.registration import ENV_REGISTRY

    assert set(ENV_IDS) <= set(ENV_REGISTRY)


def test_gem_oracle_example() -> None:
    out = run_example("gem_oracle.py", "--episodes", "2")
    assert "success 2/2" in out


def test_import_agentrl_envs_imports_no_gem() -> None:
    code = "import sys, agentrl_envs, agentrl_envs.integrations; print('gem' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
