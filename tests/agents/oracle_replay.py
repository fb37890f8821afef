"""A fake OpenAI-compatible model that answers with the oracle's next action.

It keeps a mirror env of its own: each new ``x-episode-id`` resets the mirror with the next seed, and
each answer is also stepped in the mirror. Envs are deterministic per seed, so the client's env sees
what the mirror sees, and every request is checked against it: the first messages must be the mirror's
system prompt and instruction, each later tool result must be the mirror's observation with the id
of the call it answers. What does not match goes into ``problems``.

The same :meth:`OracleReplay.answer` serves a respx side effect and a real ASGI app (:func:`asgi_app`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import httpx

import agentrl_envs  # noqa: F401
from agentrl_envs.agents import OracleAgent
from agentrl_envs.testing import serve_in_thread

__all__ = ["OracleReplay", "asgi_app", "serve_in_thread"]


class OracleReplay:
    """Answers chat completions with the oracle's actions, native ``tool_calls`` or ``<tool_call>`` text."""

    def __init__(self, env_id: str, split: str = "train", first_seed: int = 0, native: bool = True, **make: Any) -> None:
        self.env = gym.make(env_id, split=split, **make)
        self.oracle = OracleAgent(self.env)
        self.native = native
        self.next_seed = first_seed
        self.episode: str | None = None
        self.episodes: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.feedback: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self._obs = ""
        self._info: dict[str, Any] = {}
        self._last_ids: list[str] = []
        self._calls = 0

    def close(self) -> None:
        self.env.close()

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        self.bodies.append(body)
        self.headers.append(headers)
        messages = body["messages"]
        episode = headers.get("x-episode-id", "")
        if episode != self.episode:
            self.episode = episode
            self.episodes.append(episode)
            self._obs, self._info = self.env.reset(seed=self.next_seed)
            self.next_seed += 1
            expected = [
                {"role": "system", "content": self._info["system_prompt"]},
                {"role": "user", "content": self._obs},
            ]
            if messages != expected:
                self.problems.append(f"episode {episode}: first messages {str(messages)[:300]}")
            if body.get("tools") != self._info["tools"]:
                self.problems.append(f"episode {episode}: tools differ")
        else:
            results = messages[-len(self._last_ids) :] if self._last_ids else messages[-1:]
            for i, message in enumerate(results):
                want: dict[str, Any] = {"role": "tool" if self._last_ids else "user", "content": self._obs}
                if self._last_ids:
                    want["tool_call_id"] = self._last_ids[i]
                if message != want:
                    self.problems.append(f"episode {episode}: result {str(message)[:300]} != {str(want)[:300]}")
        action = self.oracle.act(self._obs, self._info)
        self._obs, _, terminated, truncated, self._info = self.env.step(action)
        call = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        self._calls += 1
        if self.native:
            call_id = f"call_{len(self.episodes)}_{self._calls}"
            self._last_ids = [call_id]
            arguments = json.dumps(call["arguments"])
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": arguments}}],
            }
            finish = "tool_calls"
        else:
            self._last_ids = []
            message, finish = {"role": "assistant", "content": action}, "stop"
        return {
            "id": f"chatcmpl-{self._calls}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def respx_side_effect(self) -> Callable[[httpx.Request], httpx.Response]:
        def side_effect(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json=self.answer(json.loads(request.content), dict(request.headers)))

        return side_effect


def asgi_app(replay: OracleReplay) -> Callable[..., Any]:
    """A plain ASGI app: POST /v1/chat/completions, POST /v1/feedback, GET /health."""

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path, method = scope["path"], scope["method"]
        status, answer = 404, {"error": {"message": f"no route {method} {path}"}}
        if method == "GET" and path == "/health":
            status, answer = 200, {"ok": True}
        elif method == "POST" and path == "/v1/chat/completions":
            status, answer = 200, replay.answer(json.loads(b"".join(chunks)), headers)
        elif method == "POST" and path == "/v1/feedback":
            replay.feedback.append(json.loads(b"".join(chunks)))
            status, answer = 200, {"ok": True}
        data = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    return app
