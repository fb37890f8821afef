"""Text edits the tools' candidate perturbations share (see :mod:`agentrl_envs.core.candidates`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["as_list", "each", "numbers", "shift_month", "shift_numbers", "swap_words"]


def swap_words(text: str, swaps: list[tuple[str, str]]) -> list[str]:
    """One variant per pair ``(a, b)`` whose ``a`` occurs, with its first occurrence replaced."""
    return [text.replace(a, b, 1) for a, b in swaps if a in text]


def each(text: str, pattern: str, make: Callable[[re.Match[str]], str]) -> list[str]:
    """One variant per match of ``pattern``, with only that match replaced."""
    return [text[: m.start()] + make(m) + text[m.end() :] for m in re.finditer(pattern, text)]


def shift_month(year: str, month: str, by: int) -> str:
    """``YYYY-MM`` moved by ``by`` months."""
    index = int(year) * 12 + int(month) - 1 + by
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def numbers(text: str) -> list[str]:
    """The distinct numbers of ``text`` in order."""
    return list(dict.fromkeys(re.findall(r"-?\d+(?:\.\d+)?", text)))


def as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def shift_numbers(text: str) -> str:
    """Every number of ``text`` changed a little (x 1.1 + 1 for decimals, + 1 for integers)."""

    def bump(m: re.Match[str]) -> str:
        value = float(m.group(0))
        return f"{value * 1.1 + 1:.2f}" if "." in m.group(0) else str(int(value) + 1)

    return re.sub(r"\d+(?:\.\d+)?", bump, text, count=0)
