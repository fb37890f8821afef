"""Landlock: the file system (and TCP) view of a sandboxed program.

A ruleset "handles" every access right the kernel's Landlock ABI knows; a handled right is denied
everywhere except beneath the paths a rule grants it on. The sandbox grants read and execute on
the interpreter's standard library, the system libraries and a few device files, and read-write
(without execute, symlinks, device nodes, fifos or sockets) on the workspace. From ABI 4 TCP bind and
connect are handled and never granted; from ABI 6 signals and abstract unix sockets are scoped to
the sandbox's own processes.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct

from ._linux import NR_LANDLOCK_ADD_RULE, NR_LANDLOCK_CREATE_RULESET, NR_LANDLOCK_RESTRICT_SELF, syscall

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP = 1 | 2  # BIND_TCP | CONNECT_TCP, ABI 4
_SCOPES = 1 | 2  # ABSTRACT_UNIX_SOCKET | SIGNAL, ABI 6

#: rights that only make sense on a regular file (a rule on a file may hold no others)
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ_ONLY = READ_FILE | READ_DIR | EXECUTE
READ_WRITE = READ_FILE | READ_DIR | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | REFER | TRUNCATE


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or disabled."""
    try:
        return syscall(NR_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint(1))
    except OSError:
        return 0


def handled_fs(abi: int) -> int:
    return _FS_BY_ABI.get(abi, _FS_BY_ABI[5])


def create_ruleset(abi: int) -> int:
    """A ruleset fd that handles every right of ``abi``."""
    return create_prepared_ruleset(ruleset_attr(abi))


def ruleset_attr(abi: int) -> ctypes.Array[ctypes.c_char]:
    """The ``struct landlock_ruleset_attr`` of :func:`create_ruleset`, packed once (the zygote's)."""
    if abi >= 6:
        attr = struct.pack("QQQ", handled_fs(abi), _NET_TCP, _SCOPES)
    elif abi >= 4:
        attr = struct.pack("QQ", handled_fs(abi), _NET_TCP)
    else:
        attr = struct.pack("Q", handled_fs(abi))
    return ctypes.create_string_buffer(attr, len(attr))


def create_prepared_ruleset(attr: ctypes.Array[ctypes.c_char]) -> int:
    """A ruleset fd from an attribute packed by :func:`ruleset_attr`."""
    return syscall(NR_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint(0))


_PATH_RULE = struct.Struct("=Qi")  # struct landlock_path_beneath_attr (packed): allowed_access, parent_fd


def pack_path_rules(rules: list[tuple[int, int]]) -> ctypes.Array[ctypes.c_char]:
    """``(O_PATH fd, access)`` pairs packed once, one ``struct landlock_path_beneath_attr`` after another
    in a single buffer, for :func:`add_packed_rules`."""
    data = b"".join(_PATH_RULE.pack(access, fd) for fd, access in rules)
    return ctypes.create_string_buffer(data, len(data))


def add_packed_rules(ruleset: int, rules: ctypes.Array[ctypes.c_char]) -> None:
    """Add every rule packed by :func:`pack_path_rules` (their descriptors must still be open).

    One buffer, addressed by offset: a run's program touches no per-rule object (each would be a
    page it shares with the zygote, copied on the first write of its reference count)."""
    base = ctypes.addressof(rules)
    for offset in range(0, len(rules), _PATH_RULE.size):
        syscall(NR_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.c_void_p(base + offset), ctypes.c_uint(0))


_ONE_RULE = ctypes.create_string_buffer(_PATH_RULE.size)  # made at import (the zygote's): a run makes no ctypes type


def add_path_rule(ruleset: int, parent_fd: int, access: int) -> None:
    """Grant ``access`` beneath the file or directory open at ``parent_fd`` (an O_PATH fd).

    Not thread-safe (one shared buffer): the sandbox calls it from a single-threaded program."""
    _PATH_RULE.pack_into(_ONE_RULE, 0, access, parent_fd)
    syscall(NR_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), _ONE_RULE, ctypes.c_uint(0))


def restrict_self(ruleset: int) -> None:
    """Enforce ``ruleset`` on the calling thread; needs no_new_privs (or CAP_SYS_ADMIN)."""
    syscall(NR_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint(0))


def open_rule_path(path: str) -> tuple[int, bool] | None:
    """An O_PATH fd of ``path`` and whether it is a directory, or None when it does not exist."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    return fd, stat.S_ISDIR(os.fstat(fd).st_mode)
