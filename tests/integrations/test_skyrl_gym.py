"""agentrl_envs.integrations.skyrl_gym_env: every id through ``skyrl_gym.make``, step for step against ``gym.make``."""

from __future__ import annotations

import re

import pytest

from agentrl_envs.errors import ConfigError

from ..conftest import ENV_IDS
from .conftest import ROOT, run_example
from .frameworks import HOSTILE_ACTIONS, gym_twin, import_or_skip

skyrl_gym = import_or_skip("skyrl_gym", "skyrl")
from agentrl_envs.integrations.skyrl_gym_env import AgentRLTextEnv, register_skyrl_gym_envs  # noqa: E402

SEED = 3


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_the_oracle_succeeds_through_skyrl_gym_make_with_gym_makes_rewards(env_id: str, profile: str) -> None:
    env = skyrl_gym.make(env_id, env_config={"error_profile": profile}, extras={"seed": SEED, "reward_spec": {}, "data": "x"})
    twin, instruction, twin_info = gym_twin(env_id, SEED, error_profile=profile)
    try:
        chat, metadata = env.init([{"role": "user", "content": "ignored: the env writes the prompt"}])
        assert isinstance(env, AgentRLTextEnv) and env.spec.id == env_id
        assert chat == [{"role": "system", "content": twin_info["system_prompt"]}, {"role": "user", "content": instruction}]
        assert metadata["task_id"] == twin_info["task_id"] and env.max_turns == twin_info["max_steps"]
        total = 0.0
        while True:
            action = env.env.unwrapped.oracle_action()
            out = env.step(action)
            observation, reward, terminated, truncated, info = twin.step(action)
            total += reward
            assert (out["reward"], out["done"]) == (reward, terminated or truncated)
            assert (
                out["metadata"]["observation"] == observation
                and out["metadata"]["reward_components"] == info["reward_components"]
            )
            assert out["observations"] == ([] if out["done"] else [{"role": "user", "content": observation}])
            if out["done"]:
                break
        assert out["metadata"]["success"] is True
        assert env.get_metrics() == {"return": pytest.approx(total), "success": 1.0, "steps": env.turns}
    finally:
        env.close()
        twin.close()


def test_a_row_overrides_the_config_and_skyrl_keys_are_not_make_kwargs() -> None:
    env = skyrl_gym.make(
        "AgentRL/SQL-v0",
        env_config={"split": "train", "max_steps": 4},
        extras={"seed": 1, "split": "test", "reward_spec": {"x": 1}},
    )
    assert env.make_kwargs == {"split": "test", "max_steps": 4}
    assert env.init([])[0][1]["content"] == gym_twin("AgentRL/SQL-v0", 1, split="test")[1]
    env.close()


@pytest.mark.parametrize("kind", sorted(HOSTILE_ACTIONS))
def test_hostile_replies_get_an_error_message_and_the_format_penalty(kind: str) -> None:
    env = skyrl_gym.make("AgentRL/SQL-v0", extras={"seed": 0})
    env.init([])
    out = env.step(HOSTILE_ACTIONS[kind])
    assert not out["done"] and out["observations"][0]["content"].startswith("action error [")
    assert out["metadata"]["reward_components"]["format"] < 0
    assert env.step(env.env.unwrapped.oracle_action())["observations"][0]["content"].startswith("sql ok")
    env.close()


@pytest.mark.parametrize(("extras", "match"), [({"seed": -1}, "seed"), ({"seed": "0"}, "seed"), ({"seed": True}, "seed")])
def test_bad_rows_are_clear_errors(extras: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        skyrl_gym.make("AgentRL/SQL-v0", extras=extras)
    with pytest.raises(ConfigError, match="unknown environment"):
        AgentRLTextEnv("AgentRL/Nope-v0")


def test_every_id_is_registered_once() -> None:
    assert register_skyrl_gym_envs() == list(ENV_IDS)
    assert set(ENV_IDS) <= set(skyrl_gym.registry)


def test_skyrl_gym_oracle_example() -> None:
    out = run_example("skyrl_gym_oracle.py", "--episodes", "2")
    assert "success 2/2" in out


def test_the_docs_python_examples_run() -> None:
    import_or_skip("gem", "gem")
    text = (ROOT / "docs" / "guide" / "verifiers-skyrl-gem.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/guide/verifiers-skyrl-gem.md", "exec"), {})
