"""A whole-request budget for a synchronous httpx request (:class:`Watchdog`).

httpx times each read on its own, so a server that sends a byte every few seconds keeps a request
going for ever. :class:`Watchdog` shuts the request's connection down when its budget is spent,
which wakes the blocked read (or write) with a transport error; the caller checks
:attr:`Watchdog.fired` and raises :class:`OverBudget` instead.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

__all__ = ["OverBudget", "Watchdog"]


class OverBudget(Exception):
    """A request ran past its budget."""


class Watchdog:
    """Shuts a request's connection down once ``seconds`` have passed.

    Pass :meth:`trace` as the request's ``trace`` extension: it watches each connection the request
    opens (and its TLS layer); :meth:`watch` adds one known otherwise (a reused connection, the
    response's ``network_stream``). Call :meth:`cancel` when the request is over.
    """

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._end = time.monotonic() + seconds
        self._streams: list[Any] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's ``trace`` extension: watch each connection the request opens."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self.watch(info.get("return_value"))

    def watch(self, stream: Any) -> None:
        """Shut ``stream`` (an httpcore network stream, or None) down when the budget is spent."""
        if stream is None:
            return
        with self._lock:
            self._streams.append(stream)
            fired = self.fired
        if fired:
            _shut(stream)

    def spent(self) -> bool:
        """Whether the budget is spent (for transports without a socket to shut down)."""
        return time.monotonic() >= self._end

    def cancel(self) -> None:
        with self._lock:
            self._streams.clear()
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            streams = list(self._streams)
        for stream in streams:
            _shut(stream)


def _shut(stream: Any) -> None:
    """Shut down the socket under an httpcore network stream: a read blocked on it returns at once."""
    try:
        sock = stream.get_extra_info("socket")
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):  # closed already, or a stream without a socket
        pass
