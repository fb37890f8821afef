"""The open episodes of a simulator, with idle expiry and a cap.

:class:`EpisodeTable` keeps episodes in least-recently-used order (an ``OrderedDict``): a call on
an episode moves it to the end, so the ones idle longest are always at the front, and expiry looks
only there. Every operation is O(1) (expiry amortized: each episode is expired once), so a server
holding thousands of episodes pays a dict lookup and a lock per request.

Two limits, both off unless set (``agentrl-envs serve`` sets them, see ``ServeLimits``):

- ``idle_s``: an episode no call touched for that long is expired (:meth:`EpisodeTable.expire`
  hands it back for the caller to close). One with a call in flight (``busy``) is never expired.
- ``max_open``: :meth:`EpisodeTable.full` says when a new episode must be refused. Refused, not
  made room for: evicting the least recently used episode would let any client end another's live
  episode; idle expiry reclaims the ones clients abandoned.

``clock`` (default :func:`time.monotonic`) is injectable, so tests move time instead of sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

__all__ = ["EpisodeTable", "check_episode_limits"]

E = TypeVar("E")


def check_episode_limits(max_open: int | None, idle_s: float | None) -> None:
    """Raise ValueError naming the value to use when ``max_open`` or ``idle_s`` is not one."""
    if max_open is not None and (not isinstance(max_open, int) or isinstance(max_open, bool) or not 1 <= max_open <= 1 << 24):
        raise ValueError(f"max_episodes={max_open!r}: use a whole number from 1 to {1 << 24}, or None for no cap")
    if idle_s is not None and (
        not isinstance(idle_s, (int, float)) or isinstance(idle_s, bool) or not math.isfinite(idle_s) or idle_s <= 0
    ):
        raise ValueError(f"episode_idle_s={idle_s!r}: use a finite number of seconds above 0, or None to never expire")


class EpisodeTable(Mapping[str, E]):
    """Open episodes by id, least recently used first (a read-only mapping; reading is not a use).

    Args:
        max_open: the most episodes open at once (None: no cap).
        idle_s: seconds without a call after which an episode is expired (None: never).
        clock: seconds from an arbitrary origin, never going back.
    """

    def __init__(
        self, max_open: int | None = None, idle_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        check_episode_limits(max_open, idle_s)
        self.max_open, self.idle_s, self.clock = max_open, idle_s, clock
        self._items: OrderedDict[str, tuple[E, float]] = OrderedDict()
        self._lock = threading.Lock()
        #: episodes expired so far
        self.expired_count = 0

    def set_limits(self, max_open: int | None, idle_s: float | None) -> None:
        """Change both limits (open episodes stay; any over a lower cap stay until closed)."""
        check_episode_limits(max_open, idle_s)
        with self._lock:
            self.max_open, self.idle_s = max_open, idle_s

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, episode_id: object) -> bool:
        return episode_id in self._items

    def __getitem__(self, episode_id: str) -> E:
        return self._items[episode_id][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def ids(self) -> list[str]:
        """The open episodes' ids, least recently used first (a copy: safe while episodes close)."""
        return list(self._items)

    def get(self, episode_id: str, default: None = None) -> E | None:  # type: ignore[override]
        """The episode, without counting as a use (ownership checks, lookups that serve nobody)."""
        item = self._items.get(episode_id)
        return None if item is None else item[0]

    def touch(self, episode_id: str) -> E | None:
        """The episode, now its most recent use (a call on it); None if it is not open."""
        with self._lock:
            item = self._items.get(episode_id)
            if item is None:
                return None
            self._items[episode_id] = (item[0], self.clock())
            self._items.move_to_end(episode_id)
            return item[0]

    def put(self, episode_id: str, episode: E) -> None:
        """Add (or replace) an episode, as just used. The caller checks :meth:`full` first."""
        with self._lock:
            self._items[episode_id] = (episode, self.clock())
            self._items.move_to_end(episode_id)

    def pop(self, episode_id: str) -> E | None:
        with self._lock:
            item = self._items.pop(episode_id, None)
        return None if item is None else item[0]

    def full(self) -> bool:
        """Whether a new episode (not a replacement of an open id) would pass ``max_open``."""
        return self.max_open is not None and len(self._items) >= self.max_open

    def expire(self, busy: Callable[[E], bool] = lambda _: False) -> list[tuple[str, E]]:
        """Remove and return the episodes idle for ``idle_s`` or more (none when ``idle_s`` is None).

        A ``busy`` one (a call in flight) counts as used now instead. Looks at the front only: O(1)
        when nothing is due, one step per episode expired or found busy.
        """
        if self.idle_s is None or not self._items:
            return []
        try:  # the common case, nothing due, without the lock (the locked pass below decides)
            oldest = next(iter(self._items.values()))[1]
            if self.clock() - oldest < self.idle_s:
                return []
        except (StopIteration, RuntimeError):  # emptied or changed by another thread meanwhile
            pass
        out: list[tuple[str, E]] = []
        with self._lock:
            now = self.clock()
            while self._items:
                episode_id, (episode, used) = next(iter(self._items.items()))
                if now - used < self.idle_s:
                    break
                if busy(episode):
                    self._items[episode_id] = (episode, now)
                    self._items.move_to_end(episode_id)
                    continue
                del self._items[episode_id]
                out.append((episode_id, episode))
            self.expired_count += len(out)
        return out
