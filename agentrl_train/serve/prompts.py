"""How ``agentrl-train serve`` keeps a client's text from becoming special tokens, and fits a chat to the context.

The chat template is rendered with a placeholder for each string of the messages and tools
(:class:`Placeholders`); :meth:`~agentrl_train.serve.engine.Engine.encode` tokenizes the template's
own text with special tokens on and each client string as text. :func:`fit_turns` drops the oldest
turns until the prompt fits. Nothing here touches torch or a tokenizer.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["Markup", "Placeholders", "PromptTooLargeError", "fit_turns"]

_WORD = re.compile(r"\w{0,64}", re.ASCII)


class PromptTooLargeError(ConfigError):
    """A conversation has more tokens than the server takes in one request, before old turns are dropped."""


class Markup(str):
    """Text the server itself wrote into a message (the ``<tool_call>`` tags around a call): its
    special-token spellings are special tokens. Every other string of a message is the client's and
    is tokenized as text."""


def is_plain(text: str, specials: list[str]) -> bool:
    """A word of ASCII letters, digits and ``_`` that spells none of ``specials``: safe as template text."""
    return _WORD.fullmatch(text) is not None and not any(t in text for t in specials)


class Placeholders:
    """The client's strings of one conversation, each swapped for a placeholder a client cannot write in advance.

    Args:
        specials: the tokenizer's special and added spellings (a tool schema's plain words stay as they are).
    """

    def __init__(self, specials: list[str]) -> None:
        self.texts: list[str] = []  #: the client's strings, by placeholder number
        self._nonce = secrets.token_hex(8)
        self.pattern = re.compile(f"AGENTRLPH{self._nonce}N(\\d+)X")  #: group 1 is the placeholder's number
        self._specials = specials

    def hold(self, text: str) -> str:
        self.texts.append(text)
        return f"AGENTRLPH{self._nonce}N{len(self.texts) - 1}X"

    def held(self, value: Any) -> Any:
        """The strings of a tool schema, keys included, held; plain words ("function", "type") stay: the template may look."""
        if isinstance(value, str):
            return value if is_plain(value, self._specials) else self.hold(value)
        if isinstance(value, dict):
            return {self.held(k) if isinstance(k, str) else k: self.held(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.held(v) for v in value]
        return value

    def content(self, value: Any) -> str:
        """A message's ``content`` (a string, or a list of strings and :class:`Markup`) with the client's strings held."""
        pieces = value if isinstance(value, list) else [value or ""]
        return "".join(p if isinstance(p, Markup) else self.hold(str(p)) for p in pieces)


def fit_turns(render: Callable[[int], list[int]], turns: int, max_tokens: int) -> list[int]:
    """The longest prompt of at most ``max_tokens``: ``render(drop)`` is the prompt without the oldest
    ``2 * drop`` of its ``turns`` turns.

    Raises:
        ConfigError: the prompt is over ``max_tokens`` even with every old turn dropped.
    """
    ids = render(0)
    if len(ids) <= max_tokens:
        return ids
    # Fewer turns, fewer tokens: bisect on how many pairs to drop (a turn at a time re-rendered a
    # 4,000-turn conversation 2,000 times, minutes of CPU for one request).
    lo, hi = 0, (turns + 1) // 2  # lo is too long; hi drops every turn
    best = render(hi)
    if len(best) > max_tokens:
        raise ConfigError(
            f"the prompt is {len(best)} tokens after dropping old turns; this model takes {max_tokens} "
            "(its context minus max_tokens): send a shorter system prompt or instruction, or lower max_tokens"
        )
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ids = render(mid)
        if len(ids) <= max_tokens:
            hi, best = mid, ids
        else:
            lo = mid
    return best
