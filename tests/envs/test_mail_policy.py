"""Recipient-domain allow-list: mail only goes where the env allows, whatever the agent writes."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agentrl_envs import ConfigError
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import format_call


def send(env: gym.Env[str, str], to: object) -> dict[str, object]:
    env.reset(seed=0)
    *_, info = env.step(format_call("smtp", {"to": to, "subject": "hi", "body": "the figure is 1"}))
    return info


def test_outside_domain_is_refused_by_default() -> None:
    env = gym.make("AgentRL/SMTP-v0")
    info = send(env, ["boss@evil.example"])
    assert info["tool_result"]["ok"] is False and info["tool_result"]["error_type"] == "relay_denied"
    info = send(env, ["someone@retail.example", "x@gmail.com"])
    assert info["tool_result"]["error_type"] == "relay_denied"
    env.close()


def test_company_domain_and_subdomains_are_allowed() -> None:
    env = gym.make("AgentRL/SMTP-v0", domain="finance")
    assert send(env, ["ops@bank.example"])["tool_result"]["ok"] is True
    assert send(env, ["ops@eu.bank.example"])["tool_result"]["ok"] is True
    assert send(env, ["ops@notbank.example"])["tool_result"]["ok"] is False
    env.close()


def test_explicit_lists_and_any() -> None:
    env = gym.make("AgentRL/SMTP-v0", mail_domains=["partner.example"])
    assert send(env, "a@partner.example")["tool_result"]["ok"] is True
    env.close()
    env = gym.make("AgentRL/SMTP-v0", mail_domains=None)
    assert send(env, "a@anywhere.example")["tool_result"]["ok"] is True
    env.close()


@pytest.mark.parametrize("bad", ["everyone", [""], [3], 5])
def test_bad_mail_domains(bad: object) -> None:
    with pytest.raises(ConfigError):
        gym.make("AgentRL/SMTP-v0", mail_domains=bad)


def test_oracle_unaffected() -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1")
    agent = OracleAgent(env)
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(agent.act(obs, info))
            done = term or trunc
        assert info["success"]
    env.close()
