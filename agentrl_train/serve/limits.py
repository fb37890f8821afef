"""What one client may make ``agentrl-train serve`` hold: request sizes, time to send, connections.

Two layers, because uvicorn alone has neither a deadline for a request's head nor a connection cap
that keeps serving (``limit_concurrency`` answers 503 to everyone once idle sockets fill it):

- :class:`ServeLimits`, checked by the app: messages, characters and tokens per chat request (before
  any tokenization, 413 past them), chats encoded at once, and the whole body's read deadline (408).
- :func:`guarded_protocol`, uvicorn's own HTTP protocol class with a head deadline and a connection
  cap: a connection that has not sent a whole request head within :attr:`ServeLimits.header_timeout_s`
  of opening (or of its last answer) is closed, a head past :attr:`ServeLimits.max_head_bytes` gets a
  431, and past :attr:`ServeLimits.max_connections` the connection idle longest (waiting for a head,
  no request running) is closed to make room; only when every connection has a request running is the
  new one answered 503. So idle sockets, however many, never lock a client with a request out.
"""

from __future__ import annotations

import ipaddress
import json
import time
from dataclasses import dataclass, fields
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["ServeLimits", "guarded_protocol", "is_loopback"]


@dataclass(frozen=True)
class ServeLimits:
    """Per-request and per-server bounds of ``agentrl-train serve`` (CLI: ``--max-...`` flags)."""

    max_messages: int = 1024
    """Messages in one chat request (413 past it)."""
    max_prompt_chars: int = 262_144
    """Characters of message text, tool calls and tool schemas in one chat request (413 past it); at most
    4 UTF-8 bytes each, so this also bounds the tokens a byte-level tokenizer can make of them."""
    max_prompt_tokens: int = 131_072
    """Tokens of the whole conversation before old turns are dropped to fit the context (413 past it)."""
    max_concurrent_encodings: int = 2
    """Chat requests tokenized at once (each holds its token lists); others wait their turn."""
    max_waiting_encodings: int = 64
    """Chat requests waiting to be tokenized; past it the answer is 503 with Retry-After."""
    header_timeout_s: float = 10.0
    """Seconds a connection may take to send a whole request head (from opening, or its last answer)."""
    body_timeout_s: float = 30.0
    """Seconds a request may take to send its whole body (408 past it)."""
    write_timeout_s: float = 60.0
    """Seconds an answer may wait for a client that does not read it; then the connection is dropped."""
    max_head_bytes: int = 65_536
    """Bytes of one request head (request line and headers; 431 past it)."""
    max_connections: int = 256
    """Open connections; past it the one idle longest is closed (see the module docstring)."""
    keep_alive_s: float = 5.0
    """Seconds an idle keep-alive connection stays open after an answer."""
    max_adapters: int = 64
    """Adapter names served at once, ``--adapter`` ones and those loaded with ``POST /v1/load_lora_adapter``
    (a load past it answers 400: unload one first)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise ConfigError(f"{flag} {value!r}: use a number > 0 (default {f.default})")
            if f.type == "int" and not isinstance(value, int):
                raise ConfigError(f"{flag} {value!r}: use a whole number (default {f.default})")


def is_loopback(client: Any) -> bool:
    """Whether an ASGI ``scope["client"]`` (host, port) is this machine (127.0.0.0/8, ::1, ::ffff:127.x)."""
    if not client:
        return False
    try:
        address = ipaddress.ip_address(str(client[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _error_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": "server_busy" if status == 503 else "invalid_request_error", "code": status}}
    )
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
    return (head + ("retry-after: 1\r\n" if status == 503 else "") + "\r\n" + body).encode()


def guarded_protocol(limits: ServeLimits) -> type:
    """uvicorn's HTTP protocol class (httptools when installed, else h11) with the head deadline and the
    connection cap of ``limits``; pass it as ``uvicorn.Config(http=...)``."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # no httptools: uvicorn's "auto" picks h11 too
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class GuardedProtocol(Base):  # type: ignore[misc, valid-type]
        """A connection with a head deadline, a head size cap and a place in the connection cap."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._waiting_since = time.monotonic()
            self._head_bytes = 0
            self._deadline: Any = None
            self._arm()
            if len(self.connections) > limits.max_connections:
                self._make_room()

        def _idle(self) -> bool:
            """Waiting for a request head: no request running on this connection."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._head_overdue)

        def _head_overdue(self) -> None:
            self._deadline = None
            if self._idle() and not self.transport.is_closing():
                self.transport.close()  # no answer: the client never sent a request to answer

        def _make_room(self) -> None:
            peers: list[Any] = [c for c in self.connections if c is not self]  # every connection here is one of these
            idle = [c for c in peers if c._idle() and not c.transport.is_closing()]
            if idle:
                min(idle, key=lambda c: c._waiting_since).transport.close()
                return
            self.transport.write(
                _error_response(
                    503, "Service Unavailable", f"the server has {limits.max_connections} requests running; retry shortly"
                )
            )
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                return
            if not self._idle():  # the head is complete: the app reads the body under its own deadline
                self._head_bytes = 0
                return
            self._head_bytes += len(data)
            if self._head_bytes > limits.max_head_bytes:
                self.transport.write(
                    _error_response(
                        431, "Request Header Fields Too Large", f"the request head is over {limits.max_head_bytes} bytes"
                    )
                )
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._waiting_since = time.monotonic()
            self._head_bytes = 0
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

    return GuardedProtocol
