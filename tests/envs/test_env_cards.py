"""Every registered id has an env card of its own that documents what ``gym.make`` and ``info`` really take and give.

The arguments come from the env class's ``__init__`` signature (and the id's registered kwargs), the
``info`` keys from one oracle episode, so a new keyword, a new info key or a new env id without a
card fails here with a message that names the card and what it is missing.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Collection
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.envs.registration import load_env_creator

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.env import ToolUseEnv
from agentrl_envs.core.registered_envs import SQLEnv
from agentrl_envs.rewards import COMPONENTS

SECTIONS = (
    "Description",
    "Action Space",
    "Observation Space",
    "Rewards",
    "Episode End",
    "Arguments",
    "Version History",
)
#: Every id the package registers: ENV_IDS, EARLIER_IDS and anything else in the AgentRL namespace.
REGISTERED = sorted(
    set(agentrl_envs.ENV_IDS) | set(agentrl_envs.EARLIER_IDS) | {i for i, s in gym.registry.items() if s.namespace == "AgentRL"}
)


def sections(card: str) -> dict[str, str]:
    """The card's ``## Heading`` sections by heading."""
    parts = re.split(r"^\s*## (.+?)\s*$", card, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def keywords(env_id: str, cls: type) -> list[str]:
    """The ``gym.make`` keywords of ``env_id``: its ``__init__`` parameters and its registered kwargs.

    An ``__init__`` that takes ``**kwargs`` passes them on, so the next ``__init__`` up the MRO counts too.
    """
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in klass.__dict__ or klass is object:
            continue
        params = inspect.signature(klass.__dict__["__init__"]).parameters.values()
        names += [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    names = list(dict.fromkeys(names))
    spec = gym.registry.get(env_id)
    return names + [k for k in (spec.kwargs if spec else {}) if k not in names]


def card_problems(env_id: str, cls: type, info_keys: Collection[str] = (), tool_result_keys: Collection[str] = ()) -> list[str]:
    """What the env card of ``cls`` (registered as ``env_id``) fails to say; empty when it is complete."""
    where = f"{env_id} ({cls.__module__}.{cls.__qualname__})"
    card = cls.__dict__.get("__doc__") or ""
    if not card.strip():
        return [f"{where} has no env card of its own: give the class a docstring with the sections {', '.join(SECTIONS)}"]
    problems = []
    found = sections(card)
    problems += [f"{where}: the env card has no '## {s}' section" for s in SECTIONS if s not in found]
    if f"``{env_id}``" not in card.split("\n", 1)[0]:
        problems.append(f"{where}: the env card's first line must name its id as ``{env_id}``")
    arguments = found.get("Arguments", "")
    missing = [k for k in keywords(env_id, cls) if f"``{k}``" not in arguments]
    if missing:
        problems.append(
            f"{where}: gym.make keyword(s) {', '.join(missing)} not documented under '## Arguments' of the env card "
            "(name each as ``name`` and say what it does in this env, or that it has no effect here)"
        )
    observation = found.get("Observation Space", "")
    missing = sorted(k for k in {*info_keys, *COMPONENTS} if f"``{k}``" not in observation)
    if missing:
        problems.append(f"{where}: info key(s) {', '.join(missing)} not documented under '## Observation Space'")
    missing = sorted(k for k in tool_result_keys if f"``{k}``" not in observation)
    if missing:
        problems.append(f"{where}: info['tool_result'] key(s) {', '.join(missing)} not documented under '## Observation Space'")
    version = env_id.rsplit("-", 1)[-1]
    if not re.search(rf"^\s*- {re.escape(version)}:", found.get("Version History", ""), re.M):
        problems.append(f"{where}: '## Version History' has no '- {version}: ...' entry")
    stale = re.findall(r"[Ii]ssue #\d+", card)
    if stale:
        problems.append(f"{where}: the env card points at {', '.join(stale)}; say what the env does now instead")
    return problems


def episode_keys(env_id: str) -> tuple[set[str], set[str]]:
    """(info keys, tool_result keys) seen over one oracle episode with candidates on."""
    env = gym.make(env_id, candidates=2)
    agent = OracleAgent(env)
    obs, info = env.reset(seed=0)
    keys, results = set(info), set(info["tool_result"])
    done = False
    while not done:
        obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
        keys |= set(info)
        results |= set(info["tool_result"])
        done = terminated or truncated
    env.close()
    return keys, results


def test_every_agentrl_id_is_in_env_ids() -> None:
    assert set(REGISTERED) == set(agentrl_envs.ENV_IDS) | set(agentrl_envs.EARLIER_IDS), (
        "register new ids through agentrl_envs.ENV_IDS"
    )
    assert not set(agentrl_envs.ENV_IDS) & set(agentrl_envs.EARLIER_IDS)


@pytest.mark.parametrize("env_id", REGISTERED)
def test_env_card_documents_arguments_info_keys_and_history(env_id: str) -> None:
    cls = load_env_creator(gym.spec(env_id).entry_point)
    assert isinstance(cls, type) and issubclass(cls, ToolUseEnv), f"{env_id}: entry point is not a ToolUseEnv class"
    info_keys, tool_result_keys = episode_keys(env_id)
    problems = card_problems(env_id, cls, info_keys, tool_result_keys)
    assert not problems, "\n".join(problems)


def test_the_check_names_what_a_card_misses() -> None:
    """A card missing a keyword, an info key, a history entry or a card at all is reported by name."""

    class Undocumented(ToolUseEnv):
        def __init__(self, shiny: int = 0, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    Undocumented.__doc__ = (SQLEnv.__doc__ or "").replace("``mail_domains``", "mail_domains").replace("- v0:", "- v1:")
    problems = card_problems("AgentRL/SQL-v0", Undocumented, {"call_format", "brand_new_key"}, {"row_count", "latency"})
    text = "\n".join(problems)
    assert "keyword(s) shiny, mail_domains not documented" in text  # **kwargs passes the base class's keywords on
    assert "info key(s) brand_new_key not documented" in text
    assert "info['tool_result'] key(s) latency not documented" in text
    assert "no '- v0: ...' entry" in text
    assert len(problems) == 4

    class Glued(ToolUseEnv):
        pass

    assert card_problems("AgentRL/HTTP-v0", Glued) == [
        f"AgentRL/HTTP-v0 ({__name__}.test_the_check_names_what_a_card_misses.<locals>.Glued) has no env card of its own: "
        f"give the class a docstring with the sections {', '.join(SECTIONS)}"
    ]
    Glued.__doc__ = "``AgentRL/HTTP-v0``: ...\n\n    ## Arguments\n\n    ``split``. Faults arrive with issue #3.\n"
    text = "\n".join(card_problems("AgentRL/HTTP-v0", Glued))
    assert "no '## Description' section" in text and "points at issue #3" in text
    assert "keyword(s) domain, error_profile" in text  # the inherited ToolUseEnv signature counts
