"""Apply a run's overlay upper layer (its changes to the workspace) to the real workspace.

A run sees the workspace through an overlay whose upper layer lives on a size- and inode-capped
tmpfs, so a file-size or file-count bomb stops at the cap instead of filling the host's disk. When
the run is over the host replays the upper layer onto the real directory: new and modified
regular files and directories are copied (permission bits only: never setuid, setgid or sticky),
whiteouts and opaque directories delete, and anything else (symlinks, fifos, devices) is dropped.
Every operation is relative to directory descriptors and never follows a symlink.

A file is copied to a temporary name in its directory and renamed over its target. Temporaries
start with :data:`TEMP_PREFIX` and end in 128 random bits: the program cannot predict one, and it
cannot create any name with that prefix (such entries of the upper layer are dropped, never
copied back), so squatting cannot make a copy fail. A failed entry does not stop the others; every
failure is returned, and the run is then reported as failed, never as a success.
"""

from __future__ import annotations

import errno
import os
import stat

_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 64


TEMP_PREFIX = ".agentrl-copyback-"
MAX_ERRORS = 20


def apply_upper(upper: str, real_fd: int) -> tuple[list[str], list[str]]:
    """Replay ``upper`` onto the directory open at ``real_fd``.

    Returns (notes on what was dropped, errors: changes that could not be kept). Paths in both are
    relative to the workspace.
    """
    up_fd = os.open(upper, _DIR_FLAGS)
    try:
        return apply_upper_fd(up_fd, real_fd)
    finally:
        os.close(up_fd)


def apply_upper_fd(up_fd: int, real_fd: int) -> tuple[list[str], list[str]]:
    """:func:`apply_upper` for an upper layer open at ``up_fd`` (the host holds the run's tmpfs this way)."""
    notes: list[str] = []
    errors: list[str] = []
    _sync_dir(up_fd, real_fd, "", 0, notes, errors)
    return notes, errors


def _sync_dir(up_fd: int, real_fd: int, prefix: str, depth: int, notes: list[str], errors: list[str]) -> None:
    with os.scandir(up_fd) as it:
        names = [entry.name for entry in it]
    for name in names:
        rel = prefix + name
        if name.startswith(TEMP_PREFIX):
            notes.append(f"{rel!r}: names starting with {TEMP_PREFIX!r} are reserved, not kept")
            continue
        try:
            st = os.stat(name, dir_fd=up_fd, follow_symlinks=False)
            mode = st.st_mode
            if stat.S_ISCHR(mode) and st.st_rdev == 0:  # whiteout: deleted in this run
                _remove(real_fd, name)
            elif stat.S_ISDIR(mode):
                _sync_subdir(up_fd, real_fd, name, rel, st, depth, notes, errors)
            elif stat.S_ISREG(mode):
                _copy_file(up_fd, real_fd, name, st)
            else:
                notes.append(f"{rel!r}: not a regular file or directory, not kept")
        except OSError as exc:
            if len(errors) < MAX_ERRORS:
                errors.append(f"{rel!r}: {exc.strerror or type(exc).__name__}")


def _sync_subdir(
    up_fd: int, real_fd: int, name: str, rel: str, st: os.stat_result, depth: int, notes: list[str], errors: list[str]
) -> None:
    existing = _lstat(real_fd, name)
    if existing is not None and (_is_opaque(up_fd, name) or not stat.S_ISDIR(existing.st_mode)):
        _remove(real_fd, name)
        existing = None
    if existing is None:
        os.mkdir(name, stat.S_IMODE(st.st_mode) & 0o777 | 0o700, dir_fd=real_fd)
    if depth + 1 >= MAX_DEPTH:
        notes.append(f"{rel!r}: directories nested deeper than {MAX_DEPTH} levels, contents not kept")
        return
    sub_up = os.open(name, _DIR_FLAGS, dir_fd=up_fd)
    try:
        sub_real = os.open(name, _DIR_FLAGS, dir_fd=real_fd)
        try:
            _sync_dir(sub_up, sub_real, rel + "/", depth + 1, notes, errors)
        finally:
            os.close(sub_real)
    finally:
        os.close(sub_up)


def _copy_file(up_fd: int, real_fd: int, name: str, st: os.stat_result) -> None:
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=up_fd)
    try:
        tmp, dst = _create_temp(real_fd)
        try:
            try:
                remaining = st.st_size
                while remaining > 0:
                    n = os.sendfile(dst, src, None, min(remaining, 1 << 30))
                    if n <= 0:
                        raise OSError(errno.EIO, "the file shrank while it was copied")
                    remaining -= n
                os.fchmod(dst, stat.S_IMODE(st.st_mode) & 0o777)
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dst)
            existing = _lstat(real_fd, name)
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                _remove(real_fd, name)
            os.replace(tmp, name, src_dir_fd=real_fd, dst_dir_fd=real_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=real_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(src)


def _create_temp(real_fd: int) -> tuple[str, int]:
    """A new, empty file under an unpredictable name in ``real_fd``: (name, write descriptor)."""
    for _ in range(8):
        tmp = TEMP_PREFIX + os.urandom(16).hex()
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return tmp, os.open(tmp, flags, 0o600, dir_fd=real_fd)
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary name in the workspace")


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _is_opaque(dir_fd: int, name: str) -> bool:
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        for attr in _OPAQUE_XATTRS:
            try:
                if os.getxattr(fd, attr) == b"y":
                    return True
            except OSError:
                continue
        return False
    finally:
        os.close(fd)


def _remove(dir_fd: int, name: str) -> None:
    """Remove ``name`` (a whole tree if it is a directory) without following symlinks."""
    st = _lstat(dir_fd, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        with os.scandir(sub) as it:
            children = [entry.name for entry in it]
        for child in children:
            _remove(sub, child)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dir_fd)
