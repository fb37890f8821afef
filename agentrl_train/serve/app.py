"""``agentrl-train serve``: an OpenAI-compatible server for trained adapters, with hot reload and canaries.

Like ``agentrl-envs serve`` it is a plain ASGI callable under uvicorn: a handful of routes with JSON
bodies, checked by pydantic. Routes:

- ``POST /v1/chat/completions``: ``model`` is an adapter name (or ``base``, or the ``--model`` value,
  for the base without adapters); ``messages`` and ``tools`` in OpenAI's format; ``temperature`` 0 is
  greedy; a ``<tool_call>`` in the reply comes back as ``tool_calls`` when the request sent ``tools``.
  The header ``x-adapter-version: NAME@VERSION`` and the body's ``system_fingerprint`` say which
  version answered; the header ``x-feedback-id`` and the body's ``feedback_id`` name the episode for
  ``POST /v1/feedback``. Sizes are bounded by :class:`~agentrl_train.serve.limits.ServeLimits` (413).
  The request and reply are :mod:`agentrl_train.serve.chat`'s; a local model answers in
  :mod:`agentrl_train.serve.generation`.
- ``POST /v1/completions``: vLLM's completions, token ids (or a string) in, ids and their log-probs out
  (:mod:`agentrl_train.serve.completions`); the rollout engine of ``--rollout-engine server``.
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format, :mod:`agentrl_train.serve.status`);
  ``HEAD`` on any route answers as ``GET`` does, without the body.
- ``POST /v1/feedback {"feedback_id": ..., "success": ...}``: one verdict per episode, from the
  credential the episode was served to (see :mod:`agentrl_train.serve.canary`).
- Admin (:mod:`agentrl_train.serve.admin`): ``POST /v1/adapters/NAME {"path": DIR}`` (hot reload, see
  :mod:`agentrl_train.serve.engine`),
  ``POST /v1/adapters/NAME/canary {"path": DIR, "fraction": f}``, ``POST .../promote``, ``POST .../rollback``,
  ``GET /v1/adapters`` and ``GET /v1/adapters/NAME`` (names, versions and numbers; never server paths);
  vLLM's runtime LoRA routes ``POST /v1/load_lora_adapter {"lora_name": NAME, "lora_path": DIR}`` (a new
  name) and ``POST /v1/unload_lora_adapter {"lora_name": NAME}``, answered in plain text as vLLM does.

With ``--upstream URL`` the same routes sit in front of another OpenAI-compatible server (e.g. vLLM with
LoRA enabled): adapters are the upstream's model names, a canary is ``{"model": NAME, "fraction": f}``.
Whatever goes wrong upstream is a 502 ``upstream_error`` whose message names the upstream's status and
its message (``upstream URL answered 401: ...``), counted against the version asked; an answer is read
up to ``MAX_UPSTREAM_BYTES`` (32 MiB) and no further (:mod:`agentrl_train.serve.upstream`).

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
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl_envs.errors import ConfigError
from agentrl_train.serve.admin import AdapterAdmin
from agentrl_train.serve.canary import CanaryRules, Decision, Deployment, EpisodeJudgedError, Router, Target
from agentrl_train.serve.chat import CONVERSATION_HEADERS, ChatRequest, parse_chat
from agentrl_train.serve.generation import Generation
from agentrl_train.serve.limits import ServeLimits, is_loopback
from agentrl_train.serve.status import Counters, adapter_list, metrics_text, model_list, served_names
from agentrl_train.serve.upstream import Upstream
from agentrl_train.serve.watch import Watcher
from agentrl_train.serve.wire import CLIENT_KEY, HTTPError, as_json, credential, parse_body, read_body

__all__ = ["ServeApp"]

VERSION_HEADER = "x-adapter-version"
FEEDBACK_HEADER = "x-feedback-id"
_LORA_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


class _Feedback(BaseModel):
    model_config = ConfigDict(extra="ignore")
    feedback_id: str | None = Field(default=None, min_length=1, max_length=200)  # None: a 422 that says what to send
    episode_id: str | None = Field(default=None, max_length=200)
    success: bool = Field(strict=True)
    api_error_rate: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)
    timeout_rate: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)


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
        seed: seeds the router's draw for requests without a conversation id.
        watch: NAME -> a folder whose newest adapter is loaded as NAME's next version (engine).
        watch_interval_s: seconds between two looks at the ``watch`` folders.
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
        self.engine, self.token, self.log = engine, token, log
        if admin_token is not None and token is not None and hmac.compare_digest(admin_token.encode(), token.encode()):
            raise ConfigError("--admin-token is the same as --token: use another secret, or every client is an admin")
        self.admin_token = admin_token
        self.limits = limits or ServeLimits()
        root = Path(adapters_root).expanduser().resolve() if adapters_root is not None else None
        if root is not None and not root.is_dir():
            raise ConfigError(f"--adapters-root {str(adapters_root)[:200]!r} is not a folder; create it or point at one")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens {max_new_tokens!r}: use a positive integer, e.g. 256")
        if engine is not None and max_new_tokens >= engine.max_positions:
            raise ConfigError(
                f"--max-new-tokens {max_new_tokens}: this model's context is {engine.max_positions} tokens, prompt "
                f"included; use fewer, leaving room for the conversation (e.g. {min(256, engine.max_positions // 2)})"
            )
        if isinstance(watch_interval_s, bool) or not isinstance(watch_interval_s, (int, float)) or not 0 < watch_interval_s < 1e6:
            raise ConfigError(f"--watch-interval-s {watch_interval_s!r}: use a number of seconds > 0, e.g. 2")
        self.router = Router(rules, on_decision=self._release_loser, seed=seed, log=log)
        self.counters = Counters()
        self.started = time.time()
        self.upstream = Upstream(upstream, self.router) if upstream is not None else None
        self.local = (
            Generation(engine, self.router, self.limits, max_new_tokens, self.counters, log) if engine is not None else None
        )
        watch = dict(watch or {})
        self.admin = AdapterAdmin(engine, upstream, self.router, root, self.limits, self.counters, set(watch), log)
        self.watcher = Watcher(self.admin, watch, watch_interval_s, log)
        for name, where in (adapters or {}).items():
            self.admin.serve_first(name, where)

    # -- ASGI ------------------------------------------------------------------------------------

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[Any]]
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    self.watcher.start()
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        headers[CLIENT_KEY] = "loopback" if is_loopback(scope.get("client")) else "remote"  # not a header any client can send
        extra: dict[str, str] = {}
        try:
            body = await read_body(receive, headers, self.limits.body_timeout_s)
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
            return 200, as_json({"ok": True, "uptime_s": round(time.time() - self.started, 3)}), {}, "application/json"
        self._authorize(headers)
        if method == "GET" and path == "/metrics":
            swaps = self.engine.swaps if self.engine is not None else None
            return 200, metrics_text(self.router, self.counters, swaps).encode(), {}, "text/plain; version=0.0.4"
        if method == "GET" and path == "/v1/models":
            local = self.local
            models = (
                model_list(self.router, local.engine.model_name, local.base_label) if local else model_list(self.router, None, "")
            )
            return 200, as_json(models), {}, "application/json"
        if method == "POST" and path == "/v1/chat/completions":
            answer, _ = await self.chat(parse_chat(body, self.limits), headers)
            extra = {VERSION_HEADER: answer["system_fingerprint"]}
            if answer.get("feedback_id"):
                extra[FEEDBACK_HEADER] = answer["feedback_id"]
            return 200, as_json(answer), extra, "application/json"
        if method == "POST" and path == "/v1/feedback":
            return 200, as_json(self.feedback(parse_body(_Feedback, body), credential(headers))), {}, "application/json"
        if method == "POST" and path == "/v1/completions":
            if self.local is None:
                raise HTTPError(400, f"this server proxies {self.admin.upstream}; send /v1/completions to it directly")
            answer = await self.local.completions(body)
            return 200, as_json(answer), {VERSION_HEADER: answer["system_fingerprint"]}, "application/json"
        if method == "POST" and path in _LORA_ROUTES:
            self._authorize_admin(headers)
            load = path == _LORA_ROUTES[0]
            text = await (self.admin.load_lora(body) if load else self.admin.unload_lora(body))
            return 200, text.encode(), {}, "text/plain; charset=utf-8"
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "adapters"] and len(parts) in (2, 3, 4):
            self._authorize_admin(headers)
            if method == "GET" and len(parts) == 2:
                return 200, as_json(adapter_list(self.router)), {}, "application/json"
        if len(parts) in (3, 4) and parts[:2] == ["v1", "adapters"]:
            name = parts[2]
            action = parts[3] if len(parts) == 4 else None
            if method == "GET" and action is None:
                return 200, as_json(self.admin.deployment(name).describe()), {}, "application/json"
            if method == "POST":
                return 200, as_json(await self.admin.change(name, action, body)), {}, "application/json"
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
            if headers.get(CLIENT_KEY) != "loopback":
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

    # -- chat and feedback -------------------------------------------------------------------------

    async def chat(self, req: ChatRequest, headers: dict[str, str]) -> tuple[dict[str, Any], Target | None]:
        """A chat completion: the local model's, or the upstream's for the version routed to."""
        if req.stream:
            raise HTTPError(400, "stream=true is not supported by this server; send stream=false")
        conversation = next((headers[h][:200] for h in CONVERSATION_HEADERS if headers.get(h)), None)
        base = self.local is not None and req.model in self.local.base_names
        if not base and req.model not in self.router.deployments:
            raise HTTPError(
                404,
                f"unknown model {req.model[:100]!r}; GET /v1/models lists them ({served_names(self.router, self.local is not None)})",
                "not_found_error",
            )
        t0 = time.perf_counter()
        asker = credential(headers)
        if self.upstream is not None:
            proxied = self.router.route(req.model, conversation)
            proxied_id = self.router.open_episode(proxied, conversation, asker)
            answer = await self.upstream.chat(proxied, req, headers, t0)
            return {**answer, "feedback_id": proxied_id}, proxied
        assert self.local is not None
        return await self.local.chat(req, base, conversation, asker, t0)

    def feedback(self, outcome: _Feedback, asker: str) -> dict[str, Any]:
        """``POST /v1/feedback``: one episode's outcome, to the version that served it."""
        if outcome.feedback_id is None:
            raise HTTPError(
                422,
                'send "feedback_id": the x-feedback-id header (or feedback_id field) of a chat answer in the episode; '
                "an episode_id alone is the client's own name and proves nothing",
            )
        try:
            label = self.router.feedback(outcome.feedback_id, outcome.model_dump(), asker)
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

    def _release_loser(self, dep: Deployment, decision: Decision, loser: Target) -> None:
        """After a promotion or rollback: the losing version's slot is kept for the name's next canary."""
        if self.engine is not None:
            self.engine.release_slot(dep.stable.name, loser.model)

    async def aclose(self) -> None:
        if self.local is not None:
            self.local.close()
        self.watcher.stop()
        if self.upstream is not None:
            await self.upstream.aclose()
