"""The chat and completion routes answered by the local model (an :class:`~agentrl_train.serve.engine.Engine`).

A request is tokenized on the encoder pool (:attr:`ServeLimits.max_concurrent_encodings` at once, a
bounded queue, 503 past it), routed to a version by the router, and queued on the model thread with
that version's slot (:attr:`Target.model <agentrl_train.serve.canary.Target.model>`). Routing, the
slot and the queueing happen with no ``await`` in between, so a swap queued before a request runs
before it and one queued after runs after it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl_envs.errors import ConfigError
from agentrl_train.serve.canary import Router, Target
from agentrl_train.serve.chat import ChatRequest, flatten, reply
from agentrl_train.serve.completions import CompletionRequest, check_ids, completion_answer, completion_budget, prompt_of
from agentrl_train.serve.limits import ServeLimits
from agentrl_train.serve.prompts import PromptTooLargeError
from agentrl_train.serve.status import BASE_NAMES, Counters, served_names
from agentrl_train.serve.wire import HTTPError, load_json, validate

__all__ = ["Generation"]


class Generation:
    """Chat completions and vLLM's completions on the local model.

    Args:
        engine: the model, its tokenizer and its slots.
        router: picks the version (and so the slot) of each request, and keeps its numbers.
        limits: request sizes and the encoder pool's size.
        max_new_tokens: default and cap of ``max_tokens``.
        counters: where answered completions are counted.
        log: where failed generations are reported.
    """

    def __init__(
        self,
        engine: Any,
        router: Router,
        limits: ServeLimits,
        max_new_tokens: int,
        counters: Counters,
        log: Callable[[str], None],
    ) -> None:
        self.engine, self.router, self.limits, self.max_new_tokens = engine, router, limits, max_new_tokens
        self.counters, self.log = counters, log
        self.base_names = (*BASE_NAMES, engine.model_name)  #: the names of the base without adapters
        self.base_label = f"base@{Path(engine.model_name).name}"  #: the version the base answers as
        self._encoder = ThreadPoolExecutor(limits.max_concurrent_encodings, thread_name_prefix="agentrl-serve-encode")
        self._encodes_waiting = 0

    async def chat(
        self, req: ChatRequest, base: bool, conversation: str | None, credential: str, t0: float
    ) -> tuple[dict[str, Any], Target | None]:
        """A chat completion by the base (``base``) or the version the router picks for ``conversation``."""
        budget = min(req.max_completion_tokens or req.max_tokens or self.max_new_tokens, self.max_new_tokens)
        messages = [flatten(m) for m in req.messages]
        prompt = await self.encode(messages, req.tools, budget)
        if not base and req.model not in self.router.deployments:  # unloaded while the prompt was tokenized
            raise HTTPError(404, self.no_model(req.model), "not_found_error")
        # Route, look up the slot and queue the job with no await in between: a swap queued before this
        # point runs before the job (and its version is the one routed to), one queued after runs after it.
        target = None if base else self.router.route(req.model, conversation)
        feedback_id = self.router.open_episode(target, conversation, credential) if target is not None else None
        slot = target.model if target is not None else None
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
        message, finish, parsed = reply(text, finish, req.tools)
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

    async def encode(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, budget: int) -> list[int]:
        """Tokenize on the encoder pool: :attr:`ServeLimits.max_concurrent_encodings` at once, a bounded queue."""
        try:
            return await self.on_encoder(
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

    async def on_encoder(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` on the encoder pool: :attr:`ServeLimits.max_concurrent_encodings` at once, a bounded queue (503 past it)."""
        lim = self.limits
        if self._encodes_waiting >= lim.max_concurrent_encodings + lim.max_waiting_encodings:
            raise HTTPError(503, "the server is tokenizing too many requests; retry in a second", "server_busy")
        self._encodes_waiting += 1
        try:
            return await asyncio.wrap_future(self._encoder.submit(fn, *args, **kwargs))
        finally:
            self._encodes_waiting -= 1

    async def completions(self, body: bytes) -> dict[str, Any]:
        """``POST /v1/completions`` (:mod:`agentrl_train.serve.completions`): one prompt, queued on the model thread."""
        data = load_json(body)
        lim, prompt = self.limits, data.get("prompt")
        if isinstance(prompt, list) and len(prompt) > lim.max_prompt_tokens:
            raise HTTPError(
                413, f"the prompt has {len(prompt)} tokens; the limit is {lim.max_prompt_tokens} (--max-prompt-tokens)"
            )
        if isinstance(prompt, str) and len(prompt) > lim.max_prompt_chars:
            raise HTTPError(
                413, f"the prompt has {len(prompt)} characters; the limit is {lim.max_prompt_chars} (--max-prompt-chars)"
            )
        req = validate(CompletionRequest, data)
        base = req.model in self.base_names
        if not base and req.model not in self.router.deployments:
            raise HTTPError(404, self.no_model(req.model), "not_found_error")
        try:
            budget = completion_budget(req, self.max_new_tokens)
            ids = prompt_of(req)
            if isinstance(ids, str):
                ids = await self.on_encoder(self.engine.prompt_ids, ids)
            stop_ids = list(req.stop_token_ids or [])
            check_ids(ids, stop_ids, self.engine.vocab_size, self.engine.max_positions, budget)
        except ConfigError as exc:
            raise HTTPError(400, str(exc)) from None
        # Route, look up the slot and queue the job with no await in between (as chat): a load, swap or
        # unload queued before this point runs before the job, one queued after runs after it.
        if not base and req.model not in self.router.deployments:  # unloaded while the prompt was tokenized
            raise HTTPError(404, self.no_model(req.model), "not_found_error")
        target = None if base else self.router.route(req.model, None)
        slot = target.model if target is not None else None
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

    def no_model(self, model: str) -> str:
        return f"the model {model[:100]!r} does not exist; GET /v1/models lists them ({served_names(self.router, True)})"

    def close(self) -> None:
        self._encoder.shutdown(wait=False, cancel_futures=True)
