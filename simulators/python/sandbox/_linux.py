"""ctypes wrappers for the Linux calls the sandbox needs and :mod:`os` lacks on Python 3.10/3.11.

Stdlib only: the zygote loads this package as ``_agentrl_sandbox``, without ``simulators``.
Every wrapper raises :class:`OSError` with the call's name on failure.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from typing import NoReturn

ARCH = platform.machine()

# Syscall numbers that differ between the two supported architectures (x86_64, aarch64). Calls
# numbered 403 and up are the same everywhere.
_NR = {
    "x86_64": {"seccomp": 317, "capset": 126, "unshare": 272, "setns": 308},
    "aarch64": {"seccomp": 277, "capset": 91, "unshare": 97, "setns": 268},
}.get(ARCH, {})
NR_CLOSE_RANGE = 436
NR_LANDLOCK_CREATE_RULESET = 444
NR_LANDLOCK_ADD_RULE = 445
NR_LANDLOCK_RESTRICT_SELF = 446

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWTIME
)

MS_NOSUID = 2
MS_NODEV = 4
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# SECBIT_NOROOT | SECBIT_NO_SETUID_FIXUP | SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE, each
# with its lock bit: root in the sandbox never regains capabilities through execve.
SECUREBITS_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_ulong = ctypes.c_ulong


_pylibc = ctypes.PyDLL(None, use_errno=True)  # calls keep the GIL, so a fork's child holds it as its parent did
_pylibc.fork.restype = ctypes.c_int


def fork() -> int:
    """glibc's fork() without CPython's at-fork machinery, for a single-threaded zygote.

    ``os.fork`` re-initialises interpreter locks and thread states and runs the at-fork hooks
    (random's reseed, threading's bookkeeping): in a child of a process with one thread and no lock
    held, that work only writes to shared pages, which costs about 0.8 ms of copy-on-write faults.
    The caller must reseed what needs fresh entropy (the program does).
    """
    pid = _pylibc.fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork")
    return int(pid)


CLONE_VM = 0x100
CLONE_FILES = 0x400
_PAUSER_STACK = ctypes.create_string_buffer(1 << 16)  # shared by every pauser: none ever leaves pause()
_pause_fn = ctypes.cast(_libc.pause, ctypes.c_void_p)
_libc.clone.restype = ctypes.c_int
_libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]


def clone_pauser() -> int:
    """A child that shares our memory and descriptor table and only waits in ``pause()`` until it is
    killed: the cheapest possible pid 1 of a new pid namespace (no copy of our page tables, no exec).

    It runs no Python and installs no signal handler (with none installed, ``pause()`` never
    returns), so it never touches the memory it shares. Sharing the descriptor table means it
    holds no copies of our descriptors: a pipe we close is closed.
    """
    top = (ctypes.addressof(_PAUSER_STACK) + len(_PAUSER_STACK) - 64) & ~0xF
    pid = _libc.clone(_pause_fn, ctypes.c_void_p(top), CLONE_VM | CLONE_FILES | 17, None)  # 17: SIGCHLD on exit
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone")
    return int(pid)


def _fail(what: str) -> NoReturn:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


# The hot wrappers below name their call only when it fails: a message built on every call would
# cost a run's program copy-on-write faults (pages it shares with the zygote) for nothing.


def syscall(nr: int, *args: object) -> int:
    """Raw syscall with a negative return turned into :class:`OSError`."""
    ret = _syscall(ctypes.c_long(nr), *args)
    if ret < 0:
        _fail(f"syscall {nr}")
    return int(ret)


def nr(name: str) -> int:
    """This architecture's number of ``name`` (KeyError on an unsupported architecture)."""
    return _NR[name]


_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, _ulong, _ulong, _ulong, _ulong]


def unshare(flags: int) -> None:
    if _libc.unshare(flags) < 0:
        _fail(f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    if _libc.setns(fd, nstype) < 0:
        _fail("setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], _ulong(flags), enc[3]) < 0:
        _fail(f"mount {fstype or ''} on {target}")


def prctl(option: int, a2: int = 0, a3: int = 0, a4: int = 0, a5: int = 0) -> int:
    ret = _libc.prctl(option, a2, a3, a4, a5)
    if ret < 0:
        _fail(f"prctl({option})")
    return int(ret)


def close_range(first: int, last: int) -> None:
    """Close descriptors ``first``..``last`` (close_range, or a bounded loop on old kernels)."""
    if last < first:
        return
    try:
        syscall(NR_CLOSE_RANGE, ctypes.c_uint(first), ctypes.c_uint(last), ctypes.c_uint(0))
    except OSError:
        os.closerange(first, min(last, 65535) + 1)


def close_from(first: int) -> None:
    """Close every descriptor >= ``first``."""
    close_range(first, 0xFFFFFFFF)


def drop_bounding_set(cap_last: int) -> None:
    """Empty the bounding set: no execve can grant a capability again. The current sets stay."""
    for cap in range(cap_last + 1):
        prctl(PR_CAPBSET_DROP, cap)


def clear_capabilities() -> None:
    """Lock root's special cases off (securebits), then clear every capability set (ambient too)."""
    prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED)
    syscall(nr("capset"), _CAP_HEADER, _CAP_DATA)


_CAP_HEADER = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
_CAP_DATA = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}


def map_self(uid_outside: int, gid_outside: int) -> None:
    """After unshare(CLONE_NEWUSER): become root of the new namespace, mapped to the given ids."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid_outside} 1"), ("gid_map", f"0 {gid_outside} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63
