"""Format-invariant matching of answers, program output and email bodies.

Checkers never see raw text: markup (HTML/XML tags, Markdown emphasis, code fences), emoji and
pictographs are stripped first, so decorating an answer changes nothing. Number matching has a
cap on how many numbers the text may hold, so stuffing a text with numbers earns no credit.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["contains_figure", "contains_name", "extract_numbers", "normalize_text"]

_TAG = re.compile(r"<[^<>]{0,200}>")
_MARKUP = re.compile(r"[*_`#~|>]+")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_SPACE = re.compile(r"\s+")
# Words a policy might add to look successful; checkers never count them.
_CLAIMS = re.compile(
    r"\b(success(ful(ly)?)?|succeeded|passed|pass|correct|verified|done|complete(d)?|all tests passed|ok)\b[!.]*",
    re.IGNORECASE,
)


def normalize_text(text: str) -> str:
    """Text with tags, Markdown markup, emoji and other symbols and "success"-style claims
    removed, and whitespace collapsed."""
    text = _TAG.sub(" ", text)
    text = _MARKUP.sub(" ", text)
    text = "".join(ch for ch in text if not _is_decoration(ch))
    text = _CLAIMS.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


def _is_decoration(ch: str) -> bool:
    cat = unicodedata.category(ch)
    # So: other symbols (emoji, pictographs); Cf/Co/Cs/Cn: format, private, surrogate, unassigned;
    # Mn after stripping covers emoji variation selectors and combining marks used as decoration.
    return cat in ("So", "Sk", "Cf", "Co", "Cs", "Cn") or ord(ch) in (0xFE0F, 0xFE0E, 0x20E3)


def extract_numbers(text: str) -> list[float]:
    """Numbers in (normalized) text; ``12,345.6`` is one number."""
    out = []
    for match in _NUMBER.findall(normalize_text(text)):
        try:
            out.append(float(match.replace(",", "")))
        except ValueError:
            continue
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.011 + 1e-6 * abs(b)


def contains_figure(text: str, figures: Iterable[float], max_numbers: int) -> bool:
    """Every expected figure appears in ``text`` and the text holds at most ``max_numbers`` numbers."""
    found = extract_numbers(text)
    if len(found) > max_numbers:
        return False
    return all(any(_close(x, f) for x in found) for f in figures)


def contains_name(text: str, name: str, max_extra_words: int = 6) -> bool:
    """``name`` appears as whole words and the text is not padded with many other words."""
    words = _words(normalize_text(text))
    target = _words(name)
    if not target or len(words) > len(target) + max_extra_words:
        return False
    n = len(target)
    return any(words[i : i + n] == target for i in range(len(words) - n + 1))


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.casefold())
