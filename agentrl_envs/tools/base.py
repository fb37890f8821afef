"""The Tool protocol: what a tool is to the env (schema, argument checks, observation text)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.errors import ActionError

__all__ = ["Tool", "check_arguments"]

# Python types allowed for each JSON-schema type used by the tools.
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "array": (list,), "object": (dict,)}


@dataclass(frozen=True)
class Tool:
    """Base class of the tools. Subclasses set ``name``, ``description`` and ``parameters``.

    ``parameters`` is a JSON schema object (``properties``, ``required``) as in OpenAI function
    calling; :meth:`schema` returns the function-calling entry, usable with
    ``tokenizer.apply_chat_template(tools=...)``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    def schema(self, facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The function-calling entry; ``facts`` are what the backend reports (``{"numpy": True}``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.describe(facts or {}), "parameters": self.parameters},
        }

    def describe(self, facts: Mapping[str, Any]) -> str:
        """The description the agent sees, given the backend's ``facts`` (default: ``description``)."""
        return self.description

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check argument names and types; return the arguments to send (raise ActionError)."""
        return check_arguments(self.name, self.parameters, arguments)

    def render(self, response: ToolResponse) -> str:
        """The observation text of a response."""
        if response.ok:
            return f"{self.name} ok"
        return render_error(self.name, response)


def render_error(tool: str, response: ToolResponse) -> str:
    return f"{tool} error [{response.error_type}, status {response.status}]: {response.error}"


def check_arguments(tool: str, parameters: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = parameters.get("properties", {})
    required: list[str] = parameters.get("required", [])
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:5])
        raise ActionError("bad_arguments", f"{tool}: unknown argument(s) {shown}; expected {sorted(props)}")
    missing = [r for r in required if r not in arguments]
    if missing:
        raise ActionError("bad_arguments", f"{tool}: missing required argument(s) {missing}")
    for key, value in arguments.items():
        spec = props[key]
        if _has_surrogate(value):
            raise ActionError(
                "bad_arguments",
                f"{tool}: argument {key!r} holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
            )
        allowed = spec.get("type")
        kinds = allowed if isinstance(allowed, list) else [allowed]
        if not any(_matches(kind, spec, value) for kind in kinds):
            want = " or ".join(_describe(k, spec) for k in kinds)
            raise ActionError("bad_arguments", f"{tool}: argument {key!r} must be {want}, got {type(value).__name__}")
    return arguments


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _matches(kind: str, spec: dict[str, Any], value: Any) -> bool:
    if kind == "array":
        item_kind = spec.get("items", {}).get("type", "string")
        return isinstance(value, list) and all(isinstance(v, _JSON_TYPES[item_kind]) for v in value)
    return isinstance(value, _JSON_TYPES[kind])


def _describe(kind: str, spec: dict[str, Any]) -> str:
    if kind == "array":
        return f"a list of {spec.get('items', {}).get('type', 'string')}s"
    return f"a {kind}"
