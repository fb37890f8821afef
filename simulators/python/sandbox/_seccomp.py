"""The seccomp-bpf filter of a sandboxed program, assembled by hand (no libseccomp).

The filter allows by default and denies what a data-processing program never needs and what a
container escape usually starts with:

- every ``socket()`` (so no inet, netlink, packet, vsock or unix socket); ``socketpair()`` only for
  AF_UNIX + SOCK_STREAM, whose ends are connected to each other and cannot be given an address:
  ``connect``, ``bind`` and ``listen`` are refused, and so is ``sendto`` with a destination address
  (the kernel refuses an address in ``sendmsg`` on a connected stream socket), so no socket of a run
  can address anything outside it (pathname, abstract or inet), and SCM_RIGHTS only reaches the peer;
- executable memory files: ``memfd_create`` only with MFD_NOEXEC_SEAL (never executable, and sealed
  so), ``memfd_secret``: no ELF the program writes can be executed;
- other processes' memory and state: ptrace, process_vm_readv/writev, kcmp, pidfd_getfd, process_madvise;
- namespaces and mounts: unshare, setns, mount, umount2, pivot_root, chroot, the new mount API;
  ``clone()`` with any CLONE_NEW* flag;
- kernel attack surface: bpf, io_uring, keyctl, perf_event_open, userfaultfd, kexec, modules, ...;
- setuid/setgid mode bits on chmod and on file creation; ``kill(-1, ...)``;
- ``clone3`` is answered with ENOSYS so glibc falls back to ``clone``, whose flags a classic BPF
  filter can inspect: threads and fork keep working.

Syscalls from another ABI (i386 via int 0x80, x32) kill the process.
"""

from __future__ import annotations

import ctypes
import errno
import struct

from ._linux import ARCH, NAMESPACE_FLAGS, PR_SET_NO_NEW_PRIVS, nr, prctl, syscall

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_JA = 0x05  # BPF_JMP | BPF_JA

_OFF_NR, _OFF_ARCH = 0, 4


def _arg(i: int) -> int:
    """Offset of the low 32 bits of syscall argument ``i`` in struct seccomp_data (little endian)."""
    return 16 + 8 * i


_SETID_BITS = 0o6000
_AF_UNIX = 1
_SOCK_STREAM = 1
_SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
_MFD_NOEXEC_SEAL = 0x0008
_TIOCSTI = 0x5412

# name -> (x86_64 number, aarch64 number); None where the call does not exist.
_DENY_EPERM: dict[str, tuple[int | None, int | None]] = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440),
    "process_mrelease": (448, 448),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "statmount": (457, 457),
    "listmount": (458, 458),
    "open_tree_attr": (467, 467),
    "unshare": (272, 97),
    "setns": (308, 268),
    "bpf": (321, 280),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "lookup_dcookie": (212, 18),
    "syslog": (103, 116),
    "vhangup": (153, 58),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262),
    "nfsservctl": (180, 42),
    "migrate_pages": (256, 238),
    "move_pages": (279, 239),
    "iopl": (172, None),
    "ioperm": (173, None),
    "uselib": (134, None),
    "modify_ldt": (154, None),
    "create_module": (174, None),
    "query_module": (178, None),
    "get_kernel_syms": (177, None),
    "_sysctl": (156, None),
    "memfd_secret": (447, 447),
}
_DENY_ENOSYS = {"clone3": (435, 435), "openat2": (437, 437)}
_KILL = (62, 129)
_SOCKET = (41, 198)
_SOCKETPAIR = (53, 199)
# A socket of the run may not be given an address or be pointed at one (see the module docstring).
_DENY_EACCES = {"connect": (42, 203), "bind": (49, 200), "listen": (50, 201)}
_SENDTO = (44, 206)
_MEMFD_CREATE = (319, 279)
_CLONE = (56, 220)
_IOCTL = (16, 29)
# (numbers, index of the mode argument): creating or chmod-ing a file with setuid/setgid bits.
_MODE_CHECKS = [((90, None), 1), ((91, 52), 1), ((268, 53), 2), ((452, 452), 2), ((2, None), 2), ((257, 56), 3), ((85, None), 1)]


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _pick(pair: tuple[int | None, int | None]) -> int | None:
    return pair[0] if ARCH == "x86_64" else pair[1]


def rules() -> dict[int, list[bytes]]:
    """This architecture's decisions: syscall number -> the code run when it matches.

    Each body starts with the number in the accumulator and returns on every path; a number that
    is not here is allowed. Where a number would appear twice, the first rule holds.
    """
    table: dict[int, list[bytes]] = {}

    def add(pair: tuple[int | None, int | None], body: list[bytes]) -> None:
        number = _pick(pair)
        if number is not None:
            table.setdefault(number, body)

    def ret(action: int) -> bytes:
        return _ins(_RET, 0, 0, action)

    def arg_rule(pair: tuple[int | None, int | None], arg: int, test: int, value: int, deny_if_match: bool, err: int) -> None:
        hit, miss = (_RET_ERRNO | err, _RET_ALLOW) if deny_if_match else (_RET_ALLOW, _RET_ERRNO | err)
        add(pair, [_ins(_LD_ABS, 0, 0, _arg(arg)), _ins(test, 0, 1, value), ret(hit), ret(miss)])

    for pair in _DENY_EPERM.values():
        add(pair, [ret(_RET_ERRNO | errno.EPERM)])
    for pair in _DENY_ENOSYS.values():
        add(pair, [ret(_RET_ERRNO | errno.ENOSYS)])
    add(_SOCKET, [ret(_RET_ERRNO | errno.EACCES)])
    for pair in _DENY_EACCES.values():
        add(pair, [ret(_RET_ERRNO | errno.EACCES)])
    allow, eacces = ret(_RET_ALLOW), ret(_RET_ERRNO | errno.EACCES)
    # socketpair(domain, type, ...): AF_UNIX and SOCK_STREAM only
    add(
        _SOCKETPAIR,
        [
            _ins(_LD_ABS, 0, 0, _arg(0)),
            _ins(_JEQ, 0, 4, _AF_UNIX),
            _ins(_LD_ABS, 0, 0, _arg(1)),
            _ins(_AND, 0, 0, _SOCK_TYPE_MASK),
            _ins(_JEQ, 0, 1, _SOCK_STREAM),
            allow,
            eacces,
        ],
    )
    # sendto(fd, buf, len, flags, dest_addr, addrlen): dest_addr must be NULL (both 32-bit halves)
    add(
        _SENDTO,
        [
            _ins(_LD_ABS, 0, 0, _arg(4)),
            _ins(_JEQ, 0, 3, 0),
            _ins(_LD_ABS, 0, 0, _arg(4) + 4),
            _ins(_JEQ, 0, 1, 0),
            allow,
            eacces,
        ],
    )
    arg_rule(_MEMFD_CREATE, 1, _JSET, _MFD_NOEXEC_SEAL, False, errno.EPERM)
    arg_rule(_CLONE, 0, _JSET, NAMESPACE_FLAGS, True, errno.EPERM)
    arg_rule(_IOCTL, 1, _JEQ, _TIOCSTI, True, errno.EPERM)
    arg_rule(_KILL, 0, _JEQ, 0xFFFFFFFF, True, errno.EPERM)  # kill(-1): every process we may signal
    for pair, arg in _MODE_CHECKS:
        arg_rule(pair, arg, _JSET, _SETID_BITS, True, errno.EPERM)
    return table


def _dispatch(entries: list[tuple[int, list[bytes]]]) -> list[bytes]:
    """Code that runs the body of the entry whose number is in the accumulator, else allows.

    A binary search on the sorted numbers (``JGE``), linear below :data:`_LEAF` entries: each
    number is decided after about log2(n) comparisons instead of one per rule. That matters at
    install time too: the kernel runs the filter once per syscall number to build its cache of
    always-allowed calls, with interrupts off, in every run.
    """
    if len(entries) <= _LEAF:
        code: list[bytes] = []
        for number, body in entries:
            code.append(_ins(_JEQ, 0, len(body), number))
            code.extend(body)
        code.append(_ins(_RET, 0, 0, _RET_ALLOW))
        return code
    mid = len(entries) // 2
    low, high = _dispatch(entries[:mid]), _dispatch(entries[mid:])
    if len(low) <= 255:  # nr >= pivot: jump over the low half
        return [_ins(_JGE, len(low), 0, entries[mid][0]), *low, *high]
    return [_ins(_JGE, 0, 1, entries[mid][0]), _ins(_JA, 0, 0, len(low)), *low, *high]


_LEAF = 4


def build_filter() -> bytes:
    """The filter as a sequence of ``struct sock_filter`` (8 bytes each) for this architecture."""
    if ARCH not in AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp filter for architecture {ARCH}")
    prog = [
        _ins(_LD_ABS, 0, 0, _OFF_ARCH),
        _ins(_JEQ, 1, 0, AUDIT_ARCH[ARCH]),
        _ins(_RET, 0, 0, _RET_KILL_PROCESS),
        _ins(_LD_ABS, 0, 0, _OFF_NR),
    ]
    if ARCH == "x86_64":  # x32 ABI calls carry bit 30
        prog += [_ins(_JGE, 0, 1, 0x40000000), _ins(_RET, 0, 0, _RET_KILL_PROCESS)]
    prog += _dispatch(sorted(rules().items()))
    return b"".join(prog)


class Prepared:
    """A filter ready for ``seccomp(SECCOMP_SET_MODE_FILTER)``: its buffers built once, in the zygote."""

    def __init__(self, program: bytes) -> None:
        self.program = ctypes.create_string_buffer(program, len(program))
        fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(self.program))
        self.fprog = ctypes.create_string_buffer(fprog, len(fprog))


def install(prepared: Prepared) -> None:
    """Set no_new_privs and install the filter on the calling thread (and its future children)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    syscall(nr("seccomp"), ctypes.c_uint(1), ctypes.c_uint(0), prepared.fprog)  # SECCOMP_SET_MODE_FILTER
