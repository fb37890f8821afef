"""EnvOptions is the one list of an env's options: the signature, the attribute guard and set_attr read it."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import gymnasium as gym
import pytest

import agentrl_envs
from agentrl_envs import ConfigError
from agentrl_envs.core.env import SETTABLE_ATTRIBUTES, ToolUseEnv
from agentrl_envs.core.options import SETTABLE_OPTIONS, EnvOptions
from agentrl_envs.rewards.schedule import AuxRewardConfig

FIELDS = [f.name for f in dataclasses.fields(EnvOptions)]


@pytest.mark.parametrize("env_id", list(agentrl_envs.ENV_IDS))
def test_the_make_keywords_are_the_option_fields(env_id: str) -> None:
    cls = gym.spec(env_id).entry_point
    module, _, name = str(cls).partition(":")
    klass = getattr(__import__(module, fromlist=[name]), name)
    assert list(inspect.signature(klass).parameters) == FIELDS
    defaults = {p.name: p.default for p in inspect.signature(klass).parameters.values()}
    assert defaults == {f.name: f.default for f in dataclasses.fields(EnvOptions)}


def test_options_are_frozen_checked_and_normalized() -> None:
    opts = EnvOptions(candidates=3, mail_domains=["a.example"], realtime=1)  # type: ignore[arg-type]
    assert opts.mail_domains == ("a.example",) and opts.realtime is True
    assert isinstance(opts.aux_reward, AuxRewardConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.candidates = 4  # type: ignore[misc]
    with pytest.raises(ConfigError, match="up to 1024"):
        dataclasses.replace(opts, candidates=10**9)
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_the_env_keeps_its_options_in_one_place() -> None:
    env = gym.make("AgentRL/SQL-v0", max_steps=7, candidates=2)
    core = env.unwrapped
    assert isinstance(core, ToolUseEnv)
    assert core.options.max_steps == 7 and core.candidates == core.options.candidates == 2
    env.set_wrapper_attr("candidates", 4)
    assert core.options.candidates == 4 and core.options.max_steps == 7
    env.set_wrapper_attr("aux_reward", 0.5)
    assert core.aux_reward is core.options.aux_reward
    for name in FIELDS:
        if name not in SETTABLE_OPTIONS:
            with pytest.raises(ConfigError, match=f"{name} is fixed when the env is made"):
                setattr(core, name, getattr(core.options, name))
    assert set(SETTABLE_OPTIONS) <= set(SETTABLE_ATTRIBUTES)
    env.close()


def test_an_unknown_keyword_names_the_nearest_one() -> None:
    with pytest.raises(TypeError, match="did you mean 'max_steps'"):
        gym.make("AgentRL/SQL-v0", max_step=3)
