"""What goes over HTTP in ``agentrl-train serve``: the error answer, the body read under its limits, JSON checked.

Every route raises :class:`HTTPError` for an answer other than 200; the app turns it into OpenAI's
``{"error": {"message", "type", "code"}}``. Bodies are read up to :data:`MAX_BODY_BYTES` within a
deadline, decoded as one JSON object and validated by pydantic with the first problem named.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

__all__ = [
    "CLIENT_KEY",
    "MAX_BODY_BYTES",
    "HTTPError",
    "as_json",
    "credential",
    "load_json",
    "lone_surrogate",
    "parse_body",
    "read_body",
    "text_chars",
    "validate",
]

MAX_BODY_BYTES = 4 * 1024 * 1024
#: a key of the app's header dict that no HTTP header can have (names are latin-1 without spaces): whether
#: the TCP peer is on this machine
CLIENT_KEY = " client"


class HTTPError(Exception):
    """An answer other than 200: status, OpenAI-style error type and a message that says what to do."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def credential(headers: dict[str, str]) -> str:
    """A digest of the credential a request carries (its Authorization header; "" when none)."""
    got = headers.get("authorization", "")
    return hashlib.sha256(got.encode("utf-8", "surrogateescape")).hexdigest() if got else ""


def text_chars(value: Any) -> int:
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


async def read_body(receive: Callable[..., Awaitable[Any]], headers: dict[str, str], timeout_s: float) -> bytes:
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


def load_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except (ValueError, RecursionError):
        raise HTTPError(400, f"the body is not JSON ({body[:60]!r}); send a JSON object") from None
    if not isinstance(data, dict):
        raise HTTPError(400, "the body must be a JSON object")
    return data


def parse_body(model: type[Any], body: bytes) -> Any:
    return validate(model, load_json(body))


def validate(model: type[Any], data: dict[str, Any]) -> Any:
    where = lone_surrogate(data)
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


def lone_surrogate(data: Any) -> str | None:
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


def as_json(obj: Any) -> bytes:
    return json.dumps(obj).encode()
