"""Wire format between the host, the zygote and a run's program (stdlib only).

Frames are ``u32 length | payload``, big-endian.

- Control socket (host <-> zygote, AF_UNIX stream). Host -> zygote: the JSON config, then one
  empty frame per warm slot wanted. Zygote -> host: the JSON hello (tier, layers), then per slot a
  JSON reply ``{"ok": true, "fds": [names]}`` carrying the slot's descriptors (SCM_RIGHTS; see
  :data:`._monitor.SLOT_FDS`).
- Request pipe (host -> program): one frame, ``u64 ws_dev | u64 ws_ino | i64 x 5 limits | u32
  path_length | workspace path | program bytes`` (see :func:`encode_request`). The zygote never
  sees a program.
- :func:`encode_result` / :func:`decode_result`: a whole result as one byte string
  (``b"SBX1" | u32 header_length | header JSON | stdout bytes | stderr bytes``), for tools that
  pass results on.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

MAGIC = b"SBX1"
MAX_FRAME = 64 << 20
_U32 = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol, or hung up mid-frame."""


def frame(payload: bytes) -> bytes:
    return _U32.pack(len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    (n,) = _U32.unpack(recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes")
    return recv_exact(sock, n)


def send_json(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    send_frame_with_fds(sock, frame(json.dumps(obj, separators=(",", ":")).encode()), fds)


def send_frame_with_fds(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    """``data`` (a whole frame), with ``fds`` attached to its first bytes."""
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def recv_json_with_fds(sock: socket.socket, maxfds: int) -> tuple[dict[str, Any], list[int]]:
    """One JSON frame and the descriptors that came with its first bytes."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 65536, maxfds)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("peer closed the connection")
    try:
        while len(data) < 4:
            data += recv_exact(sock, 4 - len(data))
        (n,) = _U32.unpack(data[:4])
        if n > MAX_FRAME:
            raise ProtocolError(f"frame of {n} bytes")
        body = data[4:]
        if len(body) < n:
            body += recv_exact(sock, n - len(body))
        if len(body) > n:
            raise ProtocolError("two frames in one message")
        return json.loads(body), list(fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


#: the limits a program applies itself, in the order of its request (the rest of the header is the host's)
REQUEST_LIMITS = ("cpu_s", "memory_bytes", "file_bytes", "open_files", "processes")
_REQUEST = struct.Struct("<QQ5q")  # ws_dev, ws_ino, REQUEST_LIMITS


def encode_request(header: dict[str, Any], program: bytes) -> bytes:
    """The request frame of a program: what it needs of ``header`` in fixed binary fields, then the code.

    Binary rather than JSON because the program decodes it on the way to the agent's code: one
    ``struct`` call, where the first ``json.loads`` after the fork costs it about 50 page faults.
    Raises ValueError for a limit outside a signed 64-bit integer.
    """
    limits = []
    for name in REQUEST_LIMITS:
        value = int(header[name])
        if not -(1 << 63) <= value < 1 << 63:
            raise ValueError(f"RunLimits.{name}={value}: use a value below 2**63 (the kernel's limits are 64-bit)")
        limits.append(value)
    path = os.fsencode(header["workspace"])
    head = _REQUEST.pack(int(header["ws_dev"]), int(header["ws_ino"]), *limits) + _U32.pack(len(path))
    return frame(head + path + program)


def decode_request(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, program) of a request frame's payload; ProtocolError when it is cut short."""
    start = _REQUEST.size + 4
    if len(payload) < start:
        raise ProtocolError("request cut short")
    dev, ino, *limits = _REQUEST.unpack_from(payload)
    (n,) = _U32.unpack_from(payload, _REQUEST.size)
    if len(payload) < start + n:
        raise ProtocolError("request cut short")
    header: dict[str, Any] = dict(zip(REQUEST_LIMITS, limits))
    header["ws_dev"], header["ws_ino"], header["workspace"] = dev, ino, os.fsdecode(payload[start : start + n])
    return header, payload[start + n :]


def encode_result(header: dict[str, Any], out: bytes, err: bytes) -> bytes:
    head = json.dumps({**header, "stdout_bytes": len(out), "stderr_bytes": len(err)}, separators=(",", ":")).encode()
    return MAGIC + _U32.pack(len(head)) + head + out + err


def decode_result(data: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """Split a complete result; ProtocolError when it is cut short or malformed."""
    if len(data) < 8 or data[:4] != MAGIC:
        raise ProtocolError("no result")
    (n,) = _U32.unpack(data[4:8])
    try:
        header = json.loads(data[8 : 8 + n])
        n_out, n_err = int(header["stdout_bytes"]), int(header["stderr_bytes"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"bad result header: {exc}") from None
    body = data[8 + n :]
    if len(body) != n_out + n_err:
        raise ProtocolError("result cut short")
    return header, body[:n_out], body[n_out:]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame_fd(fd: int) -> bytes:
    """One ``u32 length | payload`` frame from a blocking pipe; EOFError if it ends first."""

    def exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("pipe closed")
            buf += chunk
        return bytes(buf)

    (n,) = _U32.unpack(exact(4))
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes")
    return exact(n)
