"""Parsing of text actions into tool calls.

Grammar: one tool call per action, either in Hermes/Qwen form
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (free text around it is allowed) or a
bare JSON object with the same keys (optionally inside a Markdown code fence). ``arguments`` may also
be a JSON string holding the object, as OpenAI-style APIs send it.

Any string parses to either a :class:`ToolCall` or an :class:`~agentrl_envs.errors.ActionError`
that says what was wrong; nothing else escapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrl_envs.errors import ActionError
from agentrl_envs.tools import TOOLS, Tool

__all__ = ["MAX_ACTION_CHARS", "ToolCall", "format_call", "parse_action"]

MAX_ACTION_CHARS = 200_000

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A parsed action: the tool's name and its validated arguments."""

    name: str
    arguments: dict[str, Any]


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The canonical text of a call, as the oracle and the candidates write it."""
    text = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    # The markers can only occur inside JSON strings; escaping their '<' keeps a '<tool_call>' in an
    # argument from being read as a second call.
    text = text.replace(_OPEN, "\\u003c" + _OPEN[1:]).replace(_CLOSE, "\\u003c" + _CLOSE[1:])
    return _OPEN + text + _CLOSE


def parse_action(action: str, tools: Mapping[str, Tool] | None = None) -> ToolCall:
    """Parse one action string.

    Args:
        action: the agent's text.
        tools: tools available in this env (default: all).

    Raises:
        TypeError: ``action`` is not a ``str`` (a programming error, not an agent mistake).
        ActionError: the text is not exactly one well-formed call of an available tool.
    """
    if not isinstance(action, str):
        raise TypeError(f"an action must be a str, got {type(action).__name__}")
    available = TOOLS if tools is None else tools
    if len(action) > MAX_ACTION_CHARS:
        raise ActionError("too_long", f"the action is {len(action)} characters; the limit is {MAX_ACTION_CHARS}")
    payload = _extract(action)
    obj = _loads(payload)
    if not isinstance(obj, dict):
        raise ActionError("not_an_object", f"the tool call must be a JSON object, got {_kind(obj)}")
    unknown = set(obj) - {"name", "arguments", "id", "type"}
    if unknown:
        shown = sorted(str(k)[:40] for k in unknown)[:5]
        raise ActionError("bad_call", f"unexpected key(s) {shown}; a call has 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str):
        raise ActionError("bad_call", "the call needs a string 'name'")
    if name not in available:
        raise ActionError("unknown_tool", f"unknown tool {name[:60]!r}; available tools: {', '.join(available)}")
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        arguments = _loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ActionError("bad_arguments", f"'arguments' must be a JSON object, got {_kind(arguments)}")
    return ToolCall(name, available[name].validate(arguments))


def _extract(action: str) -> str:
    count = action.count(_OPEN)
    if count > 1:
        raise ActionError("multiple_calls", f"found {count} <tool_call> blocks; send one call per action")
    if count == 1:
        start = action.index(_OPEN) + len(_OPEN)
        end = action.find(_CLOSE, start)
        return action[start:] if end < 0 else action[start:end]
    if _CLOSE in action:
        raise ActionError("no_call", "found </tool_call> without <tool_call>")
    text = _unfence(action.strip())
    if not text:
        raise ActionError("no_call", "the action is empty; send one tool call")
    if not text.startswith("{"):
        raise ActionError(
            "no_call",
            'no tool call found; write <tool_call>{"name": "...", "arguments": {...}}</tool_call> or a bare JSON object',
        )
    return text


def _unfence(text: str) -> str:
    """The inside of a Markdown code fence (```json ... ```), or the text as it is. Linear time."""
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        inner = text[3:-3]
        first, newline, rest = inner.partition("\n")
        if newline and (not first.strip() or first.strip().isalnum()):
            inner = rest
        return inner.strip()
    return text


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ActionError("too_deep", "the JSON is nested too deeply") from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise ActionError("multiple_calls", "extra text after the JSON object; send one call per action") from None
        raise ActionError("bad_json", f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, UnicodeError) as exc:
        raise ActionError("bad_json", f"invalid JSON: {exc}") from None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )
