"""What an ``http`` tool call may ask for: one check shared by the tool, the simulator and real backends.

A call is ``{"method", "path", "body"?, "query"?}``. The path is always relative to the service's
base URL: an absolute URL, a scheme-relative ``//host`` path, a backslash, a ``?`` or ``#`` (the
query goes in ``query``), whitespace or a control character (CR/LF header injection) is refused,
so a call can never name another host or smuggle a header. So is a dot segment in any spelling a
gateway in front of a real service might resolve: the path is read as the most lenient
gateway reads it (percent-escapes decoded until nothing changes, ``%uXXXX``, NFKC, backslash as
slash, ``;`` parameters cut off, trailing dots and spaces trimmed), and no segment of that reading
may be ``.``, ``..`` or empty, so the path stays under the base URL however it is normalized. Bodies are JSON objects of at most :data:`MAX_BODY_BYTES`, sent only with
``POST`` and ``PATCH``; query values are scalars. ``null`` (and an empty body) is the same as leaving
``body`` or ``query`` out.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_to_bytes

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
# IIS's %uXXXX escapes (a few gateways still decode them).
_PCT_U = re.compile(r"%[uU]([0-9A-Fa-f]{4})")
#: Rounds of decoding :func:`_gateway_view` applies; a path still changing after them is refused.
_DECODE_ROUNDS = 5
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
    if "//" in path:
        raise RequestError(400, "bad_path", "path holds an empty segment ('//'); name each segment, e.g. /v1/tickets/12")
    _check_gateway_view(path)
    return path


def _gateway_view(path: str) -> str:
    """``path`` as the most lenient gateway in front of a service could read it.

    Gateways differ in how far they decode before they route: some decode percent-escapes more
    than once (``%252e`` is ``%2e`` is ``.``), or accept IIS's ``%u002e``, or fold compatibility
    characters (NFKC: a fullwidth ``．`` is ``.``), or take a backslash for a slash. All of that is
    applied, repeated until nothing changes; the caller then checks every segment of the result.

    Raises:
        RequestError: the escapes are not UTF-8 (an overlong ``%c0%ae`` is a dot to some decoders),
            or more than :data:`_DECODE_ROUNDS` layers deep.
    """
    text = path
    for _ in range(_DECODE_ROUNDS):
        try:
            decoded = _PCT_U.sub(lambda m: chr(int(m.group(1), 16)), text)
            decoded = unicodedata.normalize("NFKC", unquote_to_bytes(decoded).decode("utf-8"))
        except UnicodeError:
            raise RequestError(
                400, "bad_path", "path holds percent-escapes that are not UTF-8 text; escape each character's UTF-8 bytes"
            ) from None
        if decoded == text:
            return text.replace("\\", "/")
        text = decoded
    raise RequestError(400, "bad_path", f"path is percent-encoded more than {_DECODE_ROUNDS - 1} times over; encode it once")


def _check_gateway_view(path: str) -> None:
    """Refuse ``path`` if any gateway's reading of it (:func:`_gateway_view`) could leave the base path.

    In that reading, no segment may be empty (but a trailing slash) or all dots and spaces once its
    ``;`` parameters are cut off (Tomcat and Spring read ``..;x`` as ``..``; Windows trims trailing
    dots and spaces), and no character may be a control character. A path that passes has no
    segment any normalization resolves upwards, so it stays under the base URL however it is read.
    """
    view = _gateway_view(path)
    if any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in view):
        raise RequestError(400, "bad_path", "path holds an encoded control character (CR, LF, NUL, ...); remove it")
    segments = view.split("/")[1:]
    for i, segment in enumerate(segments):
        name = segment.split(";", 1)[0]
        if not name.strip(" ."):
            if name == "" and i == len(segments) - 1:
                continue  # a trailing slash
            if name == "":
                raise RequestError(
                    400,
                    "bad_path",
                    "path holds an empty segment once decoded ('//', an encoded '/' or '\\', or a bare ';' "
                    "parameter); name each segment, e.g. /v1/tickets/12",
                )
            raise RequestError(
                400,
                "bad_path",
                "path may not hold '.' or '..' segments in any spelling (%2e, %252e, %u002e, '..;x', "
                "a backslash for '/', trailing dots or spaces); name the resource directly, e.g. /v1/tickets/12",
            )


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
