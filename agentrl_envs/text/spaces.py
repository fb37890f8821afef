"""A ``spaces.Text`` over printable Unicode, cheap to create and working with shared memory.

Gymnasium's ``Text`` defaults to an alphanumeric charset and builds per-instance lookup tables.
:class:`UnicodeText` covers every printable character of the Basic Multilingual Plane, emoji and
pictographs, plus newline and tab; the tables are built once per process and shared.

Gymnasium reads ``Text`` observations out of shared memory once, when an ``AsyncVectorEnv`` is
created, so every later observation comes back stale. For :class:`UnicodeText` the read returns
a live view that decodes the buffer on access (and copies on ``deepcopy``), so
``gym.make_vec(id, vectorization_mode="async")`` works with its defaults.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Text
from gymnasium.vector.utils import shared_memory as _shm

__all__ = ["UnicodeText", "charset", "charset_set"]

_EXTRA_RANGES = ((0x1F000, 0x1FAFF),)  # emoji and pictographs


@functools.lru_cache(maxsize=1)
def _tables() -> tuple[str, frozenset[str], tuple[str, ...], dict[str, np.int32]]:
    chars = ["\t", "\n"]
    for lo, hi in ((0x20, 0xFFFF), *_EXTRA_RANGES):
        for i in range(lo, hi + 1):
            if 0xD800 <= i <= 0xDFFF:
                continue
            ch = chr(i)
            if ch.isprintable():
                chars.append(ch)
    chars.sort()
    text = "".join(chars)
    return text, frozenset(chars), tuple(chars), {c: np.int32(i) for i, c in enumerate(chars)}


def charset_set() -> frozenset[str]:
    """The characters :class:`UnicodeText` admits, as a set."""
    return _tables()[1]


def charset() -> str:
    """Every character :class:`UnicodeText` admits, sorted."""
    return _tables()[0]


class UnicodeText(Text):
    """``Text`` over printable Unicode text (plus newline and tab)."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None) -> None:
        # Initialise the parent with a tiny charset, then share the process-wide tables.
        super().__init__(max_length, min_length=min_length, charset="ab", seed=seed)
        self._share_tables()

    def _share_tables(self) -> None:
        text, char_set, char_list, index = _tables()
        self._char_str, self._char_set, self._char_list, self._char_index = text, char_set, char_list, index

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        char_set = self._char_set
        return all(c in char_set for c in x)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_char_str", "_char_set", "_char_list", "_char_index"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(dict(state))
        self._share_tables()


class _SharedTextView(Sequence[str]):
    """The observations of an ``AsyncVectorEnv`` as a live view of its shared buffer."""

    def __init__(self, space: UnicodeText, buffer: Any, n: int) -> None:
        self._space, self._buffer, self._n = space, buffer, n

    def _row(self, i: int) -> str:
        data = np.frombuffer(self._buffer.get_obj(), dtype=np.int32).reshape((self._n, self._space.max_length))[i]
        chars = self._space.character_list
        limit = len(chars)
        return "".join(chars[v] for v in data if v < limit)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self._row(j) for j in range(self._n)[i])
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._row(i % self._n)

    def __iter__(self) -> Iterator[str]:
        return (self._row(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, _SharedTextView)) else other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return repr(tuple(self))


@_shm.read_from_shared_memory.register(UnicodeText)
def _read_unicode_text(space: UnicodeText, shared_memory: Any, n: int = 1) -> _SharedTextView:
    return _SharedTextView(space, shared_memory, n)
