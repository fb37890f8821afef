"""``agentrl-train serve --upstream URL``: chat completions answered by another OpenAI-compatible server.

The router picks a version as for a local model; the upstream is asked for that version's ``model``
name. Whatever goes wrong upstream is a 502 ``upstream_error`` naming the upstream's status and its
message, counted against the version asked; an answer is read up to :data:`MAX_UPSTREAM_BYTES` and no
further.
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentrl_train.serve.canary import Router, Target
from agentrl_train.serve.chat import ChatRequest, reply
from agentrl_train.serve.wire import HTTPError

__all__ = ["MAX_UPSTREAM_BYTES", "PASSED_UPSTREAM_STATUSES", "Upstream", "read_upstream", "upstream_answer"]

MAX_UPSTREAM_BYTES = 32 * 1024 * 1024  # an upstream's answer is read up to this, never whole past it
#: upstream statuses passed to the client as they are: the request's own fault, or a rate limit to back off
#: from (a 502 would be retried as is); every other upstream failure is a 502
PASSED_UPSTREAM_STATUSES = (400, 413, 422, 429)


class Upstream:
    """The server behind ``--upstream`` and the one HTTP client that talks to it.

    Args:
        url: the upstream's root (``http://host:port``, no ``/v1``).
        router: where each answer and failure is recorded, per version.
    """

    def __init__(self, url: str, router: Router) -> None:
        self.url = url
        self.router = router
        self._client: Any = None

    async def chat(self, target: Target, req: ChatRequest, headers: dict[str, str], t0: float) -> dict[str, Any]:
        """The upstream's answer for ``target``, recorded against it (a failure is a 502 ``upstream_error``, or the
        upstream's status for what the request itself caused)."""
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
        body = req.model_dump(exclude_none=True)
        body["model"] = target.model
        fwd = {"content-type": "application/json"}
        if headers.get("x-upstream-authorization"):
            fwd["authorization"] = headers["x-upstream-authorization"]
        try:
            status, content = await read_upstream(self._client, f"{self.url}/v1/chat/completions", body, fwd)
        except httpx.HTTPError as exc:
            self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            raise HTTPError(
                502, f"upstream {self.url} failed ({type(exc).__name__}); check that it is up", "upstream_error"
            ) from None
        except _TooBig as exc:
            self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            raise HTTPError(
                502,
                f"upstream {self.url} answered {exc.status} with a body over {MAX_UPSTREAM_BYTES} bytes "
                f"({MAX_UPSTREAM_BYTES >> 20} MiB, this server's cap); is --upstream an OpenAI-compatible server, "
                "and is max_tokens sane?",
                "upstream_error",
            ) from None
        answer, problem = upstream_answer(status, content)
        if problem is not None:
            # 502, except for what the request itself caused (too long, rate limited): a client retries a
            # 502, and the upstream's 401 or 404 passed through would read as this server's own.
            self.router.record(target, ok=False, parsed=False, latency_s=time.perf_counter() - t0)
            code = status if status in PASSED_UPSTREAM_STATUSES else 502
            raise HTTPError(code, f"upstream {self.url} answered {status}: {problem}", "upstream_error")
        message = answer["choices"][0].get("message") or {}
        parsed = bool(message.get("tool_calls")) or reply(str(message.get("content") or ""), "stop", req.tools)[2]
        self.router.record(target, ok=True, parsed=parsed, latency_s=time.perf_counter() - t0)
        answer["model"], answer["system_fingerprint"] = req.model, target.label
        return answer

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class _TooBig(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def read_upstream(client: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
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


def upstream_answer(status: int, content: bytes) -> tuple[Any, str | None]:
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
