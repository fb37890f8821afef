"""OpenAI's chat completion request and reply, as ``agentrl-train serve`` reads and writes them (no model here).

A request's messages become the ``role``/``content`` a chat template renders (:func:`flatten`: the
``<tool_call>`` tags the server writes are :class:`~agentrl_train.serve.prompts.Markup`, the client's
strings stay text), and a reply that holds one call of a requested tool comes back as ``tool_calls``
(:func:`reply`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl_envs.core.actions import ActionError, format_call, parse_action
from agentrl_train.serve.limits import ServeLimits
from agentrl_train.serve.prompts import Markup
from agentrl_train.serve.wire import HTTPError, load_json, text_chars, validate

__all__ = ["CONVERSATION_HEADERS", "ChatRequest", "flatten", "parse_chat", "reply"]

MAX_SEED = 2**63 - 1
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"  # the tags format_call writes around a call
CONVERSATION_HEADERS = ("x-episode-id", "x-conversation-id")


class _Function(BaseModel):
    name: str = Field(max_length=200)
    arguments: str | dict[str, Any] | None = None


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = Field(default=None, max_length=200)
    type: Literal["function"] = "function"
    function: _Function


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=200)


class ChatRequest(BaseModel):
    """The fields of a chat completion request this server reads (others are ignored, as OpenAI's are optional)."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=200)
    messages: list[_Message] = Field(min_length=1)  # the count is ServeLimits.max_messages, checked before this
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=256)
    # strict: true, "0.5" or 1.0 are refused by name, not coerced (a bool seed was seed 1, "no" was stream=False)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, strict=True)
    max_tokens: int | None = Field(default=None, ge=1, le=32768, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768, strict=True)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, strict=True)  # torch's generator takes 64 bits
    n: int = Field(default=1, ge=1, le=1, strict=True)
    stream: bool = Field(default=False, strict=True)


class _AnyArguments:
    """A stand-in tool for parsing replies: the request's tool names, arguments not checked here."""

    @staticmethod
    def validate(arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments


def parse_chat(body: bytes, lim: ServeLimits) -> ChatRequest:
    """The chat request, its size checked against ``lim`` before pydantic or a tokenizer sees it."""
    data = load_json(body)
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > lim.max_messages:
        raise HTTPError(
            413,
            f"the request has {len(messages)} messages; the limit is {lim.max_messages} (--max-messages): "
            "send the recent turns only",
        )
    chars = text_chars(messages) + text_chars(data.get("tools"))
    if chars > lim.max_prompt_chars:
        raise HTTPError(
            413,
            f"the request's messages and tools hold {chars} characters; the limit is {lim.max_prompt_chars} "
            "(--max-prompt-chars): send the recent turns only",
        )
    return validate(ChatRequest, data)


def flatten(m: _Message) -> dict[str, Any]:
    """One OpenAI message as the ``role``/``content`` a chat template renders.

    ``content`` is a list: the client's strings, and the ``<tool_call>`` tags the server writes around a
    call (:class:`~agentrl_train.serve.prompts.Markup`, the only text whose special tokens stay special).
    """
    text = (
        m.content if isinstance(m.content, str) else "".join(p["text"] for p in m.content or [] if isinstance(p.get("text"), str))
    )
    content: list[str] = [text]
    if m.role == "assistant" and m.tool_calls:
        for c in m.tool_calls:
            args = c.function.arguments
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    pass
            if isinstance(args, dict):
                call = format_call(c.function.name, args)
                content += [Markup(_OPEN), call[len(_OPEN) : -len(_CLOSE)], Markup(_CLOSE)]
            else:  # not a call the parser would read back: plain text, as before
                content.append(json.dumps({"name": c.function.name, "arguments": args}))
    return {"role": "system" if m.role == "developer" else m.role, "content": content}


def reply(text: str, finish: str, tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], str, bool]:
    """The assistant message for generated text: ``tool_calls`` when it holds one call of a requested tool."""
    functions = [t["function"] for t in tools or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    names = {f.get("name") for f in functions if isinstance(f.get("name"), str)}  # a dict "name" names no tool
    if names:
        try:
            call = parse_action(text, {n: _AnyArguments() for n in names})  # type: ignore[misc]
        except ActionError:
            pass
        else:
            tool_call = {
                "id": f"call_{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            return {"role": "assistant", "content": None, "tool_calls": [tool_call]}, "tool_calls", True
    return {"role": "assistant", "content": text}, finish, False
