"""Parsing of text actions into tool calls.

One tool call per action, in any of the conventions LLMs are trained on (``ToolCall.form`` and
``info["call_format"]`` say which one was used):

- ``"hermes"``: Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, free text
  around it allowed (the tags may also hold either of the two forms below);
- ``"json"``: the same object bare, optionally inside a Markdown code fence;
- ``"openai"``: OpenAI's tool-call object ``{"type": "function", "function": {"name": ..., "arguments": ...}}``
  (``id`` allowed);
- ``"llama3"``: Llama 3's JSON form ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``.

``arguments`` (or ``parameters``) may be an object or a JSON string holding one, as OpenAI-style APIs
send it. Several calls in one turn (two ``<tool_call>`` blocks, two objects, a JSON array of calls) are
refused with the ``multiple_calls`` code: make one call, read its result, then make the next.

Any string parses to either a :class:`ToolCall` or an :class:`~agentrl_envs.errors.ActionError`
that says what was wrong; nothing else escapes. JSON nested deeper than
:data:`~agentrl_envs.tools.base.MAX_NESTING` levels is refused (``too_deep``) from a scan of the text,
before ``json.loads`` or any other recursive walk sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl_envs.errors import ActionError
from agentrl_envs.tools import TOOLS, Tool
from agentrl_envs.tools.base import MAX_NESTING

__all__ = ["CALL_FORMATS", "MAX_ACTION_CHARS", "ToolCall", "format_call", "format_native_call", "parse_action"]

MAX_ACTION_CHARS = 200_000

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"

#: The values of ``ToolCall.form`` (and ``info["call_format"]``, which is ``"none"`` when no call parsed).
CALL_FORMATS = ("hermes", "json", "openai", "llama3")


@dataclass(frozen=True)
class ToolCall:
    """A parsed action: the tool's name, its validated arguments and the convention it came in.

    ``form`` (one of :data:`CALL_FORMATS`) is not part of equality: the same call in two conventions
    is the same call.
    """

    name: str
    arguments: dict[str, Any]
    form: str = field(default="json", compare=False)


def format_call(name: str, arguments: Mapping[str, Any], *, default: Callable[[Any], Any] | None = None) -> str:
    """The canonical text of a call, as the oracle, the candidates and the TRL glue write it.

    :func:`parse_action` reads it back as exactly this call, whatever text the arguments hold
    (``<tool_call>``, ``</tool_call>``, ``<|python_tag|>`` included).

    Args:
        name: the tool.
        arguments: JSON values.
        default: ``json.dumps``'s hook for values that are not JSON types (the TRL glue's numpy values).

    Raises:
        TypeError, ValueError, RecursionError: as ``json.dumps`` for a value JSON cannot hold.
    """
    text = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False, default=default)
    # The markers can only occur inside JSON strings; escaping their '<' keeps a '<tool_call>' in an
    # argument from being read as a second call.
    text = text.replace(_OPEN, "\\u003c" + _OPEN[1:]).replace(_CLOSE, "\\u003c" + _CLOSE[1:])
    return _OPEN + text + _CLOSE


def format_native_call(name: str, arguments: Any) -> str:
    """The env action for one native (OpenAI-style) tool call, whatever the model put in ``arguments``.

    Arguments that are (or decode to) a JSON object are written canonically with :func:`format_call`;
    ``None`` or blank text counts as ``{}``; anything else (text that is not JSON, a list, a number) is
    passed on as written, so the env rejects it with its reason (``bad_json``, ``bad_arguments``) and
    the format penalty instead of the caller raising. The OpenAI-compatible agent and the verifiers
    harness both send native calls through here.
    """
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            arguments = decoded
    if isinstance(arguments, dict):
        return format_call(name, arguments)
    # Same escaping as format_call: a '<tool_call>' inside a string must not read as a second call.
    text = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return _OPEN + text.replace(_OPEN, "\\u003c" + _OPEN[1:]).replace(_CLOSE, "\\u003c" + _CLOSE[1:]) + _CLOSE


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
    payload, tagged = _extract(action)
    obj = _loads(payload)
    if isinstance(obj, list) and len(obj) > 1 and all(isinstance(o, dict) for o in obj):
        raise ActionError("multiple_calls", f"found a JSON array of {len(obj)} calls; send one call per turn")
    if not isinstance(obj, dict):
        raise ActionError("not_an_object", f"the tool call must be a JSON object, got {_kind(obj)}")
    name, arguments, form = _unwrap(obj)
    if not isinstance(name, str):
        raise ActionError("bad_call", "the call needs a string 'name'")
    if name not in available:
        raise ActionError("unknown_tool", f"unknown tool {name[:60]!r}; available tools: {', '.join(available)}")
    if isinstance(arguments, str):
        arguments = _loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        key = "parameters" if form == "llama3" else "arguments"
        raise ActionError("bad_arguments", f"{key!r} must be a JSON object, got {_kind(arguments)}")
    if form == "json" and tagged:
        form = "hermes"
    return ToolCall(name, available[name].validate(arguments), form)


def _unwrap(obj: dict[str, Any]) -> tuple[Any, Any, str]:
    """(name, arguments, form) of a call object in any accepted convention; ActionError otherwise."""
    if "function" in obj:
        _only(obj, {"type", "function", "id"}, "an OpenAI tool call has 'type', 'function' and 'id'")
        if obj.get("type", "function") != "function":
            raise ActionError("bad_call", f"'type' must be 'function', got {str(obj.get('type'))[:40]!r}")
        function = obj["function"]
        if not isinstance(function, dict):
            raise ActionError("bad_call", f"'function' must be an object with 'name' and 'arguments', got {_kind(function)}")
        _only(function, {"name", "arguments"}, "'function' has 'name' and 'arguments'")
        return function.get("name"), function.get("arguments", {}), "openai"
    if "parameters" in obj:
        _only(obj, {"name", "parameters", "type"}, "a Llama 3 call has 'name' and 'parameters'")
        if obj.get("type", "function") != "function":
            raise ActionError("bad_call", f"'type' must be 'function', got {str(obj.get('type'))[:40]!r}")
        return obj.get("name"), obj["parameters"], "llama3"
    _only(obj, {"name", "arguments", "id", "type"}, "a call has 'name' and 'arguments'")
    return obj.get("name"), obj.get("arguments", {}), "json"


def _only(obj: dict[str, Any], allowed: set[str], hint: str) -> None:
    unknown = set(obj) - allowed
    if unknown:
        shown = sorted(str(k)[:40] for k in unknown)[:5]
        raise ActionError("bad_call", f"unexpected key(s) {shown}; {hint}")


def _extract(action: str) -> tuple[str, bool]:
    """The JSON text of the call, and whether it sat inside <tool_call> tags."""
    count = action.count(_OPEN)
    if count > 1:
        raise ActionError("multiple_calls", f"found {count} <tool_call> blocks; send one call per action")
    if count == 1:
        start = action.index(_OPEN) + len(_OPEN)
        end = action.find(_CLOSE, start)
        return (action[start:] if end < 0 else action[start:end]), True
    if _CLOSE in action:
        raise ActionError("no_call", "found </tool_call> without <tool_call>")
    text = _unfence(action.strip())
    if text.startswith(_PYTHON_TAG):
        text = text[len(_PYTHON_TAG) :].strip()
    if not text:
        raise ActionError("no_call", "the action is empty; send one tool call")
    if text.startswith("[") and _is_call_array(text):
        raise ActionError("multiple_calls", "found a JSON array of several calls; send one call per turn")
    if not text.startswith("{"):
        raise ActionError(
            "no_call",
            'no tool call found; write <tool_call>{"name": "...", "arguments": {...}}</tool_call> or a bare JSON object',
        )
    return text, False


def _is_call_array(text: str) -> bool:
    if _too_deep(text):
        return False  # _loads says so
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, list) and len(value) > 1 and all(isinstance(v, dict) for v in value)


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
    if _too_deep(text):
        raise ActionError("too_deep", f"the JSON nests deeper than {MAX_NESTING} levels; tool calls need a few")
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


_JSON_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def _too_deep(text: str) -> bool:
    """True if the JSON ``text`` opens more than :data:`MAX_NESTING` arrays or objects at once.

    Linear, without recursion: only brackets outside strings count. Text that is not JSON may count
    wrong past its first error, where ``json.loads`` stops anyway.
    """
    if text.count("[") + text.count("{") <= MAX_NESTING:  # the usual call: nothing to scan
        return False
    depth, in_string, escaped_at = 0, False, -1
    for match in _JSON_STRUCTURE.finditer(text):
        at, char = match.start(), match.group()
        if at == escaped_at:
            continue
        if in_string:
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )
