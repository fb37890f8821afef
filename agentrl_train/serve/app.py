"""``agentrl-train serve``: an OpenAI-compatible server for trained adapters, with hot reload and canaries.

Like ``agentrl-envs serve`` it is a plain ASGI callable under uvicorn: a handful of routes with JSON
bodies, checked by pydantic. Routes:

- ``POST /v1/chat/completions``: ``model`` is an adapter name (or ``base``, or the ``--model`` value,
  for the base without adapters); ``messages`` and ``tools`` in OpenAI's format; ``temperature`` 0 is
  greedy; a ``<tool_call>`` in the reply comes back as ``tool_calls`` when the request sent ``tools``.
  The header ``x-adapter-version: NAME@VERSION`` and the body's ``system_fingerprint`` say which
  version answered; the header ``x-feedback-id`` and the body's ``feedback_id`` name the episode for
  ``POST /v1/feedback``. Sizes are bounded by :class:`~agentrl_train.serve.limits.ServeLimits` (413).
- ``POST /v1/completions``: vLLM's completions, token ids (or a string) in, ids and their log-probs out
  (:mod:`agentrl_train.serve.completions`); the rollout engine of ``--rollout-engine server``.
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format); ``HEAD`` on any route
  answers as ``GET`` does, without the body.
- ``POST /v1/feedback {"feedback_id": ..., "success": ...}``: one verdict per episode, from the
  credential the episode was served to (see :mod:`agentrl_train.serve.canary`).
- Admin: ``POST /v1/adapters/NAME {"path": DIR}`` (hot reload, see :mod:`agentrl_train.serve.engine`),
  ``POST /v1/adapters/NAME/canary {"path": DIR, "fraction": f}``, ``POST .../promote``, ``POST .../rollback``,
  ``GET /v1/adapters`` and ``GET /v1/adapters/NAME`` (names, versions and numbers; never server paths);
  vLLM's runtime LoRA routes ``POST /v1/load_lora_adapter {"lora_name": NAME, "lora_path": DIR}`` (a new
  name) and ``POST /v1/unload_lora_adapter {"lora_name": NAME}``, answered in plain text as vLLM does.

With ``--upstream URL`` the same routes sit in front of another OpenAI-compatible server (e.g. vLLM with
LoRA enabled): adapters are the upstream's model names, a canary is ``{"model": NAME, "fraction": f}``.
Whatever goes wrong upstream is a 502 ``upstream_error`` whose message names the upstream's status and
its message (``upstream URL answered 401: ...``), counted against the version asked; an answer is read
up to ``MAX_UPSTREAM_BYTES`` (32 MiB) and no further.

Access: with a bearer token every route but ``GET /health`` needs ``Authorization: Bearer <token>``;
a non-loopback bind needs a token (as for ``agentrl-envs serve``). Admin routes need the admin token
(``--admin-token``) instead; without one they answer loopback clients only (403 otherwise), so a
chat credential never changes what everyone is served. ``DIR`` is a folder under ``--adapters-root``
(relative to it, or absolute inside it after symlinks are resolved); without a root, loads over HTTP are
refused. Error messages name the folder as the client wrote it, never the server's paths. The admin
token is accepted on every route, so a client with one key for all routes (the trainer's rollout
client, ``AGENTRL_ROLLOUT_API_KEY``) sends the admin token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl_envs.core.actions import ActionError, format_call, parse_action
from agentrl_envs.errors import ConfigError
from agentrl_train.serve.canary import (
    CanaryRules,
    Decision,
    Deployment,
    EpisodeJudgedError,
    Router,
    Target,
    check_fraction,
)
from agentrl_train.serve.completions import (
    CompletionRequest,
    LoraLoad,
    LoraUnload,
    check_ids,
    completion_answer,
    completion_budget,
    prompt_of,
)
from agentrl_train.serve.limits import ServeLimits, is_loopback

__all__ = ["ChatRequest", "ServeApp"]

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_UPSTREAM_BYTES = 32 * 1024 * 1024  # an upstream's answer is read up to this, never whole past it
MAX_SEED = 2**63 - 1
#: upstream statuses passed to the client as they are: the request's own fault, or a rate limit to back off
#: from (a 502 would be retried as is); every other upstream failure is a 502
PASSED_UPSTREAM_STATUSES = (400, 413, 422, 429)
BASE_NAMES = ("base",)
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"  # the tags format_call writes around a call
VERSION_HEADER = "x-adapter-version"
FEEDBACK_HEADER = "x-feedback-id"
CONVERSATION_HEADERS = ("x-episode-id", "x-conversation-id")
_LORA_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


class HTTPError(Exception):
    """An answer other than 200: status, OpenAI-style error type and a message that says what to do."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


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


class _Feedback(BaseModel):
    model_config = ConfigDict(extra="ignore")
    feedback_id: str | None = Field(default=None, min_length=1, max_length=200)  # None: a 422 that says what to send
    episode_id: str | None = Field(default=None, max_length=200)
    success: bool = Field(strict=True)
    api_error_rate: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)
    timeout_rate: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)


class _Load(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    fraction: Any = None  # checked by check_fraction (a bool or a string is refused, not coerced)


class _AnyArguments:
    """A stand-in tool for parsing replies: the request's tool names, arguments not checked here."""

    @staticmethod
    def validate(arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments


@dataclass
class _Counters:
    swaps: int = 0
    swap_seconds_sum: float = 0.0
    swap_seconds_last: float = 0.0
    refused_loads: int = 0
    feedback: int = 0
    completions: int = 0


class ServeApp:
    """The ASGI app over an :class:`~agentrl_train.serve.engine.Engine` (or an upstream URL).

    Args:
        engine: the local model; None with ``upstream``.
        upstream: base URL of another OpenAI-compatible server; None with ``engine``.
        adapters: NAME -> folder (engine) or upstream model name (upstream), served from the start.
        rules: canary rules.
        token: bearer token; None for none.
        admin_token: bearer token of the admin routes; None: they answer loopback clients only.
        adapters_root: the folder adapters are loaded from over HTTP; None: such loads are refused.
        limits: request sizes and concurrency (:class:`~agentrl_train.serve.limits.ServeLimits`).
        max_new_tokens: default and cap of ``max_tokens`` (engine).
        log: where loads, swaps and decisions are reported.
    """

    def __init__(
        self,
        engine: Any = None,
        *,
        upstream: str | None = None,
        adapters: dict[str, str] | None = None,
        rules: CanaryRules | None = None,
        token: str | None = None,
        admin_token: str | None = None,
        adapters_root: str | Path | None = None,
        limits: ServeLimits | None = None,
        max_new_tokens: int = 256,
        seed: int = 0,
        watch: dict[str, str] | None = None,
        watch_interval_s: float = 2.0,
        log: Callable[[str], None] = print,
    ) -> None:
        if (engine is None) == (upstream is None):
            raise ConfigError("ServeApp needs exactly one of engine= (a local model) or upstream= (a server URL)")
        self.engine, self.upstream, self.token, self.log = engine, upstream, token, log
        if admin_token is not None and token is not None and hmac.compare_digest(admin_token.encode(), token.encode()):
            raise ConfigError("--admin-token is the same as --token: use another secret, or every client is an admin")
        self.admin_token = admin_token
        self.limits = limits or ServeLimits()
        self.adapters_root = Path(adapters_root).expanduser().resolve() if adapters_root is not None else None
        if self.adapters_root is not None and not self.adapters_root.is_dir():
            raise ConfigError(f"--adapters-root {str(adapters_root)[:200]!r} is not a folder; create it or point at one")
        self._encoder = ThreadPoolExecutor(self.limits.max_concurrent_encodings, thread_name_prefix="agentrl-serve-encode")
        self._encodes_waiting = 0
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens {max_new_tokens!r}: use a positive integer, e.g. 256")
        if engine is not None and max_new_tokens >= engine.max_positions:
            raise ConfigError(
                f"--max-new-tokens {max_new_tokens}: this model's context is {engine.max_positions} tokens, prompt "
                f"included; use fewer, leaving room for the conversation (e.g. {min(256, engine.max_positions // 2)})"
            )
        if isinstance(watch_interval_s, bool) or not isinstance(watch_interval_s, (int, float)) or not 0 < watch_interval_s < 1e6:
            raise ConfigError(f"--watch-interval-s {watch_interval_s!r}: use a number of seconds > 0, e.g. 2")
        self.max_new_tokens = max_new_tokens
        self.router = Router(rules, on_decision=self._after_decision, seed=seed, log=log)
        self.counters = _Counters()
        self.started = time.time()
        self._slots: dict[str, str] = {}  # label -> engine slot
        self._admin = asyncio.Lock()
        self._client: Any = None
        self.watch = dict(watch or {})
        self.watch_interval_s = watch_interval_s
        self._watched: dict[str, tuple[str, float]] = {}
        self._watch_task: asyncio.Task[None] | None = None
        for name, where in (adapters or {}).items():
            self._check_name(name)
            if engine is not None and name == engine.model_name:
                raise ConfigError(
                    f"--adapter {name}={where}: {name!r} is the base model's name (--model {engine.model_name}), and "
                    f"requests for {name!r} get the base without adapters; serve the adapter under another name"
                )
            if engine is not None:
                slot = engine.add_family(name, engine.prepare(None, where))
                target = Target(name, 1, slot, where, f"--adapter {name}")
                self._slots[target.label] = slot
            else:
                target = Target(name, 1, where, None, where)
            self.router.add(target)
            log(f"serve: {target.label} from {where}")
        self.base_names = (*BASE_NAMES, engine.model_name) if engine is not None else ()
        self.base_label = f"base@{Path(engine.model_name).name}" if engine is not None else ""

    # -- ASGI ------------------------------------------------------------------------------------

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[Any]]
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    if self.watch:
                        self._watch_task = asyncio.create_task(self._watch_loop())
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        headers[_CLIENT] = "loopback" if is_loopback(scope.get("client")) else "remote"  # not a header any client can send
        extra: dict[str, str] = {}
        try:
            body = await _read_body(receive, headers, self.limits.body_timeout_s)
            status, answer, extra, ctype = await self._dispatch(scope["method"], scope["path"], headers, body)
        except Exception as exc:
            if not isinstance(exc, HTTPError):  # a bug: an OpenAI-style 500 the client can read, the cause in the log
                self.log(f"serve: {scope['method']} {scope['path'][:200]} failed ({type(exc).__name__}: {str(exc)[:300]})")
                exc = HTTPError(500, f"internal error ({type(exc).__name__}); the server keeps serving", "server_error")
            status, ctype = exc.status, "application/json"
            answer = json.dumps({"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}).encode()
        out = [(b"content-type", ctype.encode()), *((k.encode(), v.encode()) for k, v in extra.items())]
        out.append((b"content-length", str(len(answer)).encode()))
        # a client that does not read its answer must not hold the connection and this task for ever
        async with asyncio.timeout(self.limits.write_timeout_s):
            await send({"type": "http.response.start", "status": status, "headers": out})
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else answer})

    async def _dispatch(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str], str]:
        asked = method
        if method == "HEAD":  # answered as GET would be (status, headers, the token asked for), without the body
            method = "GET"
        if method == "GET" and path == "/health":
            return 200, _json({"ok": True, "uptime_s": round(time.time() - self.started, 3)}), {}, "application/json"
        self._authorize(headers)
        if method == "GET" and path == "/metrics":
            return 200, self.metrics_text().encode(), {}, "text/plain; version=0.0.4"
        if method == "GET" and path == "/v1/models":
            return 200, _json(self.models()), {}, "application/json"
        if method == "POST" and path == "/v1/chat/completions":
            answer, _ = await self.chat(self._parse_chat(body), headers)
            extra = {VERSION_HEADER: answer["system_fingerprint"]}
            if answer.get("feedback_id"):
                extra[FEEDBACK_HEADER] = answer["feedback_id"]
            return 200, _json(answer), extra, "application/json"
        if method == "POST" and path == "/v1/feedback":
            return 200, _json(self.feedback(_parse(_Feedback, body), _credential(headers))), {}, "application/json"
        if method == "POST" and path == "/v1/completions":
            answer = await self.completions(body)
            return 200, _json(answer), {VERSION_HEADER: answer["system_fingerprint"]}, "application/json"
        if method == "POST" and path in _LORA_ROUTES:
            self._authorize_admin(headers)
            load = path == _LORA_ROUTES[0]
            text = await (self.load_lora(body) if load else self.unload_lora(body))
            return 200, text.encode(), {}, "text/plain; charset=utf-8"
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "adapters"] and len(parts) in (2, 3, 4):
            self._authorize_admin(headers)
            if method == "GET" and len(parts) == 2:
                return 200, _json(self.adapters()), {}, "application/json"
        if len(parts) in (3, 4) and parts[:2] == ["v1", "adapters"]:
            name = parts[2]
            action = parts[3] if len(parts) == 4 else None
            if method == "GET" and action is None:
                return 200, _json(self._deployment(name).describe()), {}, "application/json"
            if method == "POST":
                return 200, _json(await self.admin(name, action, body)), {}, "application/json"
        if path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/feedback", "/metrics", *_LORA_ROUTES) or (
            path.startswith("/v1/adapters")
        ):
            raise HTTPError(405, f"{asked} {path} is not allowed; see the routes in agentrl-train serve --help")
        raise HTTPError(
            404,
            f"no route {asked} {path[:200]}; routes: /v1/chat/completions, /v1/completions, /v1/models, /v1/adapters/NAME, "
            "/v1/load_lora_adapter, /v1/unload_lora_adapter, /health, /metrics",
        )

    def _authorize(self, headers: dict[str, str]) -> None:
        if self.token is None:
            return
        got = headers.get("authorization", "")
        if self.admin_token is not None and hmac.compare_digest(got.encode(), f"Bearer {self.admin_token}".encode()):
            return
        if not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
            raise HTTPError(
                401, "missing or wrong bearer token: send Authorization: Bearer <the server's --token>", "authentication_error"
            )

    def _authorize_admin(self, headers: dict[str, str]) -> None:
        """Admin routes: the admin token; without one configured, loopback clients only."""
        if self.admin_token is None:
            if headers.get(_CLIENT) != "loopback":
                raise HTTPError(
                    403,
                    "admin routes answer loopback clients only on this server; run the request on the server's machine, "
                    "or start it with --admin-token (or $AGENTRL_SERVE_ADMIN_TOKEN) and send that token",
                    "permission_error",
                )
            return
        got = headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.admin_token}".encode()):
            raise HTTPError(401, "admin routes need Authorization: Bearer <the server's --admin-token>", "authentication_error")

    # -- chat ------------------------------------------------------------------------------------

    def _parse_chat(self, body: bytes) -> ChatRequest:
        """The chat request, its size checked against :attr:`limits` before pydantic or a tokenizer sees it."""
        data = _load_json(body)
        lim = self.limits
        messages = data.get("messages")
        if isinstance(messages, list) and len(messages) > lim.max_messages:
            raise HTTPError(
                413,
                f"the request has {len(messages)} messages; the limit is {lim.max_messages} (--max-messages): "
                "send the recent turns only",
            )
        chars = _text_chars(messages) + _text_chars(data.get("tools"))
        if chars > lim.max_prompt_chars:
            raise HTTPError(
                413,
                f"the request's messages and tools hold {chars} characters; the limit is {lim.max_prompt_chars} "
                "(--max-prompt-chars): send the recent turns only",
            )
        return _validate(ChatRequest, data)

    async def chat(self, req: ChatRequest, headers: dict[str, str]) -> tuple[dict[str, Any], Target | None]:
        if req.stream:
            raise HTTPError(400, "stream=true is not supported by this server; send stream=false")
        conversation = next((headers[h][:200] for h in CONVERSATION_HEADERS if headers.get(h)), None)
        base = req.model in self.base_names and self.engine is not None
        if not base and req.model not in self.router.deployments:
            raise HTTPError(
                404, f"unknown model {req.model[:100]!r}; GET /v1/models lists them ({self._names()})", "not_found_error"
            )
        t0 = time.perf_counter()
        credential = _credential(headers)
        if self.engine is None:
            proxied = self.router.route(req.model, conversation)
            proxied_id = self.router.open_episode(proxied, conversation, credential)
            answer = await self._proxy_chat(proxied, req, headers, t0)
            return {**answer, "feedback_id": proxied_id}, proxied
        budget = min(req.max_completion_tokens or req.max_tokens or self.max_new_tokens, self.max_new_tokens)
        messages = [_flatten(m) for m in req.messages]
        prompt = await self._encode(messages, req.tools, budget)
        if not base and req.model not in self.router.deployments:  # unloaded while the prompt was tokenized
            raise HTTPError(404, self._no_model(req.model), "not_found_error")
        # Route, look up the slot and queue the job with no await in between: a swap queued before this
        # point runs before the job (and its version is the one routed to), one queued after runs after it.
        target = None if base else self.router.route(req.model, conversation)
        feedback_id = self.router.open_episode(target, conversation, credential) if target is not None else None
        slot = self._slots[target.label] if target is not None else None
        future = self.engine.generate(slot, prompt, budget, req.temperature, req.seed)
        try:
            ids, finish = await asyncio.wrap_future(future)
        except Exception as exc:
            if target is not None:
                self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            self.log(f"serve: generation failed ({type(exc).__name__}: {exc})")
            raise HTTPError(500, f"generation failed ({type(exc).__name__}); the server keeps serving", "server_error") from None
        text = self.engine.decode(ids)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
        message, finish, parsed = _reply(text, finish, req.tools)
        if target is not None:
            self.router.record(target, ok=True, parsed=parsed, latency_s=time.perf_counter() - t0)
        label = target.label if target is not None else self.base_label
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "system_fingerprint": label,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        if feedback_id is not None:
            answer["feedback_id"] = feedback_id
        return answer, target

    async def _encode(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, budget: int) -> list[int]:
        """Tokenize on the encoder pool: :attr:`ServeLimits.max_concurrent_encodings` at once, a bounded queue."""
        from agentrl_train.serve.engine import PromptTooLargeError

        try:
            return await self._on_encoder(
                self.engine.encode, messages, tools, self.engine.max_positions - budget, max_total=self.limits.max_prompt_tokens
            )
        except HTTPError:
            raise
        except PromptTooLargeError as exc:
            raise HTTPError(413, f"{exc} (--max-prompt-tokens)") from None
        except ConfigError as exc:
            raise HTTPError(400, str(exc)) from None
        except Exception as exc:  # a template that cannot render these messages
            raise HTTPError(
                400, f"cannot render these messages with the model's chat template ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None

    async def _on_encoder(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` on the encoder pool: :attr:`ServeLimits.max_concurrent_encodings` at once, a bounded queue (503 past it)."""
        lim = self.limits
        if self._encodes_waiting >= lim.max_concurrent_encodings + lim.max_waiting_encodings:
            raise HTTPError(503, "the server is tokenizing too many requests; retry in a second", "server_busy")
        self._encodes_waiting += 1
        try:
            return await asyncio.wrap_future(self._encoder.submit(fn, *args, **kwargs))
        finally:
            self._encodes_waiting -= 1

    async def _proxy_chat(self, target: Target, req: ChatRequest, headers: dict[str, str], t0: float) -> dict[str, Any]:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
        body = req.model_dump(exclude_none=True)
        body["model"] = target.model
        fwd = {"content-type": "application/json"}
        if headers.get("x-upstream-authorization"):
            fwd["authorization"] = headers["x-upstream-authorization"]
        try:
            status, content = await _read_upstream(self._client, f"{self.upstream}/v1/chat/completions", body, fwd)
        except httpx.HTTPError as exc:
            self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            raise HTTPError(
                502, f"upstream {self.upstream} failed ({type(exc).__name__}); check that it is up", "upstream_error"
            ) from None
        except _TooBig as exc:
            self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            raise HTTPError(
                502,
                f"upstream {self.upstream} answered {exc.status} with a body over {MAX_UPSTREAM_BYTES} bytes "
                f"({MAX_UPSTREAM_BYTES >> 20} MiB, this server's cap); is --upstream an OpenAI-compatible server, "
                "and is max_tokens sane?",
                "upstream_error",
            ) from None
        answer, problem = _upstream_answer(status, content)
        if problem is not None:
            # 502, except for what the request itself caused (too long, rate limited): a client retries a
            # 502, and the upstream's 401 or 404 passed through would read as this server's own.
            self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            code = status if status in PASSED_UPSTREAM_STATUSES else 502
            raise HTTPError(code, f"upstream {self.upstream} answered {status}: {problem}", "upstream_error")
        message = answer["choices"][0].get("message") or {}
        parsed = bool(message.get("tool_calls")) or _reply(str(message.get("content") or ""), "stop", req.tools)[2]
        self.router.record(target, ok=True, parsed=parsed, latency_s=time.perf_counter() - t0)
        answer["model"], answer["system_fingerprint"] = req.model, target.label
        return answer

    # -- vLLM's completions and runtime LoRA ----------------------------------------------------

    async def completions(self, body: bytes) -> dict[str, Any]:
        """``POST /v1/completions`` (:mod:`agentrl_train.serve.completions`): one prompt, queued on the model thread."""
        if self.engine is None:
            raise HTTPError(400, f"this server proxies {self.upstream}; send /v1/completions to it directly")
        data = _load_json(body)
        lim, prompt = self.limits, data.get("prompt")
        if isinstance(prompt, list) and len(prompt) > lim.max_prompt_tokens:
            raise HTTPError(
                413, f"the prompt has {len(prompt)} tokens; the limit is {lim.max_prompt_tokens} (--max-prompt-tokens)"
            )
        if isinstance(prompt, str) and len(prompt) > lim.max_prompt_chars:
            raise HTTPError(
                413, f"the prompt has {len(prompt)} characters; the limit is {lim.max_prompt_chars} (--max-prompt-chars)"
            )
        req = _validate(CompletionRequest, data)
        base = req.model in self.base_names
        if not base and req.model not in self.router.deployments:
            raise HTTPError(404, self._no_model(req.model), "not_found_error")
        try:
            budget = completion_budget(req, self.max_new_tokens)
            ids = prompt_of(req)
            if isinstance(ids, str):
                ids = await self._on_encoder(self.engine.prompt_ids, ids)
            stop_ids = list(req.stop_token_ids or [])
            check_ids(ids, stop_ids, self.engine.vocab_size, self.engine.max_positions, budget)
        except ConfigError as exc:
            raise HTTPError(400, str(exc)) from None
        # Route, look up the slot and queue the job with no await in between (as chat): a load, swap or
        # unload queued before this point runs before the job, one queued after runs after it.
        if not base and req.model not in self.router.deployments:  # unloaded while the prompt was tokenized
            raise HTTPError(404, self._no_model(req.model), "not_found_error")
        target = None if base else self.router.route(req.model, None)
        slot = self._slots[target.label] if target is not None else None
        temperature = 1.0 if req.temperature is None else req.temperature
        future = self.engine.complete(slot, ids, budget, temperature, req.seed, stop_ids=stop_ids, top=req.logprobs or 0)
        try:
            sampled = await asyncio.wrap_future(future)
        except Exception as exc:
            self.log(f"serve: completion failed ({type(exc).__name__}: {exc})")
            raise HTTPError(500, f"generation failed ({type(exc).__name__}); the server keeps serving", "server_error") from None
        self.counters.completions += 1
        label = target.label if target is not None else self.base_label
        return completion_answer(req, sampled, len(ids), self.engine.tokenizer, label)

    def _no_model(self, model: str) -> str:
        return f"the model {model[:100]!r} does not exist; GET /v1/models lists them ({self._names()})"

    async def load_lora(self, body: bytes) -> str:
        """``POST /v1/load_lora_adapter``: serve the adapter folder ``lora_path`` under the new name ``lora_name``."""
        if self.engine is None:
            raise HTTPError(400, f"this server proxies {self.upstream}; load adapters on it (its /v1/load_lora_adapter)")
        req = _parse(LoraLoad, body)
        name = req.lora_name
        try:
            self._check_name(name)
        except ConfigError as exc:
            raise HTTPError(400, f"lora_name: {exc}") from None
        if name == self.engine.model_name:
            raise HTTPError(400, f"lora_name {name!r} is the base model's name; load the adapter under another name")
        where, shown = self._under_root(req.lora_path)
        async with self._admin:
            if name in self.router.deployments:
                raise HTTPError(
                    400, f"The lora adapter {name!r} has already been loaded; unload it first (POST /v1/unload_lora_adapter)"
                )
            if len(self.router.deployments) >= self.limits.max_adapters:
                raise HTTPError(
                    400, f"this server holds {len(self.router.deployments)} adapters, its limit (max_adapters): unload one first"
                )
            loop = asyncio.get_running_loop()
            t0 = time.perf_counter()
            try:
                prepared = await loop.run_in_executor(None, self.engine.prepare, None, where)
                slot = await asyncio.wrap_future(self.engine.load_family(name, prepared))
            except ConfigError as exc:
                self.counters.refused_loads += 1
                self.log(f"serve: refused {name} from {where}: {exc}")
                raise HTTPError(400, _hide_paths(str(exc), where, shown, self.adapters_root)) from None
            target = Target(name, 1, slot, where, shown)
            self.router.add(target)
            self._slots[target.label] = slot
        self.log(f"serve: loaded {target.label} from {where} in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_lora(self, body: bytes) -> str:
        """``POST /v1/unload_lora_adapter``: stop serving ``lora_name`` and free its slots."""
        if self.engine is None:
            raise HTTPError(400, f"this server proxies {self.upstream}; unload adapters on it (its /v1/unload_lora_adapter)")
        name = _parse(LoraUnload, body).lora_name
        async with self._admin:
            if name not in self.router.deployments:
                raise HTTPError(404, f"The lora adapter {name[:100]!r} cannot be found.", "not_found_error")
            if name in self.watch:
                raise HTTPError(400, f"{name!r} is watched (--watch {name}=DIR); restart the server without it to unload it")
            self.router.remove(name)
            slots = [self._slots.pop(label) for label in list(self._slots) if label.rsplit("@", 1)[0] == name]
            await asyncio.wrap_future(self.engine.drop_family(name, slots))
        self.log(f"serve: unloaded {name}")
        return f"Success: LoRA adapter '{name}' removed successfully."

    # -- adapters --------------------------------------------------------------------------------

    async def admin(self, name: str, action: str | None, body: bytes) -> dict[str, Any]:
        dep = self._deployment(name)
        if action in ("promote", "rollback"):
            try:
                decision = self.router.decide(name, action)
            except ConfigError as exc:
                raise HTTPError(409, str(exc), "conflict_error") from None
            return {"decision": decision.as_dict(), **dep.describe()}
        if action not in (None, "canary"):
            raise HTTPError(404, f"no route POST /v1/adapters/{name}/{action[:50]}; use canary, promote or rollback")
        req = _parse(_Load, body)
        if action == "canary":
            if req.fraction is None:
                raise HTTPError(400, 'a canary needs "fraction" in [0, 1], e.g. {"path": DIR, "fraction": 0.05}')
            try:
                check_fraction(req.fraction)
            except ConfigError as exc:
                raise HTTPError(400, str(exc)) from None
        elif req.fraction is not None:
            raise HTTPError(400, f'"fraction" is for POST /v1/adapters/{name}/canary; a hot reload takes {{"path": DIR}}')
        where = req.path if self.engine is not None else req.model
        if not where:
            need = '{"path": DIR}' if self.engine is not None else '{"model": UPSTREAM_MODEL_NAME}'
            raise HTTPError(
                400, f"send {need} (this server {'loads adapters itself' if self.engine else 'proxies ' + str(self.upstream)})"
            )
        shown = where
        if self.engine is not None:
            where, shown = self._under_root(where)
        async with self._admin:
            if action == "canary" and dep.canary is not None:
                raise HTTPError(
                    409, f"{name} already has a canary ({dep.canary.label}); promote or roll it back first", "conflict_error"
                )
            if self.engine is None:
                target = (
                    self.router.start_canary(name, where, None, req.fraction or 0.0, where)
                    if action == "canary"
                    else self.router.replace_stable(name, where, None, where)
                )
                return {"version": target.label, **dep.describe()}
            return await self._load(name, dep, where, action == "canary", req.fraction or 0.0, shown)

    def _under_root(self, asked: str) -> tuple[str, str]:
        """The folder ``asked`` names under :attr:`adapters_root` (symlinks resolved) and how to show it.

        Raises:
            HTTPError: 403 without a root, or for a folder outside it (named as the client wrote it).
        """
        if self.adapters_root is None:
            raise HTTPError(
                403,
                "this server loads no adapters over HTTP: start it with --adapters-root DIR and send a folder under DIR",
                "permission_error",
            )
        try:
            where = (self.adapters_root / asked).resolve()  # an absolute `asked` stays itself, then must be inside
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            where = None
        if where is None or not where.is_relative_to(self.adapters_root):
            raise HTTPError(
                403,
                f"path {asked[:200]!r} is outside the adapters root; send a folder under --adapters-root "
                "(relative to it, e.g. runs/ppo/final)",
                "permission_error",
            )
        return str(where), where.relative_to(self.adapters_root).as_posix() or "."

    async def _load(self, name: str, dep: Deployment, path: str, canary: bool, fraction: float, shown: str) -> dict[str, Any]:
        """Read, check and swap in the adapter at ``path``; ``shown`` is what clients see instead of it."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            prepared = await loop.run_in_executor(None, self.engine.prepare, name, path)
        except ConfigError as exc:
            self.counters.refused_loads += 1
            self.log(f"serve: refused {name} from {path}: {exc}")
            raise HTTPError(422, _hide_paths(str(exc), path, shown, self.adapters_root)) from None
        read_s = time.perf_counter() - t0
        if canary:
            slot = await loop.run_in_executor(None, self.engine.spare_slot, name)
        else:
            slot = self._slots[dep.stable.label]
        # The copy is queued behind the requests already admitted and runs before any later one: the
        # router must point at the new version from the moment the copy is queued.
        future = self.engine.install(slot, prepared)
        if canary:
            target = self.router.start_canary(name, slot, path, fraction, shown)
        else:
            old = dep.stable.label
            target = self.router.replace_stable(name, slot, path, shown)
            self._slots.pop(old, None)
        self._slots[target.label] = slot
        swap_s = await asyncio.wrap_future(future)
        del prepared
        self.counters.swaps += 1
        self.counters.swap_seconds_sum += swap_s
        self.counters.swap_seconds_last = swap_s
        self.log(
            f"serve: {'canary' if canary else 'swapped in'} {target.label} from {path}: read+check {read_s * 1e3:.1f} ms, swap {swap_s * 1e3:.2f} ms"
        )
        return {"version": target.label, "swap_ms": round(swap_s * 1e3, 3), "read_ms": round(read_s * 1e3, 3), **dep.describe()}

    def _after_decision(self, dep: Deployment, decision: Decision, loser: Target) -> None:
        slot = self._slots.pop(loser.label, None)
        if slot is not None and self.engine is not None:
            self.engine.release_slot(dep.stable.name, slot)

    # -- feedback, models, metrics --------------------------------------------------------------

    def feedback(self, outcome: _Feedback, credential: str) -> dict[str, Any]:
        if outcome.feedback_id is None:
            raise HTTPError(
                422,
                'send "feedback_id": the x-feedback-id header (or feedback_id field) of a chat answer in the episode; '
                "an episode_id alone is the client's own name and proves nothing",
            )
        try:
            label = self.router.feedback(outcome.feedback_id, outcome.model_dump(), credential)
        except KeyError:
            raise HTTPError(
                404,
                f"feedback_id {outcome.feedback_id[:100]!r} was not issued to this credential (or is too old to remember); "
                "send the x-feedback-id of a chat answer you got",
                "not_found_error",
            ) from None
        except EpisodeJudgedError as exc:
            raise HTTPError(409, str(exc), "conflict_error") from None
        self.counters.feedback += 1
        dep = self.router.get(label.rsplit("@", 1)[0])
        return {"ok": True, "version": label, "stable": dep.stable.label, "canary": dep.canary.label if dep.canary else None}

    def adapters(self) -> dict[str, Any]:
        """``GET /v1/adapters``: each served name, its versions and canary fraction (no paths)."""
        data = [
            {
                "name": n,
                "stable": d.stable.label,
                "stable_source": d.stable.source,
                "canary": d.canary.label if d.canary else None,
                "canary_source": d.canary.source if d.canary else None,
                "fraction": d.fraction,
            }
            for n, d in self.router.deployments.items()
        ]
        return {"object": "list", "data": data}

    def models(self) -> dict[str, Any]:
        parent = {"parent": self.engine.model_name} if self.engine is not None else {}  # vLLM names an adapter's base so
        data = [
            {"id": n, "object": "model", "owned_by": "agentrl", "version": d.stable.label, **parent}
            for n, d in self.router.deployments.items()
        ]
        if self.engine is not None:
            for n in dict.fromkeys(("base", self.engine.model_name)):
                data.append({"id": n, "object": "model", "owned_by": "agentrl", "version": self.base_label})
        return {"object": "list", "data": data}

    def metrics_text(self) -> str:
        """Prometheus text exposition (version 0.0.4)."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
            lines.extend([f"# HELP agentrl_serve_{name} {help_text}", f"# TYPE agentrl_serve_{name} {kind}"])
            for labels, value in samples:
                tag = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                lines.append(f"agentrl_serve_{name}{{{tag}}} {value}" if tag else f"agentrl_serve_{name} {value}")

        per: list[tuple[dict[str, str], Any]] = []
        for name, dep in self.router.deployments.items():
            for label, s in dep.stats.items():
                role = (
                    "stable" if label == dep.stable.label else "canary" if dep.canary and label == dep.canary.label else "retired"
                )
                per.append(({"model": name, "version": label, "role": role}, s))
        metric("requests_total", "counter", "chat completions answered, by version", [(k, s.requests) for k, s in per])
        metric("request_errors_total", "counter", "chat completions that failed, by version", [(k, s.errors) for k, s in per])
        metric(
            "tool_calls_parsed_total",
            "counter",
            "replies whose tool call parsed, by version",
            [(k, s.tool_calls_parsed) for k, s in per],
        )
        metric(
            "request_latency_seconds_sum",
            "counter",
            "total chat latency, by version",
            [(k, round(s.latency_s_sum, 6)) for k, s in per],
        )
        metric("episodes_total", "counter", "episode outcomes reported, by version", [(k, s.episodes) for k, s in per])
        metric(
            "episode_successes_total", "counter", "successful episodes reported, by version", [(k, s.successes) for k, s in per]
        )
        metric(
            "canary_fraction",
            "gauge",
            "traffic fraction of the candidate",
            [({"model": n}, d.fraction) for n, d in self.router.deployments.items()],
        )
        metric(
            "decisions_total",
            "counter",
            "promotions and rollbacks",
            [
                ({"model": n, "action": a}, sum(x.action == a for x in d.decisions))
                for n, d in self.router.deployments.items()
                for a in ("promote", "rollback")
            ],
        )
        c = self.counters
        metric("swaps_total", "counter", "adapter weights swapped in (reloads and canaries)", [({}, c.swaps)])
        metric("swap_seconds_sum", "counter", "time spent swapping", [({}, round(c.swap_seconds_sum, 6))])
        metric("swap_seconds_last", "gauge", "the last swap's time", [({}, round(c.swap_seconds_last, 6))])
        metric("refused_loads_total", "counter", "adapter loads refused before any swap", [({}, c.refused_loads)])
        metric("completions_total", "counter", "/v1/completions answered (all models)", [({}, c.completions)])
        return "\n".join(lines) + "\n"

    # -- helpers ---------------------------------------------------------------------------------

    def _deployment(self, name: str) -> Deployment:
        try:
            return self.router.get(name)
        except KeyError:
            raise HTTPError(
                404,
                f"unknown adapter {name[:100]!r}; served: {self._names()} (start the server with --adapter {name}=DIR)",
                "not_found_error",
            ) from None

    def _names(self) -> str:
        return ", ".join([*self.router.deployments, *(["base"] if self.engine is not None else [])]) or "none"

    @staticmethod
    def _check_name(name: str) -> None:
        if (
            not name
            or not name.replace("-", "").replace("_", "").replace(".", "").isalnum()
            or name in BASE_NAMES
            or len(name) > 100
        ):
            raise ConfigError(f"adapter name {name[:100]!r}: use letters, digits, '-', '_' or '.' (and not 'base')")

    async def poll_watch(self) -> list[str]:
        """Load the newest adapter under each ``--watch`` folder if it changed; returns the new versions."""
        loaded = []
        for name, folder in self.watch.items():
            found = latest_adapter(folder)
            if found is None or self._watched.get(name) == found:
                continue
            self._watched[name] = found
            try:
                shown = f"--watch {name}: {Path(found[0]).relative_to(Path(folder).expanduser()).as_posix()}"
            except ValueError:
                shown = f"--watch {name}"
            try:
                async with self._admin:
                    answer = await self._load(name, self._deployment(name), found[0], False, 0.0, shown)
            except HTTPError as exc:
                self.log(f"serve: --watch {name}={folder}: {found[0]} not loaded: {exc.message}")
                continue
            loaded.append(answer["version"])
        return loaded

    async def _watch_loop(self) -> None:
        for name, folder in self.watch.items():  # what is there at start-up is what --adapter loaded
            self._watched.setdefault(name, latest_adapter(folder) or ("", 0.0))
        while True:
            await asyncio.sleep(self.watch_interval_s)
            try:
                await self.poll_watch()
            except Exception as exc:  # the watcher must not die with the server still up
                self.log(f"serve: --watch failed ({type(exc).__name__}: {exc}); retrying")

    async def aclose(self) -> None:
        self._encoder.shutdown(wait=False, cancel_futures=True)
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self._client is not None:
            await self._client.aclose()


# -- request and reply helpers ---------------------------------------------------------------------


#: a key of the app's header dict that no HTTP header can have (names are latin-1 without spaces): whether
#: the TCP peer is on this machine
_CLIENT = " client"


def _credential(headers: dict[str, str]) -> str:
    """A digest of the credential a request carries (its Authorization header; "" when none)."""
    got = headers.get("authorization", "")
    return hashlib.sha256(got.encode("utf-8", "surrogateescape")).hexdigest() if got else ""


def _text_chars(value: Any) -> int:
    """Characters of every string (keys included) in decoded JSON; iterative, so depth costs no recursion."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return total


def _hide_paths(message: str, path: str, shown: str, root: Path | None) -> str:
    """``message`` with the server's folder names replaced by what the client sent."""
    message = message.replace(path, shown)
    if root is not None:
        message = message.replace(str(root), "<adapters-root>")
    return message.replace(os.path.expanduser("~"), "~")


async def _read_body(receive: Callable[..., Awaitable[Any]], headers: dict[str, str], timeout_s: float) -> bytes:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HTTPError(413, f"the body is {declared} bytes; the limit is {MAX_BODY_BYTES}: shorten the conversation")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):  # the whole body: a client dripping a byte at a time gets no longer
            while True:
                event = await receive()
                chunk = event.get("body", b"")
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise HTTPError(413, f"the body is over {MAX_BODY_BYTES} bytes: shorten the conversation")
                chunks.append(chunk)
                if not event.get("more_body"):
                    return b"".join(chunks)
    except TimeoutError:
        raise HTTPError(408, f"the body took over {timeout_s:g} s to arrive (--body-timeout-s); send it at once") from None


def _load_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except (ValueError, RecursionError):
        raise HTTPError(400, f"the body is not JSON ({body[:60]!r}); send a JSON object") from None
    if not isinstance(data, dict):
        raise HTTPError(400, "the body must be a JSON object")
    return data


def _parse(model: type[Any], body: bytes) -> Any:
    return _validate(model, _load_json(body))


def _validate(model: type[Any], data: dict[str, Any]) -> Any:
    where = _lone_surrogate(data)
    if where is not None:
        raise HTTPError(
            400,
            f"bad request: {where or 'body'}: holds a lone UTF-16 surrogate (an escape like \\ud800 without its pair), "
            "which is not text; send valid Unicode",
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise HTTPError(400, f"bad request: {where}: {first['msg']} ({exc.error_count()} problem(s))") from None


class _TooBig(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def _read_upstream(client: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    """POST ``body`` to ``url``; the status and the body, read up to :data:`MAX_UPSTREAM_BYTES` (:class:`_TooBig` past it)."""
    async with client.stream("POST", url, json=body, headers=headers) as r:
        declared = r.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_UPSTREAM_BYTES:
            raise _TooBig(r.status_code)
        chunks, size = [], 0
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            if size > MAX_UPSTREAM_BYTES:
                raise _TooBig(r.status_code)
            chunks.append(chunk)
        return r.status_code, b"".join(chunks)


def _upstream_answer(status: int, content: bytes) -> tuple[Any, str | None]:
    """An upstream's answer to a chat completion and what is wrong with it (None for a usable one).

    Usable: status 200 and a JSON object whose ``choices[0]`` is an object with a ``message`` object (or none).
    Another status: the upstream's own error message (or the start of its body).
    """
    try:
        answer = json.loads(content)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past Python's recursion limit
        text = content[:100].decode("utf-8", "replace")
        if status != 200:
            return None, f"{text!r} (not JSON)"
        return None, f"a body that is not JSON ({text!r}); is --upstream an OpenAI-compatible server?"
    if status != 200:
        error = answer.get("error") if isinstance(answer, dict) else None
        message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
        return None, (message if isinstance(message, str) else str(answer))[:300]
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices:
        got = "not a JSON object" if not isinstance(answer, dict) else "no choices"
        return (
            None,
            f"JSON that is not a chat completion ({got}: {str(answer)[:200]}); is --upstream an OpenAI-compatible server?",
        )
    first = choices[0]
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(first, dict) or not isinstance(message, (dict, type(None))):
        bad = "choices[0]" if not isinstance(first, dict) else "choices[0].message"
        return None, f"a chat completion whose {bad} is not a JSON object ({str(first)[:200]}); is --upstream OpenAI-compatible?"
    return answer, None


def _lone_surrogate(data: Any) -> str | None:
    """Where (``messages.0.content``) a string or key of decoded JSON holds a lone surrogate; None if nowhere.

    ``json.loads`` accepts ``"\\ud800"``, but no UTF-8 encoder does: tokenizers, the upstream client and
    logs would fail on it later. Iterative, so nesting depth costs no recursion.
    """
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((f"{where}.{k}" if where else str(k), v))
                stack.append((f"{where or 'body'} (a key)", k))  # popped first: a bad key never names a path
        elif isinstance(value, list):
            stack.extend((f"{where}.{i}" if where else str(i), v) for i, v in enumerate(value))
    return None


def _flatten(m: _Message) -> dict[str, Any]:
    """One OpenAI message as the ``role``/``content`` a chat template renders.

    ``content`` is a list: the client's strings, and the ``<tool_call>`` tags the server writes around a
    call (:class:`~agentrl_train.serve.engine.Markup`, the only text whose special tokens stay special).
    """
    from agentrl_train.serve.engine import Markup

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


def _reply(text: str, finish: str, tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], str, bool]:
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


def latest_adapter(folder: str | Path) -> tuple[str, float] | None:
    """The newest adapter folder under ``folder`` (itself, or up to two levels down) and its weights' mtime.

    A trainer's ``checkpoints/update-N/`` and ``final/`` are renamed into place complete, so a folder
    seen here is whole; names starting with ``.`` (temporary) are skipped.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        return None
    best: tuple[str, float] | None = None
    level = [root]
    for _ in range(3):
        below: list[Path] = []
        for d in level:
            for f in ("adapter_model.safetensors", "trainable.safetensors"):
                if (d / f).is_file():
                    when = (d / f).stat().st_mtime
                    if best is None or when > best[1]:
                        best = (str(d), when)
            try:
                below += [p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")]
            except OSError:
                continue
        level = below
    return best


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
