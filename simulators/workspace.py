"""An episode's workspace directory on the host: created, repaired and written without following links.

The agent's programs may rearrange their workspace as they like: delete ``results/``, replace it
with a file, make it unreadable, fill the disk. That is the agent's doing, never a fault of the
service. What the services need they repair (``results/``, where the sql tool saves its CSV files,
is made a writable directory again when it is not one); what they cannot repair is a
:class:`WorkspaceError`, which the app answers as a 4xx error whose message holds no host path.
Every write is relative to directory descriptors, through a temporary name, and never follows a
symlink the agent planted (the basic runner lets programs create them).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile

from simulators import _owners

__all__ = ["PREFIX", "RESULTS", "WorkspaceError", "create", "write_files"]

RESULTS = "results"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".agentrl-save-"


class WorkspaceError(Exception):
    """The workspace is in a state a service cannot use or repair (the agent's doing).

    The message says what is wrong in workspace-relative terms, never with a host path.
    """


#: ``agentrl-ws-<pid>-<start time>-<pid namespace>-XXXXXXXX``: the name says which process owns the workspace
PREFIX = "agentrl-ws-"
_OWNED = re.compile(r"agentrl-ws-(\d+)-(\d+)-(\d+)-")
_named: tuple[int, str] = (0, "")  # (pid, name prefix) of this process's workspaces, remade after a fork
_swept: set[str] = set()  # folders this process has swept


def create(root: str | None, files: dict[str, str]) -> str:
    """A new workspace under ``root`` (the system temp dir if None) with ``results/`` and ``files``.

    Its name records the owning process. The first workspace a process makes in a folder removes
    that folder's workspaces whose owner is gone (a process killed mid-episode cannot remove its own).
    """
    global _named
    pid = os.getpid()
    if _named[0] != pid:
        owner = _owners.owner_of(pid)
        _named = (pid, PREFIX + "-".join(map(str, owner)) + "-" if owner else PREFIX)
    folder = root if root is not None else tempfile.gettempdir()
    if folder not in _swept:
        _swept.add(folder)
        _owners.sweep(folder, PREFIX, _read_owner)
    path = tempfile.mkdtemp(prefix=_named[1], dir=folder)
    try:
        os.makedirs(os.path.join(path, RESULTS))
        for rel, text in files.items():
            full = os.path.join(path, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8", newline="") as f:
                f.write(text)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def _read_owner(path: str, name: str) -> _owners.Owner | None:
    m = _OWNED.match(name)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]))


def write_files(workspace: str, files: dict[str, str] | dict[str, bytes]) -> None:
    """Write ``{"results/<name>": text or bytes}`` into ``workspace``, repairing ``results/`` first.

    Raises:
        WorkspaceError: a file could not be written (the disk is full, ...); the files before it are kept.
    """
    if not files:
        return
    try:
        ws_fd = os.open(workspace, _DIR_FLAGS)
    except OSError as exc:
        raise WorkspaceError(f"the workspace cannot be opened ({_reason(exc)})") from None
    try:
        try:
            results_fd = _results_dir(ws_fd)
        except OSError as exc:
            raise WorkspaceError(f"{RESULTS}/ could not be made a writable directory again ({_reason(exc)})") from None
        try:
            for rel, text in files.items():
                head, _, name = rel.partition("/")
                if head != RESULTS or not name or "/" in name:
                    raise ValueError(f"only files directly in {RESULTS}/ are written here, not {rel!r}")
                try:
                    _replace_file(results_fd, name, text.encode("utf-8") if isinstance(text, str) else text)
                except OSError as exc:
                    raise WorkspaceError(
                        f"{rel} could not be saved in the workspace ({_reason(exc)}); free space or fix the "
                        f"workspace with the python tool"
                    ) from None
        finally:
            os.close(results_fd)
    finally:
        os.close(ws_fd)


def _results_dir(ws_fd: int) -> int:
    """A descriptor of ``results/``, recreated when it is missing or not a directory, made writable."""
    try:
        st: os.stat_result | None = os.stat(RESULTS, dir_fd=ws_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(RESULTS, dir_fd=ws_fd)  # a file, symlink or fifo in the place of the sql tool's directory
        st = None
    if st is None:
        os.mkdir(RESULTS, 0o755, dir_fd=ws_fd)
    fd = os.open(RESULTS, _DIR_FLAGS, dir_fd=ws_fd)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & 0o700 != 0o700:
        os.fchmod(fd, mode | 0o700)
    return fd


def _replace_file(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` in ``dir_fd`` whole or not at all, whatever is there now."""
    tmp = _TEMP_PREFIX + os.urandom(16).hex()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__
