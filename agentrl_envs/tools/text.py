"""Text helpers shared by the tools: safe, bounded rendering of values."""

from __future__ import annotations

from typing import Any

__all__ = ["cell", "clip", "printable"]

_ESCAPES = {"\r": "\\r", "\x1b": "\\x1b"}


def printable(text: str) -> str:
    """Escape control characters (except newline and tab) and lone surrogates, so observations stay
    printable text whatever the services or the agent put in them."""
    out = []
    for ch in text:
        if ch == "\n" or ch == "\t" or (ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF):
            out.append(ch)
        else:
            out.append(_ESCAPES.get(ch) or f"\\u{ord(ch):04x}")
    return "".join(out)


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def cell(value: Any, limit: int = 200) -> str:
    text = "NULL" if value is None else str(value)
    if any(c in text for c in ',"\n'):
        text = '"' + text.replace('"', '""') + '"'
    return clip(text, limit)
