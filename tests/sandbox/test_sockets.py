"""No socket of a run can address anything outside it (issue #14, item 1).

``socket()`` is refused, but a run may hold ``socketpair()`` ends; these tests point them at real
listeners of the host (pathname datagram, stream and seqpacket sockets outside and inside the
workspace, abstract datagram and stream sockets) in every way a program could: ``sendto`` and
``connect`` with an address, ``sendmsg`` with a name and with SCM_RIGHTS, ``bind``, raw syscalls
with the address above 4 GiB. Each listener must receive nothing. The listeners are checked to work
from the host first, so the tests cannot pass because a listener was unreachable anyway.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from simulators.python.sandbox import SandboxRunner

from .conftest import assert_no_leftovers

_KINDS = {"dgram": socket.SOCK_DGRAM, "stream": socket.SOCK_STREAM, "seqpacket": socket.SOCK_SEQPACKET}


@dataclass
class Listener:
    name: str
    address: str  # a path, or "\0name" for an abstract socket
    sock: socket.socket

    def received(self) -> list[bytes]:
        """Whatever reached the listener since the last call (datagrams, or accepted connections)."""
        got: list[bytes] = []
        while True:
            try:
                if self.sock.type == socket.SOCK_DGRAM:
                    got.append(self.sock.recv(65536))
                else:
                    conn, _ = self.sock.accept()
                    conn.setblocking(False)
                    try:
                        got.append(b"connection:" + conn.recv(65536))
                    except BlockingIOError:
                        got.append(b"connection")
                    conn.close()
            except BlockingIOError:
                return got


@dataclass
class Host:
    root: str
    ws: str
    listeners: list[Listener]


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    # Under /tmp with open permissions, so that only the sandbox (not a file mode) can stop a connection.
    root = tempfile.mkdtemp(prefix="agentrl-sock-test-", dir="/tmp")
    os.chmod(root, 0o755)
    ws = os.path.join(root, "ws")
    os.mkdir(ws, 0o777)
    listeners = []
    tag = f"agentrl-sock-test-{os.getpid()}"
    specs = [(f"path_{k}", os.path.join(root, f"{k}.sock"), t) for k, t in _KINDS.items()]
    specs += [("ws_dgram", os.path.join(ws, "inside.sock"), socket.SOCK_DGRAM)]
    specs += [(f"abstract_{k}", f"\0{tag}-{k}", _KINDS[k]) for k in ("dgram", "stream")]
    try:
        for name, address, kind in specs:
            sock = socket.socket(socket.AF_UNIX, kind)
            sock.bind(address)
            if not address.startswith("\0"):
                os.chmod(address, 0o777)
            if kind != socket.SOCK_DGRAM:
                sock.listen(16)
            sock.setblocking(False)
            listeners.append(Listener(name, address, sock))
        for lst in listeners:  # each listener works: a host client reaches it
            client = socket.socket(socket.AF_UNIX, lst.sock.type)
            client.connect(lst.address)
            client.send(b"probe")
            client.close()
            assert lst.received(), f"the host's own client did not reach {lst.name}"
        yield Host(root, ws, listeners)
    finally:
        for lst in listeners:
            lst.sock.close()
        shutil.rmtree(root, ignore_errors=True)


_PRELUDE = "import array, ctypes, os, socket, struct\nT = {target!r}\n"

VARIANTS = {
    "dgram_sendto": "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.sendto(b'leak', T)\n",
    "dgram_connect_send": "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.connect(T)\na.send(b'leak')\n",
    "dgram_flags_sendto": (
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)\n"
        "a.sendto(b'leak', T)\n"
    ),
    "seqpacket_connect": "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\na.connect(T)\na.send(b'leak')\n",
    "stream_connect": "a, b = socket.socketpair()\na.connect(T)\na.send(b'leak')\n",
    "stream_sendto": "a, b = socket.socketpair()\na.sendto(b'leak', T)\n",
    "stream_sendmsg_name": "a, b = socket.socketpair()\na.sendmsg([b'leak'], [], 0, T)\n",
    "scm_rights_out": (
        "a, b = socket.socketpair()\nfd = os.open('.', os.O_RDONLY)\n"
        "a.sendmsg([b'fd'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd]))], 0, T)\n"
    ),
    "bind_then_send": (
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.bind('mine.sock')\na.sendto(b'leak', T)\n"
    ),
    "socket_fd_from_proc": "a, b = socket.socketpair()\nos.open(f'/proc/self/fd/{a.fileno()}', os.O_RDWR)\n",
    "raw_syscalls_high_address": (
        "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\nL = ctypes.c_long\n"
        "sv = (ctypes.c_int * 2)()\n"
        "for kind in (2, 5, 1):  # SOCK_DGRAM, SOCK_SEQPACKET, then the allowed SOCK_STREAM\n"
        "    r = libc.syscall(L(53), L(1), L(kind), L(0), sv)\n"
        "    print('socketpair', kind, r, ctypes.get_errno())\n"
        "    if r == 0:\n"
        "        break\n"
        "libc.mmap.restype = ctypes.c_void_p\n"
        "page = libc.mmap(ctypes.c_void_p(1 << 32), L(4096), 3, 0x22 | 0x100000, -1, L(0))  # FIXED_NOREPLACE\n"
        "name = T.encode()\nsa = struct.pack('H', 1) + name + (b'' if name[:1] == b'\\0' else b'\\0')\n"
        "ctypes.memmove(page, sa, len(sa))\nbuf = ctypes.create_string_buffer(b'leak')\n"
        "for call in ((44, sv[0], buf, 4, 0, page, len(sa)), (42, sv[0], page, len(sa))):\n"
        "    r = libc.syscall(*[L(x) if isinstance(x, int) else ctypes.c_void_p(x) if x is page else x for x in call])\n"
        "    print('call', call[0], r, ctypes.get_errno())\n"
        "    if r >= 0:\n"
        "        raise SystemExit('reached the listener')\n"
        "raise PermissionError('every call refused')\n"
    ),
}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the raw variant uses x86_64 syscall numbers")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_socket_reaches_a_host_listener(full: SandboxRunner, host: Host, variant: str) -> None:
    for lst in host.listeners:
        code = _PRELUDE.format(target=lst.address) + VARIANTS[variant]
        res = full.run(code, host.ws)
        assert res.exit_code == 1, (lst.name, res)
        assert "PermissionError" in res.stderr or "OSError" in res.stderr, (lst.name, res.stderr[-1500:])
        assert "reached the listener" not in res.stderr
        assert lst.received() == [], f"{variant} reached the host's {lst.name} listener"
    for lst in host.listeners:
        assert lst.received() == []
    assert sorted(os.listdir(host.ws)) == ["inside.sock"]
    assert_no_leftovers(full)


def test_socketpair_within_the_run_still_works(full: SandboxRunner, host: Host) -> None:
    """What asyncio and multiprocessing need: connected stream pairs, send/sendmsg between their ends.

    (Descriptor passing is not exercised: the kernel counts descriptors in flight per user over the
    whole machine and refuses with ETOOMANYREFS past RLIMIT_NOFILE, which depends on other processes.)
    """
    code = (
        "import asyncio, multiprocessing, socket\n"
        "a, b = socket.socketpair()\na.sendmsg([b'x'])\na.send(b'y')\n"
        "msg, anc, flags, addr = b.recvmsg(1)\nprint('passed', msg + b.recv(1), len(anc))\n"
        "async def main():\n    await asyncio.sleep(0)\n    return 'loop ok'\nprint(asyncio.run(main()))\n"
        "p, q = multiprocessing.Pipe()\np.send({'k': 1})\nprint('pipe', q.recv())\n"
    )
    res = full.run(code, host.ws)
    assert res.exit_code == 0, res
    assert res.stdout == "passed b'xy' 0\nloop ok\npipe {'k': 1}\n"
