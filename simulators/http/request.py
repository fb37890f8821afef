"""What an ``http`` tool call may ask for: one check shared by the tool, the simulator and real backends.

A call is ``{"method", "path", "body"?, "query"?}``. The path is always relative to the service's
base URL: an absolute URL, a scheme-relative ``//host`` path, a dot segment (``..``, also
percent-encoded), a backslash, a ``?`` or ``#`` (the query goes in ``query``), whitespace or a
control character (CR/LF header injection) is refused, so a call can never name another host or
smuggle a header. Bodies are JSON objects of at most :data:`MAX_BODY_BYTES`, sent only with
``POST`` and ``PATCH``; query values are scalars. ``null`` (and an empty body) is the same as leaving
``body`` or ``query`` out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_PATH_CHARS",
    "MAX_QUERY_KEYS",
    "METHODS",
    "HTTPCall",
    "RequestError",
    "check_call",
]

#: The methods the tool speaks (a real backend may allow fewer).
METHODS = ("GET", "POST", "PATCH", "DELETE")
#: The largest body (as compact JSON, UTF-8) a call may send.
MAX_BODY_BYTES = 64 << 10
MAX_PATH_CHARS = 2048
MAX_QUERY_KEYS = 32
MAX_QUERY_VALUE_CHARS = 1000
_FIELDS = frozenset({"method", "path", "body", "query"})
# RFC 3986 path characters (unreserved, sub-delims, ':', '@', '/', and percent escapes).
_PATH = re.compile(r"^/[A-Za-z0-9\-._~%!$&'()*+,;=:@/]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


class RequestError(Exception):
    """A call the service refuses before it is sent: ``status``, ``kind`` and a message saying what to do."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(status, kind, message)
        self.status, self.kind, self.message = status, kind, message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class HTTPCall:
    """A checked call: method, relative path, query (values as the text a URL carries) and body (or None)."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None


def check_call(payload: Any, methods: tuple[str, ...] = METHODS) -> HTTPCall:
    """The :class:`HTTPCall` of a tool call's arguments.

    Args:
        payload: the call's arguments.
        methods: the methods allowed (a 405 ``method_not_allowed`` for one of :data:`METHODS` outside them).

    Raises:
        RequestError: the call is malformed (400/413/422) or uses a method outside ``methods`` (405).
    """
    if not isinstance(payload, dict):
        raise RequestError(422, "bad_arguments", "the arguments must be an object {method, path, body?, query?}")
    unknown = sorted(str(k)[:40] for k in set(payload) - _FIELDS)
    if unknown:
        raise RequestError(422, "bad_arguments", f"unknown field(s) {unknown}; use method, path, body, query")
    method = payload.get("method")
    if not isinstance(method, str) or method not in METHODS:
        raise RequestError(422, "bad_arguments", f"method must be one of {', '.join(METHODS)}, got {str(method)[:20]!r}")
    if method not in methods:
        raise RequestError(
            405, "method_not_allowed", f"{method} is not allowed by this service's allow-list; use {', '.join(methods)}"
        )
    path = _check_path(payload.get("path"))
    query = _check_query(payload.get("query"))
    body = payload.get("body")
    if body == {}:
        body = None  # an empty body is no body (models send {} with a GET)
    if body is not None:
        if not isinstance(body, dict):
            raise RequestError(422, "bad_arguments", "body must be a JSON object")
        if method not in ("POST", "PATCH"):
            raise RequestError(400, "bad_request", f"{method} takes no body; send fields in query, or use POST or PATCH")
        try:
            size = len(json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8"))
        except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
            raise RequestError(422, "bad_arguments", "body must be plain JSON (finite numbers, valid text)") from None
        if size > MAX_BODY_BYTES:
            raise RequestError(413, "too_large", f"body is {size} bytes of JSON; the limit is {MAX_BODY_BYTES}")
    return HTTPCall(method, path, query, body)


def _check_path(path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise RequestError(422, "bad_arguments", "path must be a string starting with '/' (e.g. /openapi.json)")
    if len(path) > MAX_PATH_CHARS:
        raise RequestError(413, "too_large", f"path is {len(path)} characters; the limit is {MAX_PATH_CHARS}")
    if "://" in path or path.startswith("//") or not path.startswith("/"):
        raise RequestError(
            400, "bad_path", "path must be relative to the service (start with a single '/'), not a URL of another host"
        )
    if any(c in path for c in "?#"):
        raise RequestError(400, "bad_path", "put query parameters in 'query', not in the path")
    if not _PATH.fullmatch(path):
        raise RequestError(400, "bad_path", "path holds characters a URL path cannot (whitespace, control, backslash, ...)")
    decoded = unquote(path)
    if any(ord(c) < 32 or c in "\\\x7f" for c in decoded) or "//" in path:
        raise RequestError(400, "bad_path", "path holds an encoded control character, a backslash or an empty segment")
    if any(segment in (".", "..") for segment in decoded.split("/")):
        raise RequestError(400, "bad_path", "path may not hold '.' or '..' segments")
    return path


def _check_query(query: Any) -> dict[str, str]:
    if query is None:
        return {}
    if not isinstance(query, dict):
        raise RequestError(422, "bad_arguments", "query must be an object of {name: string or number}")
    if len(query) > MAX_QUERY_KEYS:
        raise RequestError(413, "too_large", f"query has {len(query)} parameters; the limit is {MAX_QUERY_KEYS}")
    out: dict[str, str] = {}
    for key, value in query.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise RequestError(422, "bad_arguments", f"query parameter name {str(key)[:40]!r} is not a plain name")
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(422, "bad_arguments", f"query parameter {key!r} is not a finite number")
        if isinstance(value, str):
            if len(value) > MAX_QUERY_VALUE_CHARS:
                raise RequestError(413, "too_large", f"query parameter {key!r} is over {MAX_QUERY_VALUE_CHARS} characters")
            if any(ord(c) < 32 or c == "\x7f" for c in value) or _has_surrogate(value):
                raise RequestError(400, "bad_request", f"query parameter {key!r} holds control characters or invalid text")
        elif not isinstance(value, (int, float, bool)):
            raise RequestError(422, "bad_arguments", f"query parameter {key!r} must be a string or a number")
        # As text, written as a URL's query carries it (httpx's rule), so the simulator and a real
        # service over the wire see the same values.
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
