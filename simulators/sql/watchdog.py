"""One thread per process that interrupts SQLite statements at their deadline.

The progress handler runs every ``PROGRESS_STEPS`` VM opcodes; when each opcode is an expensive
function call (a ``LIKE`` on a 100 kB string), 10,000 opcodes take far longer than the deadline.
``sqlite3_interrupt`` is checked at every loop back-edge instead, so an interrupt sent at the
deadline stops the statement after at most one more row's worth of work. Arming costs a lock and a
dict insert; the thread sleeps until the earliest armed deadline and not at all when none is armed.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time

__all__ = ["Watchdog", "watchdog"]


class Watchdog:
    """Interrupts a connection when its armed deadline passes, unless disarmed first."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A forked child has the lock in whatever state the parent left it and no thread.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: dict[int, tuple[float, sqlite3.Connection]] = {}
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")

    def arm(self, conn: sqlite3.Connection, deadline: float) -> int:
        """Interrupt ``conn`` at ``deadline`` (``time.perf_counter()`` seconds); returns a token."""
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = (deadline, conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentrl-sql-watchdog", daemon=True)
                self._thread.start()
            elif deadline < self._wake_at:
                self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        """Cancel an armed interrupt. After this returns, the interrupt can no longer be sent."""
        with self._cond:
            self._armed.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.perf_counter()
                for token, (deadline, conn) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        try:
                            conn.interrupt()
                        except sqlite3.Error:  # closed meanwhile
                            pass
                self._wake_at = min((d for d, _ in self._armed.values()), default=float("inf"))
                self._cond.wait(None if self._wake_at == float("inf") else self._wake_at - now)


#: The process's watchdog.
watchdog = Watchdog()
