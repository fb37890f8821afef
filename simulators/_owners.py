"""Temp folders that name the process owning them, and the sweep that removes those whose owner is gone.

A process killed with SIGKILL (the OOM killer, ``kill -9``, a CI timeout) runs no clean-up, so the
folders it made in the temp dir stay. The sandbox's scratch folders and the episodes' workspaces
record their owner (pid, start time, pid namespace), and the next process that makes such a folder
removes the ones whose owner no longer runs. The start time tells a reused pid from the process
that first had it; a folder of another pid namespace is never judged, since its pids mean nothing
here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

__all__ = ["Owner", "owner_of", "pid_namespace", "start_time", "sweep"]

#: ``(pid, start time, pid namespace)`` of a folder's owner
Owner = tuple[int, int, int]


def start_time(pid: int) -> int | None:
    """When a live process started (clock ticks after boot, ``/proc/PID/stat``), or None when it is gone.

    It tells a reused pid from the process that first had it.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_namespace() -> int:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``): the pids it can judge."""
    return os.stat("/proc/self/ns/pid").st_ino


def owner_of(pid: int) -> Owner | None:
    """The owner record of a live process of our pid namespace, or None when it is gone."""
    start = start_time(pid)
    return None if start is None else (pid, start, pid_namespace())


def sweep(folder: str, prefix: str, read_owner: Callable[[str, str], Owner | None], keep: str = "") -> list[str]:
    """Remove this user's folders ``folder/prefix*`` whose owner no longer runs; return them.

    ``read_owner(path, name)`` gives a folder's owner, or None for a folder that is not to be judged
    (no owner recorded, unreadable, garbage). Left alone too: ``keep``, symlinks, files, another
    user's folders, and folders of another pid namespace.
    """
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return removed
    uid, ns = os.geteuid(), pid_namespace()
    for name in names:
        path = os.path.join(folder, name)
        if path == keep:
            continue
        try:
            st = os.lstat(path)
            if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != uid:
                continue
            owner = read_owner(path, name)
        except (OSError, ValueError):
            continue
        if owner is None:
            continue
        pid, start, owner_ns = owner
        if owner_ns != ns or start_time(pid) == start:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
