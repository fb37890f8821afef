"""Pieces of the sandbox that can be checked without starting one: the seccomp program (run in a
small BPF interpreter), the result framing and the overlay copy-back."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators.python.sandbox import _copyback, _seccomp
from simulators.python.sandbox._protocol import ProtocolError, decode_request, decode_result, encode_request, encode_result

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers below are x86_64")

ALLOW, KILL = 0x7FFF0000, 0x80000000


def _errno(e: int) -> int:
    return 0x00050000 | e


def run_filter(prog: bytes, nr: int, args: tuple[int, ...] = (), arch: int = 0xC000003E) -> int:
    """Interpret the classic-BPF subset the sandbox emits over one struct seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    ins = [struct.unpack("HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == 0x54:  # ALU AND
            acc &= k
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x05:  # JA
            pc += 1 + k
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")


PROG = _seccomp.build_filter()


def test_filter_shape() -> None:
    assert len(PROG) % 8 == 0 and len(PROG) // 8 < 4096


@pytest.mark.parametrize(
    "nr, args, expected",
    [
        (0, (), ALLOW),  # read
        (41, (2, 1, 0), _errno(errno.EACCES)),  # socket(AF_INET)
        (41, (1, 1, 0), _errno(errno.EACCES)),  # socket(AF_UNIX): no sockets at all
        (53, (1, 1, 0), ALLOW),  # socketpair(AF_UNIX, SOCK_STREAM)
        (53, (1, 1 | 0o2000000 | 0o4000, 0), ALLOW),  # ... | SOCK_CLOEXEC | SOCK_NONBLOCK
        (53, (2, 1, 0), _errno(errno.EACCES)),
        (53, (1, 2, 0), _errno(errno.EACCES)),  # SOCK_DGRAM: could sendto any pathname socket
        (53, (1, 2 | 0o2000000, 0), _errno(errno.EACCES)),
        (53, (1, 5, 0), _errno(errno.EACCES)),  # SOCK_SEQPACKET
        (53, (1 | 1 << 32, 1, 0), ALLOW),  # the kernel reads an int: the high half does not matter
        (42, (3, 0x7F0000001000, 110), _errno(errno.EACCES)),  # connect
        (49, (3, 0x7F0000001000, 110), _errno(errno.EACCES)),  # bind
        (50, (3, 1), _errno(errno.EACCES)),  # listen
        (44, (3, 0x1000, 1, 0, 0, 0), ALLOW),  # send() is sendto(..., NULL, 0)
        (44, (3, 0x1000, 1, 0, 0x7F0000001000, 110), _errno(errno.EACCES)),  # sendto an address
        (44, (3, 0x1000, 1, 0, 0x100000000, 110), _errno(errno.EACCES)),  # low 32 bits zero
        (44, (3, 0x1000, 1, 0, 0x1000, 0), _errno(errno.EACCES)),
        (46, (3, 0x1000, 0), ALLOW),  # sendmsg: the kernel refuses a name on a connected stream socket
        (319, (0x1000, 1), _errno(errno.EPERM)),  # memfd_create(MFD_CLOEXEC): could be executed
        (319, (0x1000, 0x10), _errno(errno.EPERM)),  # MFD_EXEC
        (319, (0x1000, 0x8 | 1), ALLOW),  # MFD_NOEXEC_SEAL
        (447, (0,), _errno(errno.EPERM)),  # memfd_secret
        (322, (3, 0, 0, 0, 0x1000), ALLOW),  # execveat: Landlock and the memfd rule decide
        (56, (0x01200011,), ALLOW),  # clone as fork() does it
        (56, (0x003D0F00,), ALLOW),  # clone as pthread_create does it
        (56, (0x10000000 | 17,), _errno(errno.EPERM)),  # CLONE_NEWUSER
        (56, (0x00000080 | 17,), _errno(errno.EPERM)),  # CLONE_NEWTIME
        (435, (), _errno(errno.ENOSYS)),  # clone3
        (101, (), _errno(errno.EPERM)),  # ptrace
        (272, (), _errno(errno.EPERM)),  # unshare
        (425, (), _errno(errno.EPERM)),  # io_uring_setup
        (90, (0, 0o755), ALLOW),  # chmod
        (90, (0, 0o4755), _errno(errno.EPERM)),
        (268, (0, 0, 0o2755), _errno(errno.EPERM)),  # fchmodat with setgid
        (257, (0, 0, 0o101, 0o644), ALLOW),  # openat(O_CREAT)
        (257, (0, 0, 0o101, 0o4644), _errno(errno.EPERM)),
        (16, (1, 0x5412), _errno(errno.EPERM)),  # ioctl TIOCSTI
        (16, (1, 0x5401), ALLOW),  # ioctl TCGETS
        (62, (0xFFFFFFFFFFFFFFFF, 9), _errno(errno.EPERM)),  # kill(-1, SIGKILL)
        (62, (1234, 9), ALLOW),
        (0x40000000 | 1, (), KILL),  # x32 ABI
    ],
)
def test_filter_decisions(nr: int, args: tuple[int, ...], expected: int) -> None:
    assert run_filter(PROG, nr, args) == expected


def test_filter_dispatch_runs_each_rule_for_its_number_only() -> None:
    """The binary search over syscall numbers decides every number as its own rule does (the
    rule's body run alone), and allows every number without a rule."""
    table = _seccomp.rules()
    allow = struct.pack("HBBI", 0x06, 0, 0, ALLOW)
    probes = [(), (1, 1, 0), (2, 2, 2, 2, 2, 2), (0xFFFFFFFF, 0x5412, 0o6777, 0o6777, 0x1000, 1), (0x10000000, 0x8, 0, 0)]
    for nr in range(512):  # x86_64 numbers end below 470
        body = b"".join(table[nr]) if nr in table else allow
        for args in probes:
            assert run_filter(PROG, nr, args) == run_filter(body, nr, args), (nr, args)


def test_foreign_architecture_is_killed() -> None:
    assert run_filter(PROG, 0, arch=0x40000003) == KILL  # i386 through int 0x80


@settings(max_examples=300, deadline=None)
@given(nr=st.integers(0, 500), args=st.tuples(*[st.integers(0, 2**64 - 1)] * 6))
def test_filter_never_crashes_and_only_allows_or_errs(nr: int, args: tuple[int, ...]) -> None:
    action = run_filter(PROG, nr, args)
    assert action == ALLOW or action & 0xFFFF0000 == 0x00050000
    if nr not in (16, 41, 44, 53, 56, 62, 90, 91, 268, 452, 2, 257, 85, 319) and action == ALLOW:
        assert nr not in {pair[0] for pair in _seccomp._DENY_EPERM.values()}


def test_result_round_trip() -> None:
    header = {"exit_code": 3, "timed_out": False, "truncated_out": True, "truncated_err": False}
    data = encode_result(header, b"out\xff", b"err")
    got, out, err = decode_result(data)
    assert (got["exit_code"], out, err) == (3, b"out\xff", b"err")
    for cut in (0, 3, 9, len(data) - 1):
        with pytest.raises(ProtocolError):
            decode_result(data[:cut])


_HEADER = {"workspace": "/tmp/ws \udcff,:", "ws_dev": 2**64 - 1, "ws_ino": 12, "cpu_s": 5, "memory_bytes": 1 << 30}
_HEADER.update(file_bytes=1 << 20, open_files=64, processes=-1, wall_s=5.0, deadline=1.5, output_bytes=1 << 20)


def test_request_round_trip() -> None:
    header, program = decode_request(encode_request(_HEADER, b"print(1)\n")[4:])
    assert program == b"print(1)\n"
    assert header == {
        k: _HEADER[k] for k in ("workspace", "ws_dev", "ws_ino", "cpu_s", "memory_bytes", "file_bytes", "open_files", "processes")
    }


def test_request_refuses_a_limit_the_kernel_cannot_hold() -> None:
    with pytest.raises(ValueError, match="memory_bytes"):
        encode_request({**_HEADER, "memory_bytes": 1 << 70}, b"")


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=80))
def test_garbage_is_a_protocol_error_or_a_request(data: bytes) -> None:
    try:
        header, program = decode_request(data)
    except ProtocolError:
        return
    assert isinstance(header["workspace"], str) and isinstance(program, bytes)


@given(st.binary(max_size=200))
def test_garbage_is_never_a_result(data: bytes) -> None:
    try:
        decode_result(data)
    except ProtocolError:
        return
    raise AssertionError("garbage decoded")


@pytest.mark.skipif(os.geteuid() != 0, reason="a whiteout is a 0/0 character device: mknod needs root")
def test_copy_back_replays_an_upper_layer(tmp_path: Path) -> None:
    upper, real = tmp_path / "upper", tmp_path / "real"
    (real / "dir").mkdir(parents=True)
    (real / "dir" / "old").write_text("old")
    (real / "deleted").write_text("x")
    (upper / "dir").mkdir(parents=True)
    (upper / "dir" / "new").write_text("new")
    os.chmod(upper / "dir" / "new", 0o4755)
    os.mknod(upper / "deleted", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    os.mkfifo(upper / "fifo")
    os.symlink("/etc/passwd", upper / "link")
    notes, errors = _apply(upper, real)
    assert sorted(os.listdir(real)) == ["dir"]
    assert sorted(os.listdir(real / "dir")) == ["new", "old"]
    assert stat.S_IMODE((real / "dir" / "new").stat().st_mode) == 0o755  # setuid dropped
    assert len(notes) == 2 and all("not kept" in n for n in notes)
    assert errors == []


def _apply(upper: Path, real: Path) -> tuple[list[str], list[str]]:
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _copyback.apply_upper(str(upper), fd)
    finally:
        os.close(fd)


def _squat(where: Path, name: str, kind: str) -> None:
    path = where / name
    if kind == "file":
        path.write_text("squat")
    elif kind == "dir":
        (path / "inner").mkdir(parents=True)
    elif kind == "symlink":
        os.symlink("/etc/passwd", path)
    elif kind == "dangling":
        os.symlink(str(where / "nowhere"), path)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["file", "dir", "symlink", "dangling", "fifo"])
def test_copy_back_cannot_be_squatted(tmp_path: Path, kind: str) -> None:
    """Entries named like temporaries, old and new scheme, in the workspace and in the upper layer."""
    upper, real = tmp_path / "upper", tmp_path / "real"
    (upper / "sub").mkdir(parents=True)
    (real / "sub").mkdir(parents=True)
    for where in (real, real / "sub"):
        for i in range(120):
            _squat(where, f".sandbox-copy-1-{i}", kind)
            _squat(where, f"{_copyback.TEMP_PREFIX}{i:032x}", kind)
    (upper / f"{_copyback.TEMP_PREFIX}{'0' * 32}").write_text("planted by the program")
    (upper / "out.txt").write_text("result")
    (upper / "sub" / "deep.txt").write_text("deep")
    before = {p.name for p in real.iterdir()}
    notes, errors = _apply(upper, real)
    assert errors == []
    assert (real / "out.txt").read_text() == "result" and (real / "sub" / "deep.txt").read_text() == "deep"
    assert {p.name for p in real.iterdir()} == before | {"out.txt"}  # no temporary left, the plant not kept
    assert any("reserved" in n for n in notes)
    squatter = real / ".sandbox-copy-1-0"
    assert squatter.is_symlink() == (kind in ("symlink", "dangling"))  # squatters untouched, not followed
    assert Path("/etc/passwd").read_text() != "result"


def test_copy_back_failures_are_reported_and_do_not_stop_the_rest(tmp_path: Path) -> None:
    upper, real = tmp_path / "upper", tmp_path / "real"
    (upper / "blocked").mkdir(parents=True)
    (upper / "blocked" / "x.txt").write_text("x")
    (upper / "fine.txt").write_text("fine")
    real.mkdir()
    (real / "blocked").write_text("a file where the run made a directory")
    os.chmod(real, 0o500)  # nothing can be created or removed in the workspace
    try:
        if os.geteuid() == 0:
            pytest.skip("root ignores directory permissions")
        notes, errors = _apply(upper, real)
    finally:
        os.chmod(real, 0o700)
    assert len(errors) == 2, errors
    assert all("Permission denied" in e for e in errors) and str(tmp_path) not in " ".join(errors)


def test_copy_back_reports_a_short_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upper, real = tmp_path / "upper", tmp_path / "real"
    upper.mkdir()
    real.mkdir()
    (upper / "a.txt").write_text("aaaa")
    (upper / "b.txt").write_text("bbbb")
    real_sendfile = os.sendfile
    calls = []

    def failing_sendfile(out: int, src: int, offset: int | None, count: int) -> int:
        calls.append(count)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_sendfile(out, src, offset, count)

    monkeypatch.setattr(_copyback.os, "sendfile", failing_sendfile)
    notes, errors = _apply(upper, real)
    assert len(errors) == 1 and "No space left on device" in errors[0], errors
    kept = sorted(p.name for p in real.iterdir())
    assert len(kept) == 1 and kept[0] in ("a.txt", "b.txt")  # the other one, whole; no temporary left
    assert (real / kept[0]).read_text() in ("aaaa", "bbbb")


# -- what a run's program does with few writes (each write to a page it shares with the zygote is a copy) --


def test_packed_landlock_rules_are_the_kernels_structs_back_to_back() -> None:
    from simulators.python.sandbox import _landlock

    rules = [(5, 0x1), (17, 0xFFFF), (300, 1 << 40)]
    buf = _landlock.pack_path_rules(rules)
    assert bytes(buf) == b"".join(struct.pack("=Qi", access, fd) for fd, access in rules)
    assert len(buf) == 12 * len(rules)  # struct landlock_path_beneath_attr is packed: u64 + s32
    empty = _landlock.pack_path_rules([])
    assert len(empty) == 0
    _landlock.add_packed_rules(-1, empty)  # nothing to add: no call at all (a call on fd -1 would raise)
    with pytest.raises(OSError, match="syscall 445"):
        _landlock.add_packed_rules(-1, buf)


def test_linux_wrappers_name_the_call_that_failed() -> None:
    from simulators.python.sandbox import _linux

    with pytest.raises(OSError, match=r"^\[Errno 9\] setns: Bad file descriptor"):
        _linux.setns(-1, 0)
    with pytest.raises(OSError, match=r"prctl\(987654\)") as info:
        _linux.prctl(987654)
    assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError, match=r"unshare\(0x1\)"):
        _linux.unshare(0x1)  # not a namespace flag
    with pytest.raises(OSError, match="syscall 436"):
        _linux.syscall(_linux.NR_CLOSE_RANGE, ctypes.c_uint(5), ctypes.c_uint(4), ctypes.c_uint(0))  # first > last
    assert _linux.prctl(39) in (0, 1)  # PR_GET_NO_NEW_PRIVS: a call that succeeds returns its value


def test_numpy_global_generator_is_reseeded_with_a_whole_key(monkeypatch: pytest.MonkeyPatch) -> None:
    np = pytest.importorskip("numpy")
    import numpy.random  # noqa: F401

    from simulators.python.sandbox import _program

    saved = np.random.get_state()
    try:
        np.random.seed(1)
        address = _program.numpy_mt_state()
        assert address, "numpy's MT19937 layout did not check out"
        before = np.random.get_state()[1].copy()
        _program._reseed(address)
        _name, key, pos, has_gauss, _cached = np.random.get_state()
        assert pos == 624 and has_gauss == 0  # the next draw generates a new block from the new key
        assert (key != before).sum() > 600  # 624 fresh words (a few may match by chance)
        draws = np.random.random(1000)
        assert 0.4 < draws.mean() < 0.6 and len(set(draws.tolist())) == 1000
        np.random.seed(7)  # numpy's own calls still work on the state we wrote
        assert np.random.random() == np.random.RandomState(7).random()
        np.random.standard_normal()  # caches a Gaussian: a run would start with it, so the address is refused
        assert _program.numpy_mt_state() == 0
    finally:
        np.random.set_state(saved)
    fake = type(sys)("numpy.random")  # another numpy, without the legacy generator: numpy's own seed() instead
    monkeypatch.setitem(sys.modules, "numpy.random", fake)
    assert _program.numpy_mt_state() == 0
    seeds: list[int] = []
    fake.seed = seeds.append  # type: ignore[attr-defined]
    _program._reseed(0)
    assert len(seeds) == 1 and 0 <= seeds[0] < 2**32
