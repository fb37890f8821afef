"""A scripted OpenAI-compatible model that answers with the oracle's next tool call, for chat integrations.

The verifiers example and tests point verifiers' eval at it: ``POST /v1/chat/completions`` reads the
conversation, finds the episode by its instruction (the first user message) among the seeds it was
given, replays the assistant turns so far in a fresh env of that seed and answers with the oracle's
next call as a native ``tool_calls`` entry. Holding no state between requests, it serves any number of
concurrent rollouts in any order; envs are deterministic per seed, so the replayed episode is the
client's, faults included. An instruction it does not know gets a 400 that says which seeds it knows.

:func:`transcript_actions` turns a chat transcript into the env actions it played, the same way the
verifiers harness and :class:`~agentrl_envs.agents.openai_chat.OpenAIChatAgent` do; tests replay those
actions through ``gym.make`` to compare rewards.

Nothing here imports a framework; :func:`~agentrl_envs.testing.serve_in_thread` serves the app.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gymnasium as gym

from agentrl_envs.core.actions import format_native_call

__all__ = ["OracleChat", "transcript_actions"]


def transcript_actions(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """The env action of each assistant message: its native calls' text joined, else its content."""
    actions = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)]
        if calls:
            actions.append(
                "".join(format_native_call(str(c["function"].get("name")), c["function"].get("arguments")) for c in calls)
            )
        else:
            content = message.get("content")
            actions.append(content if isinstance(content, str) else "")
    return actions


class OracleChat:
    """The oracle of ``env_id`` behind a chat-completions ASGI app (:meth:`app`).

    Args:
        env_id: the env the clients play.
        seeds: the episodes it may be asked about.
        **make_kwargs: ``gym.make`` keyword arguments (``split``, ``error_profile``, ...), as the clients'.
    """

    def __init__(self, env_id: str, seeds: Iterable[int], **make_kwargs: Any) -> None:
        self.env_id, self.make_kwargs = env_id, dict(make_kwargs)
        self.requests = 0
        env = gym.make(env_id, **make_kwargs)
        try:
            self.seeds = {str(env.reset(seed=seed)[0]): seed for seed in seeds}
        finally:
            env.close()

    def answer(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """The status and JSON body for one chat-completions request."""
        self.requests += 1
        messages = body.get("messages") if isinstance(body, Mapping) else None
        users = [m.get("content") for m in messages or [] if isinstance(m, Mapping) and m.get("role") == "user"]
        seed = self.seeds.get(str(users[0])) if users else None
        if seed is None:
            return 400, {
                "error": {"message": f"no episode of {self.env_id} with this instruction; seeds {sorted(self.seeds.values())}"}
            }
        env = gym.make(self.env_id, **self.make_kwargs)
        try:
            env.reset(seed=seed)
            for action in transcript_actions(messages or []):
                env.step(action)
            call = json.loads(env.unwrapped.oracle_action().removeprefix("<tool_call>").removesuffix("</tool_call>"))  # type: ignore[attr-defined]
        finally:
            env.close()
        tool_call = {
            "id": f"call_{seed}_{self.requests}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]},
            "finish_reason": "tool_calls",
        }
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return 200, {
            "id": f"chatcmpl-{self.requests}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "oracle"),
            "choices": [choice],
            "usage": usage,
        }

    def app(self) -> Callable[..., Any]:
        """A plain ASGI app: ``POST /v1/chat/completions`` and ``GET /health``."""

        async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
            if scope["type"] != "http":
                return
            chunks = []
            while True:
                event = await receive()
                chunks.append(event.get("body", b""))
                if not event.get("more_body"):
                    break
            answer: dict[str, Any] = {"error": {"message": f"no route {scope['method']} {scope['path']}"}}
            status = 404
            if scope["method"] == "GET" and scope["path"] == "/health":
                status, answer = 200, {"ok": True}
            elif scope["method"] == "POST" and scope["path"] == "/v1/chat/completions":
                try:
                    body = json.loads(b"".join(chunks))
                except ValueError:
                    body = None
                status, answer = (
                    self.answer(body) if isinstance(body, dict) else (400, {"error": {"message": "not a JSON object"}})
                )
            data = json.dumps(answer).encode()
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})

        return app
