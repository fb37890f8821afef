"""Deeply nested tool arguments: one depth limit, checked first; a format error, never an exception.

Issue #33 (finding 7): arguments nested 500-980 deep passed ``json.loads`` and then overflowed the
stack in the lone-surrogate check (RecursionError out of ``env.step``, every env).
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl_envs.core.actions import _too_deep, parse_action
from agentrl_envs.errors import ActionError
from agentrl_envs.tools import TOOLS
from agentrl_envs.tools.base import MAX_NESTING, check_arguments, nested_deeper_than
from tests.conftest import ENV_IDS

DEPTHS = (MAX_NESTING + 1, 100, 500, 800, 980, 1000, 5000)


def nested_text(kind: str, depth: int) -> str:
    """JSON text of a list (``[[..."x"..]]``) or dict (``{"a": {...}}``) ``depth`` levels deep."""
    if kind == "list":
        return "[" * depth + '"x"' + "]" * depth
    return '{"a": ' * depth + '"x"' + "}" * depth


def action(form: str, tool: str, key: str, value: str) -> str:
    call = '{"name": "%s", "arguments": {"%s": %s}}' % (tool, key, value)  # noqa: UP031 - value is raw JSON text
    if form == "hermes":
        return f"<tool_call>{call}</tool_call>"
    if form == "openai_string":  # arguments as a JSON string, as OpenAI sends them
        return json.dumps({"type": "function", "function": {"name": tool, "arguments": '{"%s": %s}' % (key, value)}})  # noqa: UP031
    return call


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_env_answers_deep_arguments_with_a_format_error(env_id: str) -> None:
    env = gym.make(env_id, max_steps=10_000)
    try:
        env.reset(seed=0)
        tools = env.unwrapped.tools  # type: ignore[attr-defined]
        for name, tool in tools.items():
            key = next(iter(tool.parameters["properties"]))
            for form in ("json", "hermes", "openai_string"):
                for kind in ("list", "dict"):
                    for depth in DEPTHS:
                        text = action(form, name, key, nested_text(kind, depth))
                        observation, reward, terminated, truncated, info = env.step(text)
                        where = f"{name} {form} {kind} {depth}"
                        assert observation.startswith("action error [too_deep]"), where
                        assert info["reward_components"]["format"] < 0, where
                        assert not terminated and not truncated, where
    finally:
        env.close()


@pytest.mark.parametrize("form", ["json", "hermes"])
def test_the_limit_counts_the_call_object(form: str) -> None:
    http = {"method": "POST", "path": "/v1/tickets"}
    # The call object is level 1, its arguments level 2, the body level 3: MAX_NESTING - 3 more levels fit.
    for body_depth, ok in ((MAX_NESTING - 2, True), (MAX_NESTING - 1, False)):
        body = nested_text("dict", body_depth)
        text = action(form, "http", "body", body).replace('{"body"', '{"method": "POST", "path": "/v1/tickets", "body"')
        if ok:
            call = parse_action(text)
            assert call.arguments["method"] == http["method"]
        else:
            with pytest.raises(ActionError) as err:
                parse_action(text)
            assert err.value.code == "too_deep"
            assert str(MAX_NESTING) in err.value.message


def test_brackets_inside_strings_do_not_count() -> None:
    for query in ("[" * 5000, "{" * 5000, '\\"' + "[" * 5000, "\\\\" + "{" * 3000 + "]" * 9000):
        text = json.dumps({"name": "sql", "arguments": {"query": query}})
        assert parse_action(text).arguments["query"] == query


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 500, 990, 5000, 100_000])
def test_check_arguments_refuses_deep_values_without_recursing(depth: int) -> None:
    value: Any = "x"
    for _ in range(depth):  # built without recursion; json.dumps could not write it
        value = {"a": value}
    parameters = TOOLS["http"].parameters
    with pytest.raises(ActionError) as err:
        check_arguments("http", parameters, {"method": "POST", "path": "/x", "body": value})
    assert err.value.code == "too_deep"


def test_circular_values_are_refused_as_too_deep() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert nested_deeper_than(loop, MAX_NESTING)
    with pytest.raises(ActionError):
        check_arguments("http", TOOLS["http"].parameters, {"method": "POST", "path": "/x", "body": {"a": loop}})


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ax\n'), max_size=8)
_JSON = st.recursive(
    st.none() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=200,
)


@given(_JSON, st.integers(0, MAX_NESTING + 5))
def test_the_text_scan_agrees_with_the_parsed_depth(value: Any, wrap: int) -> None:
    for _ in range(wrap):
        value = [value]
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert _too_deep(text) == (_depth(value) > MAX_NESTING)
        assert nested_deeper_than(value, MAX_NESTING) == (_depth(value) > MAX_NESTING)
