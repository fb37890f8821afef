"""Linear-time replacements for SQLite's quadratic string functions.

SQLite's built-in ``ltrim(X, Y)``, ``rtrim(X, Y)``, ``trim(X, Y)``, ``instr(X, Y)`` and
``replace(X, Y, Z)`` compare every position of ``X`` with all of ``Y``: O(|X| x |Y|) inside one C
call, which never reaches the progress handler or ``sqlite3_interrupt``. One ``ltrim`` of two
100,000-character strings is 10^10 comparisons (minutes; the review measured 23.7 s against a 2 s
deadline with longer strings). These versions give the same results in O(|X| + |Y|): a set of trim
characters, and CPython's ``str.find`` / ``str.count`` / ``str.replace``, which switch to the
two-way algorithm when a naive scan would go quadratic. They are registered on every episode
connection under the built-in names, for the argument counts that are quadratic (the one-argument
``trim(X)`` family only strips spaces and stays built in).

Semantics follow SQLite 3.40's ``func.c``: NULL in, NULL out; numbers are converted to text the
way SQLite does; ``instr`` of two BLOBs counts bytes, otherwise characters; ``replace`` with an
empty pattern returns ``X`` unchanged (a number keeps its type); a result longer than the connection's
length limit is an error, as in SQLite. One difference: a BLOB that is not valid UTF-8 is read as
text with U+FFFD for the bad bytes (SQLite would carry the raw bytes into a TEXT value).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FunctionLimitError", "register", "take_refusal"]

#: Up to this many distinct trim characters, ``str.strip(chars)`` (a C loop over the chars) is
#: faster than a Python loop over a set; past it, the set keeps the cost linear.
_STRIP_CHARS = 32

_local = threading.local()
#: Why a function refused during the statement this thread runs (a function runs in the thread of
#: its statement): read by the caller with :func:`take_refusal`.
_refusals = threading.local()


class FunctionLimitError(Exception):
    """A function result would pass the connection's string length limit."""


def _real_text(value: float) -> str:
    """A REAL as SQLite renders it as text (``1.0e+20``, not Python's ``1e+20``)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = sqlite3.connect(":memory:", check_same_thread=False)
    return str(conn.execute("SELECT CAST(? AS TEXT)", (value,)).fetchone()[0])


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, int):
        return str(value)
    return _real_text(float(value))


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _trim(left: bool, right: bool) -> Callable[[Any, Any], str | None]:
    def trim(value: Any, chars: Any) -> str | None:
        if value is None or chars is None:
            return None
        text, charset = _text(value), _text(chars)
        if not charset:
            return text
        distinct = dict.fromkeys(charset)
        if len(distinct) <= _STRIP_CHARS:
            strip = "".join(distinct)
            if left and right:
                return text.strip(strip)
            return text.lstrip(strip) if left else text.rstrip(strip)
        members = set(distinct)
        start, end = 0, len(text)
        if left:
            while start < end and text[start] in members:
                start += 1
        if right:
            while end > start and text[end - 1] in members:
                end -= 1
        return text[start:end]

    return trim


def _instr(haystack: Any, needle: Any) -> int | None:
    if haystack is None or needle is None:
        return None
    if isinstance(haystack, bytes) and isinstance(needle, bytes):
        return haystack.find(needle) + 1 if needle else 1
    needle_text = _text(needle)
    return _text(haystack).find(needle_text) + 1 if needle_text else 1


def _replace(limit: Callable[[], int]) -> Callable[[Any, Any, Any], Any]:
    def replace(value: Any, pattern: Any, replacement: Any) -> Any:
        if value is None or pattern is None:
            return None
        pattern_text = _text(pattern)
        if pattern_text[:1] in ("", "\x00"):
            # SQLite returns X itself: numbers keep their type, a BLOB comes back as TEXT.
            return _text(value) if isinstance(value, bytes) else value
        if replacement is None:
            return None
        text, new = _text(value), _text(replacement)
        count = text.count(pattern_text)
        if count == 0:
            return text
        size = _utf8_len(text) + count * (_utf8_len(new) - _utf8_len(pattern_text))
        if size > limit():
            raise FunctionLimitError(f"replace() would make a {size:,}-byte string; the limit is {limit():,} bytes")
        return text.replace(pattern_text, new)

    return replace


_LTRIM, _RTRIM, _BOTH_TRIM = _trim(True, False), _trim(False, True), _trim(True, True)


def take_refusal() -> str | None:
    """Why a function refused (a :class:`FunctionLimitError`) since the last call in this thread; None if none did."""
    message: str | None = getattr(_refusals, "message", None)
    _refusals.message = None
    return message


@functools.lru_cache(maxsize=8)
def _reporting_replace(max_length: int) -> Callable[..., Any]:
    """``replace`` for connections whose length limit is ``max_length``, refusals kept for :func:`take_refusal`."""
    replace_within = _replace(lambda: max_length)

    def replace(*args: Any) -> Any:
        try:
            return replace_within(*args)
        except FunctionLimitError as exc:
            _refusals.message = str(exc)
            raise

    return replace


def register(conn: sqlite3.Connection, max_length: int) -> None:
    """Register the linear-time functions on ``conn``, whose SQLITE_LIMIT_LENGTH is ``max_length``.

    Every function is shared by all connections (none is made per connection, so an episode's
    database costs few objects); why ``replace`` refused is read with :func:`take_refusal` in the
    thread that ran the statement.
    """
    conn.create_function("ltrim", 2, _LTRIM, deterministic=True)
    conn.create_function("rtrim", 2, _RTRIM, deterministic=True)
    conn.create_function("trim", 2, _BOTH_TRIM, deterministic=True)
    conn.create_function("instr", 2, _instr, deterministic=True)
    conn.create_function("replace", 3, _reporting_replace(max_length), deterministic=True)
