"""The file side of a :class:`~agentrl_envs.data.ReplayBuffer`: create, validate, lock, map and scan. Private.

Kept apart from replay.py so that the hot path (append, get) reads on its own; the format and the
recovery invariant are described in _ring.py. These functions take and return plain values (a
mapping, entries, sequence ranges) and never touch a buffer: ``ReplayBuffer`` alone reads and sets
its own fields (``tests/data/test_replay.py`` checks that nothing here reaches a private attribute).
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import secrets
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agentrl_envs.data import _ring as ring
from agentrl_envs.data._ring import HEADER_PAGE, HEADER_SIZE, KIND_TOMBSTONE, Entry, SeqRanges
from agentrl_envs.data.errors import BufferLockedError, FormatError, StorageError

__all__: list[str] = []  # private module

MAX_REPORTED_SEQS = 1_000
MIN_CAPACITY = 64 << 10  # create() makes rings at least this big, in whole 4 KiB pages (or larger pages)
QUARANTINE_REGION_CAP = 4 << 20


@dataclass(frozen=True)
class Index:
    """What a scan of the ring finds: the live entries in ring order and the seqs known lost."""

    kept: list[Entry]
    lost: SeqRanges
    tail: int
    next_seq: int


@dataclass(frozen=True)
class Recovered:
    """What :func:`recover` found: the index, and what the open reports (``ReplayBuffer.recovery``)."""

    index: Index
    torn_tail: bool
    quarantined: SeqRanges  # lost to corruption found by this open
    stale: int


def create_file(path: Path, capacity: int, overwrite: bool) -> None:
    """Write a new, fully allocated buffer file at ``path`` (via a temporary file; see ``ReplayBuffer.create``)."""
    if path.exists() and overwrite:
        _refuse_if_locked(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _preallocate(fd, HEADER_PAGE + capacity)
        salt = secrets.token_bytes(16)
        header = ring.FILE_HEADER.pack(ring.FILE_MAGIC, ring.FORMAT_VERSION, 0, HEADER_PAGE, capacity, salt, time.time_ns())
        os.pwrite(fd, header + ring.crc_extend(0, header).to_bytes(4, "little"), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # atomic and exclusive: fails if someone created path meanwhile
    except FileExistsError:
        raise FileExistsError(f"{path} already exists: open it with ReplayBuffer.open(path), or pass overwrite=True") from None
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def open_file(
    path: Path, readonly: bool, capacity_bytes: int | None, durability: str, repair: bool
) -> tuple[BinaryIO, mmap.mmap, int, bytes]:
    """Validate the file, lock it (writers) and map it; see ``ReplayBuffer.open``.

    Returns:
        ``(file, mapping, capacity, salt)``; the caller owns the file and the mapping.
    """
    if durability not in ("process", "fsync"):
        raise ValueError(f"durability={durability!r}: use 'process' or 'fsync'")
    if path.is_dir():
        raise FormatError(f"{path} is a directory; pass the path of a replay buffer file")
    try:
        file = open(path, "rb" if readonly else "r+b", buffering=0)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; create it with ReplayBuffer.create(path, capacity_bytes=...)") from None
    try:
        fd = file.fileno()
        size = os.fstat(fd).st_size
        capacity, salt = _read_file_header(path, fd, size)
        if capacity_bytes is not None and capacity_bytes != capacity:
            raise FormatError(
                f"{path} has a capacity of {capacity:,} bytes, not {capacity_bytes:,}; open it without capacity_bytes "
                "(or with the capacity it was created with), or create a new buffer"
            )
        if not readonly:
            _lock(path, fd, salt)
        expected = HEADER_PAGE + capacity
        if size != expected:
            if not repair or readonly:
                what = "truncated" if size < expected else "longer than its header says"
                raise FormatError(
                    f"{path} is {size:,} bytes but its header says {expected:,}: the file was {what} (a partial copy?). "
                    "Restore it, or open it for writing with repair=True to keep the records that remain"
                )
            if size < expected:
                _preallocate(fd, expected)
            else:
                os.ftruncate(fd, expected)
        mm = mmap.mmap(fd, expected, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
    except BaseException:
        file.close()
        raise
    return file, mm, capacity, salt


def _read_file_header(path: Path, fd: int, size: int) -> tuple[int, bytes]:
    if size == 0:
        raise FormatError(
            f"{path} is empty (0 bytes), so it is not a replay buffer: create() never leaves an empty file. "
            "Delete it and create the buffer again"
        )
    raw = os.pread(fd, ring.FILE_CRC_OFFSET + 4, 0)
    if len(raw) < ring.FILE_CRC_OFFSET + 4 or raw[:8] != ring.FILE_MAGIC:
        raise FormatError(f"{path} is not an agentrl replay buffer (no 'AGRLRING' header); pass the path of one")
    head, crc = raw[: ring.FILE_CRC_OFFSET], int.from_bytes(raw[ring.FILE_CRC_OFFSET :], "little")
    if ring.crc_extend(0, head) != crc:
        raise FormatError(f"the header of {path} is damaged (checksum mismatch); the records cannot be located safely")
    _magic, version, _flags, header_size, capacity, salt, _created = ring.FILE_HEADER.unpack(head)
    if version != ring.FORMAT_VERSION or header_size != HEADER_PAGE:
        raise FormatError(
            f"{path} is replay buffer format version {version}; this agentrl reads version {ring.FORMAT_VERSION}. "
            "Open it with the agentrl version that wrote it and export it (export_jsonl or shards)"
        )
    if capacity < MIN_CAPACITY or capacity % HEADER_PAGE or HEADER_PAGE + capacity >= 1 << 63:
        # create() never writes such a header; trusting it would let repair=True cut the file to its size.
        raise FormatError(
            f"the header of {path} gives a ring capacity of {capacity:,} bytes, which create() never writes (a forged or "
            "foreign header); the records cannot be located safely. Restore the file from a copy"
        )
    return capacity, salt


def _lock(path: Path, fd: int, salt: bytes) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        hint = os.pread(fd, ring.HINT_SIZE, ring.HINT_OFFSET)
        pid = ring.HINT.unpack(hint[:-4])[3] if len(hint) == ring.HINT_SIZE else 0
        raise BufferLockedError(
            f"{path} is open for writing elsewhere (last writer pid {pid}); a buffer has one writer at a time. "
            "Read alongside it with ReplayBuffer.open(path, readonly=True), or close the other writer first"
        ) from None


def recover(path: Path, mm: mmap.mmap, salt: int, cap: int, readonly: bool, hint: tuple[int, int, int, int] | None) -> Recovered:
    """Rebuild the index from the ring; a writer also quarantines gaps and clears torn headers.

    ``salt`` is the CRC seed of the file's salt, ``hint`` the writer's last hint (None: none valid).
    """
    hint_next_seq = hint[0] if hint else None
    if readonly:  # a writer may be appending while we scan
        plan, settled = reader_scan(mm, salt, cap, hint_next_seq)
    else:  # we hold the lock: nothing changes under the scan
        plan, settled = ring.plan(ring.scan(mm, HEADER_PAGE, cap, salt), cap, hint_next_seq), True
    gaps = plan.gaps if settled else []  # unsettled: a writer's appends in progress, not damage
    kept = list(plan.kept)
    lost = SeqRanges()
    for entry in kept:
        if entry.kind == KIND_TOMBSTONE:
            lost.add(entry.seq, entry.width, "was damaged on disk and quarantined by an earlier open")
    new_lost = SeqRanges()
    sidecar = path.with_name(path.name + ".quarantine")
    notes = open_sidecar(sidecar) if gaps and not readonly else None  # refused before anything changes
    try:
        for gap in gaps:
            new_lost.add(gap.first_seq, gap.count, "")
            reason = "was damaged on disk (checksum mismatch) and quarantined when the buffer was opened"
            if notes is not None:
                regions = [
                    (off, mm[HEADER_PAGE + off : HEADER_PAGE + off + min(n, QUARANTINE_REGION_CAP)]) for off, n in gap.regions
                ]
                quarantine_note(notes, gap.first_seq, gap.count, regions)
                reason += f"; its bytes are in {sidecar}"
                if gap.tombstone_at is not None:
                    start = HEADER_PAGE + gap.tombstone_at
                    mm[start : start + HEADER_SIZE] = ring.pack_header(salt, KIND_TOMBSTONE, 0, gap.first_seq, 0, gap.count)
                    kept.append(Entry(gap.first_seq, gap.tombstone_at, 0, KIND_TOMBSTONE, gap.count, 0))
            lost.add(gap.first_seq, gap.count, reason)
    finally:
        if notes is not None:
            notes.close()
    top = plan.next_seq - plan.lost_tail
    new_lost.add(top, plan.lost_tail, "")
    lost.add(top, plan.lost_tail, "was committed but its bytes are damaged (the newest records of the file)")
    torn = _torn_positions(mm, cap, plan.tail, {e.off for e in kept})
    if not readonly:
        for entry in plan.stale:
            if ring.parse_header(mm, entry.off, salt, HEADER_PAGE, cap) == entry:
                mm[HEADER_PAGE + entry.off : HEADER_PAGE + entry.off + HEADER_SIZE] = ring.ZERO_HEADER
        for pos in torn:
            mm[HEADER_PAGE + pos : HEADER_PAGE + pos + HEADER_SIZE] = ring.ZERO_HEADER
    kept.sort()
    return Recovered(Index(kept, lost, plan.tail, plan.next_seq), bool(torn), new_lost, len(plan.stale))


def _torn_positions(mm: mmap.mmap, cap: int, tail: int, live_offsets: set[int]) -> list[int]:
    """Write positions (the tail, and 0 after a wrap) holding the start of a header that did not validate."""
    out = []
    for pos in {tail, 0}:
        if pos in live_offsets or pos + HEADER_SIZE > cap:
            continue
        if mm[HEADER_PAGE + pos : HEADER_PAGE + pos + 4] == ring.RECORD_MAGIC:
            out.append(pos)
    return out


#: Why a reader's rescan lists a seq as lost: its bytes are not in the file (a gap that
#: :func:`reader_scan` confirmed). Once it is older than the oldest live record it was evicted since,
#: and the reader says so, as the writer does when it evicts a tombstone.
READER_GAP = "is missing from the file (damaged); a writer's open will quarantine it"
#: How many times :func:`reader_scan` re-reads the gaps of a ring that a writer keeps changing
SETTLE_ROUNDS = 8


def reader_scan(mm: mmap.mmap, salt: int, cap: int, hint_next_seq: int | None = None) -> tuple[ring.Plan, bool]:
    """Scan and plan the ring as a reader, whose writer may be appending meanwhile; returns (plan, settled).

    One pass is not a snapshot, so it can show a gap that the file never had: it read a record that
    the writer evicted (zeroed) later in the pass, then found the next ones already zeroed; or it
    passed a position before the writer published a record there, then read a newer record further
    on. The writer's order rules out both once, after the pass, each gap's bytes are read again and
    the two entries around it are still in the file: a record that was live then lies between them
    and is found. So each round re-reads the gaps and re-checks their neighbours, and the plan is
    ``settled`` when a round finds nothing new and loses no neighbour: every gap left is damage. A
    writer that keeps changing the gaps for :data:`SETTLE_ROUNDS` rounds leaves them unsettled.
    """
    entries = ring.scan(mm, HEADER_PAGE, cap, salt)
    plan = ring.plan(entries, cap, hint_next_seq)
    for _ in range(SETTLE_ROUNDS):
        if not plan.gaps:
            return plan, True
        by_seq = {e.seq: e for e in plan.kept}
        by_end = {e.seq + e.width: e for e in plan.kept}
        known = set(entries)
        regions = [region for g in plan.gaps for region in g.regions]
        found = [e for off, n in regions for e in ring.scan(mm, HEADER_PAGE, cap, salt, start=off, stop=off + n)]
        new = [e for e in found if e not in known]
        around = [e for g in plan.gaps for e in (by_end[g.first_seq], by_seq[g.first_seq + g.count])]
        gone = {e for e in around if ring.parse_header(mm, e.off, salt, HEADER_PAGE, cap) != e}
        if not new and not gone:
            return plan, True
        entries = sorted([e for e in entries if e not in gone] + new, key=lambda e: e.off)
        plan = ring.plan(entries, cap, hint_next_seq)
    return plan, not plan.gaps


def scan_index(mm: mmap.mmap, salt: int, cap: int) -> Index:
    """A reader's full rescan of the ring (it changes nothing; a writer's open quarantines the gaps).

    Gaps that :func:`reader_scan` could not settle are not reported: a writer was changing them, and
    the next rescan looks again.
    """
    plan, settled = reader_scan(mm, salt, cap)
    lost = SeqRanges()
    for g in plan.gaps if settled else ():
        lost.add(g.first_seq, g.count, READER_GAP)
    return Index(list(plan.kept), lost, plan.tail, plan.next_seq)


def follow(mm: mmap.mmap, salt: int, cap: int, tail: int, next_seq: int, target: int) -> list[Entry]:
    """Entries the writer published after ``next_seq - 1`` (at ``tail``, or at 0 after a wrap), up to ``target``."""
    out: list[Entry] = []
    while next_seq < target:
        for pos in (tail, 0):
            entry = ring.parse_header(mm, pos, salt, HEADER_PAGE, cap)
            if entry is not None and entry.seq == next_seq:
                break
        else:
            break
        out.append(entry)
        tail, next_seq = entry.end, entry.seq + entry.width
    return out


def evicted(mm: mmap.mmap, salt: int, cap: int, order: Iterable[Entry], head: int) -> int:
    """How many of the oldest entries the hint says were evicted and the file agrees (their header is gone)."""
    n = 0
    for entry in order:
        if entry.seq + entry.width > head or ring.parse_header(mm, entry.off, salt, HEADER_PAGE, cap) == entry:
            break  # not evicted per the hint; or still in the file, so still live: the hint is wrong (or forged)
        n += 1
    return n


def _refuse_if_locked(path: Path) -> None:
    with open(path, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BufferLockedError(f"{path} is open for writing by another process; close it before overwrite=True") from None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise StorageError(
                f"cannot preallocate {size:,} bytes ({exc.strerror}); free disk space or choose a smaller capacity_bytes"
            ) from exc
        os.ftruncate(fd, size)  # a filesystem without fallocate: sparse, but the size is right


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_sidecar(sidecar: Path) -> BinaryIO:
    """Open ``<path>.quarantine`` for appending, without following a symlink; it must be a regular file.

    A link planted there cannot redirect the write elsewhere, and a FIFO cannot block the open.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(sidecar, flags, 0o644)
    except OSError as exc:
        raise StorageError(
            f"cannot write the quarantine file {sidecar} ({exc.strerror}; a symlink there is refused): "
            "remove or fix it and open the buffer again. Nothing in the buffer was changed"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StorageError(
            f"{sidecar} is not a regular file, and the quarantined bytes go there: remove it and open the buffer again. "
            "Nothing in the buffer was changed"
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def quarantine_note(f: BinaryIO, first_seq: int, count: int, regions: list[tuple[int, bytes]]) -> None:
    """Append the damaged bytes of one gap to the quarantine file: a JSON line, then the raw bytes."""
    for offset, data in regions:
        note = {"first_seq": first_seq, "count": count, "offset": offset, "length": len(data), "unix_ns": time.time_ns()}
        f.write(json.dumps(note).encode() + b"\n" + data + b"\n")
