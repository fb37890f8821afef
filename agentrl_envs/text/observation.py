"""Text that fits an observation: escaped to the observation charset, clipped to a limit, CSV cells.

Shared by the env core and the tools' renderers (it is a helper, not a tool, so it sits beside them).
"""

from __future__ import annotations

from typing import Any

__all__ = ["cell", "clip", "printable"]

_ESCAPES = {"\r": "\\r", "\x1b": "\\x1b"}


def printable(text: str) -> str:
    """Escape every character outside the observation charset (control characters other than
    newline and tab, lone surrogates, rare astral characters), so observations stay inside
    :class:`~agentrl_envs.text.spaces.UnicodeText` whatever the services or the agent put in them."""
    from agentrl_envs.text.spaces import charset_set

    allowed = charset_set()
    if allowed.issuperset(text):  # one C loop: this runs on every observation
        return text
    out = []
    for ch in text:
        if ch in allowed:
            out.append(ch)
        elif ord(ch) > 0xFFFF:
            out.append(f"\\U{ord(ch):08x}")
        else:
            out.append(_ESCAPES.get(ch) or f"\\u{ord(ch):04x}")
    return "".join(out)


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def cell(value: Any, limit: int = 200) -> str:
    text = "NULL" if value is None else str(value)
    if "," in text or '"' in text or "\n" in text:
        text = '"' + text.replace('"', '""') + '"'
    return clip(text, limit)
