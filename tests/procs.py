"""Process inspection through /proc, shared by the tests and the sandbox soak.

Pids printed inside a sandboxed run are pids of its own pid namespace, so tests find the processes
a run started by a marker in their command line instead.
"""

from __future__ import annotations

import os

__all__ = ["alive", "descendants", "with_marker"]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """A live process; a zombie counts as dead (killed, not yet reaped)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (walking /proc by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for kid in children.get(stack.pop(), []):
            found.append(kid)
            stack.append(kid)
    return found


def with_marker(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read() and alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found
