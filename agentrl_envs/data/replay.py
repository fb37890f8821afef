"""A crash-safe replay buffer: a preallocated, memory-mapped ring of checksummed trajectory records.

``ReplayBuffer.create(path, capacity_bytes=...)`` preallocates the file; ``append`` writes a record
and returns its sequence number, evicting the oldest records when the ring is full; ``get``,
``sample`` and ``latest`` read them back. One process writes (an exclusive ``flock``; a second
writer is refused with :class:`BufferLockedError`); any number of processes read with
``ReplayBuffer.open(path, readonly=True)``, following the writer as it goes.

Guarantees (the crash tests in ``tests/data/test_crash.py`` check them with ``kill -9``):

* A record whose ``append`` returned survives the writer process being killed at any instant, until
  newer records evict it. ``durability="fsync"`` extends that to power loss, at a cost per append.
* No torn record is ever returned: the payload is written before the header that publishes it, both
  carry CRC32C checksums, and readers re-check the header after copying. A reader that scans the
  ring while the writer appends calls a gap damage only once re-reading confirms it
  (``_open.reader_scan``).
* Reopening recovers by scanning the ring: a torn tail is discarded (``recovery.torn_tail``); records
  lost to mid-log corruption are counted (``recovery.quarantined``), their bytes copied to
  ``<path>.quarantine`` (never through a symlink) and a tombstone left so that ``get`` says so and
  the next open does not count them again.
* A forged file (the CRC salt is in its header, so anyone who can write it can forge entries and
  hints) cannot make an open allocate more than the file's size allows, and a forged hint cannot
  hide records from readers: a record is dropped only when its header is gone from the file.
* A file truncated under an open handle is an error (:class:`FormatError`), not a SIGBUS: every
  call checks the file's size before it touches the map. A truncation that lands while a call is
  reading the map can still fault; the check catches every truncation between calls.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NoReturn

import numpy as np

from agentrl_envs.data import _ring as ring
from agentrl_envs.data._open import (
    MAX_REPORTED_SEQS,
    MIN_CAPACITY,
    READER_GAP,
    Index,
    create_file,
    evicted,
    follow,
    open_file,
    recover,
    scan_index,
)
from agentrl_envs.data._ring import HEADER_PAGE, HEADER_SIZE, KIND_RECORD, Entry, SeqRanges
from agentrl_envs.data.codec import DEFAULT_LIMITS, Limits, Trajectory, decode, encode
from agentrl_envs.data.codec import is_int as _is_int
from agentrl_envs.data.errors import (
    BufferLockedError,
    CorruptRecordError,
    FormatError,
    RecordNotFoundError,
    RecordTooLargeError,
    StorageError,
)

__all__ = ["CRASH_PHASES", "DEFAULT_CAPACITY", "RecoveryReport", "ReplayBuffer"]

DEFAULT_CAPACITY = 256 << 20
DEFAULT_RESIDENT = 64 << 20
RELEASE_CHUNK = 4 << 20  # written-behind pages are handed back to the kernel in chunks this big
READ_RETRIES = 4

# Test hook: SIGKILL this process at a named phase of an append (see tests/data/test_crash.py).
CRASH_PHASES = ("evict_one", "evicted", "payload_half", "payload", "header_half", "header", "hint_half", "hint")
_crash_phase: str | None = os.environ.get("AGENTRL_REPLAY_CRASH_AT") or None
_crash_on: int = int(os.environ.get("AGENTRL_REPLAY_CRASH_ON", "1"))


def set_crash_hook(phase: str | None, on_append: int = 1) -> None:
    """Make this process SIGKILL itself at ``phase`` of its ``on_append``-th append (tests only)."""
    global _crash_phase, _crash_on
    if phase is not None and phase not in CRASH_PHASES:
        raise ValueError(f"unknown crash phase {phase!r}; use one of {CRASH_PHASES}")
    _crash_phase, _crash_on = phase, on_append


# Bumped in every forked child. A handle remembers the value it was opened under, so the writer's
# fork check is a comparison on each append, and ``os.getpid()`` (a system call) runs only on a mismatch.
_fork_generation = 0


def _forked() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_forked)


@dataclass(frozen=True)
class RecoveryReport:
    """What opening the buffer found.

    Attributes:
        records: live records after recovery.
        first_seq: the oldest live seq, or None when empty.
        next_seq: the seq the next append gets.
        torn_tail: an unfinished record at the write position was discarded.
        quarantined: records lost to corruption found by this open (between valid records, or
            committed records missing past the newest one).
        quarantined_seqs: their seqs (the first 1,000).
        stale: valid records out of ring order that were discarded (only after tampering).
        seconds: how long the scan took.
    """

    records: int
    first_seq: int | None
    next_seq: int
    torn_tail: bool
    quarantined: int
    quarantined_seqs: tuple[int, ...]
    stale: int
    seconds: float


class ReplayBuffer:
    """A ring of trajectory records in one preallocated file. Build with :meth:`create` or :meth:`open`.

    Thread-safe within a process. Not fork-safe: a child process must open the buffer itself.
    """

    def __init__(self) -> None:
        raise TypeError("use ReplayBuffer.create(path, capacity_bytes=...) or ReplayBuffer.open(path)")

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        capacity_bytes: int = DEFAULT_CAPACITY,
        *,
        overwrite: bool = False,
        durability: Literal["process", "fsync"] = "process",
        max_resident_bytes: int = DEFAULT_RESIDENT,
        limits: Limits = DEFAULT_LIMITS,
    ) -> ReplayBuffer:
        """Preallocate a new buffer file and open it for writing.

        Args:
            path: the file to create; it appears atomically, fully allocated, or not at all.
            capacity_bytes: size of the ring, rounded up to whole pages (at least 64 KiB).
            overwrite: replace an existing file (refused while a writer holds it).
            durability: ``"process"`` survives the process being killed; ``"fsync"`` also power loss
                (two ``msync`` calls per append).
            max_resident_bytes: how much of the ring this process keeps mapped behind the write
                position; older pages go back to the kernel (``MADV_DONTNEED``; the data stays in
                the file), so a ring larger than this does not grow the writer's RSS. Rings no
                larger are never released, which is fastest.
            limits: caps checked on every append.

        Raises:
            FileExistsError: ``path`` exists and ``overwrite`` is False.
            FileNotFoundError: the folder of ``path`` does not exist.
            BufferLockedError: ``overwrite`` and another writer holds the file.
            StorageError: the disk cannot hold ``capacity_bytes``.
        """
        path = Path(path)
        if not _is_int(capacity_bytes) or capacity_bytes < 1:
            raise ValueError(f"capacity_bytes={capacity_bytes!r}: use a positive number of bytes, e.g. 256 << 20")
        capacity = max(MIN_CAPACITY, -(-int(capacity_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE)
        if path.is_dir():
            raise FormatError(f"{path} is a directory; pass the path of the buffer file to create")
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} already exists: open it with ReplayBuffer.open(path), or pass overwrite=True")
        if durability not in ("process", "fsync"):  # before the file exists: a refused create leaves nothing behind
            raise ValueError(f"durability={durability!r}: use 'process' or 'fsync'")
        if not path.parent.is_dir():
            raise FileNotFoundError(f"the folder {path.parent} does not exist; create it first (the buffer file goes in it)")
        create_file(path, capacity, overwrite)
        # A new ring is known to be empty: skip the recovery scan, which would read every page.
        return cls._open_file(path, False, None, durability, False, max_resident_bytes, limits, fresh=True)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        capacity_bytes: int | None = None,
        durability: Literal["process", "fsync"] = "process",
        repair: bool = False,
        max_resident_bytes: int = DEFAULT_RESIDENT,
        limits: Limits = DEFAULT_LIMITS,
    ) -> ReplayBuffer:
        """Open an existing buffer, recovering from whatever a crash left (see :attr:`recovery`).

        Args:
            path: the buffer file.
            readonly: read alongside a writer in another process; never writes or locks.
            capacity_bytes: if given, refuse a file of another capacity.
            durability: as in :meth:`create`.
            repair: extend a truncated file back to its size instead of refusing it (the records in
                the part that was cut off are lost).
            max_resident_bytes: as in :meth:`create`.
            limits: caps checked on every append.

        Raises:
            FileNotFoundError: no such file.
            FormatError: not a buffer, another format version or capacity, or truncated.
            BufferLockedError: another writer has it open (for ``readonly=False``).
        """
        return cls._open_file(Path(path), readonly, capacity_bytes, durability, repair, max_resident_bytes, limits)

    @classmethod
    def _open_file(
        cls,
        path: Path,
        readonly: bool,
        capacity_bytes: int | None,
        durability: str,
        repair: bool,
        max_resident_bytes: int,
        limits: Limits,
        fresh: bool = False,
    ) -> ReplayBuffer:
        """The one constructor: map the file (``_open.open_file`` validates and locks it), set every field
        (``_setup``), then recover the index from the ring (or, for a ``fresh`` file, write the first hint)."""
        file, mm, capacity, salt = open_file(path, readonly, capacity_bytes, durability, repair)
        buf = cls.__new__(cls)
        buf._setup(path, file, mm, capacity, salt, readonly, durability == "fsync", limits, max(0, int(max_resident_bytes)))
        try:
            if fresh:
                buf._write_hint()
            else:
                buf._recover()
                if buf._capacity > buf._resident:
                    buf._release(0, buf._capacity)  # the scan touched every page; hand them back
        except BaseException:
            mm.close()
            file.close()  # releases the writer lock
            raise
        return buf

    def _setup(
        self,
        path: Path,
        file: Any,
        mm: mmap.mmap,
        capacity: int,
        salt: bytes,
        readonly: bool,
        durable: bool,
        limits: Limits,
        resident: int,
    ) -> None:
        self._path = path
        self._file = file
        self._fd: int = file.fileno()
        self._mm = mm
        self._capacity = capacity
        self._salt = ring.crc_extend(0, salt)
        self._readonly = readonly
        self._durable = durable
        self._limits = limits
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._fork_generation = _fork_generation
        self._file_end = HEADER_PAGE + capacity  # the file size the map needs
        self._order: deque[Entry] = deque()
        self._index: dict[int, Entry] = {}
        self._lost = SeqRanges()
        # The hint at the last rescan, which the records did not bear out (None: there was no valid hint).
        self._doubted_hint: tuple[int, int, int, int] | bool | None = False
        self._tail = 0
        self._next_seq = 0
        self._used = 0
        self._resident = resident
        # _release_behind has work once this many bytes were written since the last release (never for a small ring).
        self._release_at = resident + RELEASE_CHUNK if resident < capacity else 1 << 62
        self._lap = 0  # laps completed since open: lap * capacity + tail is a position that only grows
        self._released = 0  # pages before this position (same units) have been released
        self._appends = 0
        self._closed = False
        self.recovery = RecoveryReport(0, None, 0, False, 0, (), 0, 0.0)

    # -- public API ------------------------------------------------------------------------------

    def append(self, traj: Trajectory) -> int:
        """Validate, write and publish ``traj``; return its sequence number.

        Raises:
            InvalidTrajectoryError: a non-finite number or an oversize field.
            RecordTooLargeError: the record does not fit in the ring.
            StorageError: the buffer is read-only or closed.
        """
        return self.append_bytes(encode(traj, self._limits))

    def append_bytes(self, payload: bytes) -> int:
        """Write an already-encoded trajectory (from :func:`~agentrl_envs.data.encode`); return its seq."""
        with self._lock:
            if self._closed or self._readonly or self._fork_generation != _fork_generation:
                self._check_writable()
            if os.lseek(self._fd, 0, os.SEEK_END) < self._file_end:
                self._check_size()
            length = len(payload)
            span = ring.span_of(length)
            if span > self._capacity:
                raise RecordTooLargeError(
                    f"a {length:,}-byte record does not fit in this buffer's {self._capacity:,}-byte ring; "
                    "create the buffer with a larger capacity_bytes, or store smaller trajectories"
                )
            self._appends += 1
            seq = self._next_seq
            pos = self._make_room(span)
            mm, start, salt = self._mm, HEADER_PAGE + pos, self._salt
            crc = ring.crc32c(payload, salt)
            if _crash_phase is None:
                mm[start + HEADER_SIZE : start + HEADER_SIZE + length] = payload
            else:
                self._crash_point("evicted")
                half = length // 2
                mm[start + HEADER_SIZE : start + HEADER_SIZE + half] = payload[:half]
                self._crash_point("payload_half")
                mm[start + HEADER_SIZE + half : start + HEADER_SIZE + length] = payload[half:]
                self._crash_point("payload")
            if self._durable:
                self._sync(start + HEADER_SIZE, length)
            header = ring.pack_header(salt, KIND_RECORD, length, seq, crc, 0)
            if _crash_phase is None:
                mm[start : start + HEADER_SIZE] = header
            else:
                mm[start : start + 16] = header[:16]
                self._crash_point("header_half")
                mm[start + 16 : start + HEADER_SIZE] = header[16:]
                self._crash_point("header")
            if self._durable:
                self._sync(start, HEADER_SIZE)
            entry = Entry._make((seq, pos, length, KIND_RECORD, 1, crc))  # _make: half the cost of Entry(...)
            self._order.append(entry)
            self._index[seq] = entry
            if pos < self._tail:
                self._lap += 1
            self._tail = pos + span
            self._next_seq = seq + 1
            self._used += span
            self._write_hint()
            if _crash_phase is not None:
                self._crash_point("hint")
            if self._lap * self._capacity + self._tail - self._released >= self._release_at:
                self._release_behind()
            return seq

    def get(self, seq: int) -> Trajectory:
        """The trajectory with sequence number ``seq``.

        Raises:
            RecordNotFoundError: never written, or evicted by newer records (a ``KeyError``).
            CorruptRecordError: its bytes were damaged on disk.
        """
        return decode(self.get_bytes(seq))

    def get_bytes(self, seq: int) -> bytes:
        """The encoded trajectory with sequence number ``seq``, checksum-verified."""
        with self._lock:
            if self._closed:
                self._check_open()
            if os.lseek(self._fd, 0, os.SEEK_END) < self._file_end:
                self._check_size()
            if not self._readonly:  # the writer: its index is the truth, so one verified copy settles it
                entry = self._index.get(seq)
                if entry is None:
                    self._raise_missing(seq)
                start = HEADER_PAGE + HEADER_SIZE + entry.off
                payload = self._mm[start : start + entry.length]
                if ring.crc32c(payload, self._salt) != entry.crc:
                    self._raise_damaged(seq)
                return payload
            for attempt in range(READ_RETRIES):
                entry = self._index.get(seq)
                if entry is None:
                    self._refresh()
                    entry = self._index.get(seq)
                if entry is None:
                    self._raise_missing(seq)
                found = self._read(entry)
                if found is not None:
                    return found
                self._refresh(rescan=attempt > 0)  # the writer overwrote it while we read: look again
            self._raise_damaged(seq)

    def sample(self, n: int, rng: np.random.Generator | int | None = None) -> list[Trajectory]:
        """``n`` trajectories drawn uniformly with replacement from the live records.

        Args:
            n: how many.
            rng: a numpy Generator, a seed, or None for fresh entropy.
        """
        if not _is_int(n) or n < 0:
            raise ValueError(f"n={n!r}: use a number of trajectories >= 0")
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        out: list[Trajectory] = []
        while len(out) < n:
            for seq in self._draw(n - len(out), gen):
                try:
                    out.append(self.get(seq))
                except RecordNotFoundError:  # a reader raced an eviction: draw again
                    continue
        return out

    def latest(self, n: int) -> list[Trajectory]:
        """The newest ``n`` trajectories (fewer if the buffer holds fewer), oldest first."""
        if not _is_int(n):
            raise ValueError(f"n={n!r}: use a number of trajectories")
        with self._lock:
            self._check_open()
            if self._readonly:
                self._refresh()
            seqs = [e.seq for e in reversed(self._order) if e.kind == KIND_RECORD][: max(0, n)]
        out = []
        for seq in reversed(seqs):
            try:
                out.append(self.get(seq))
            except RecordNotFoundError:  # a reader raced an eviction of the oldest of them
                continue
        return out

    def seqs(self) -> list[int]:
        """The live sequence numbers, oldest first."""
        with self._lock:
            self._check_open()
            if self._readonly:
                self._refresh()
            return [e.seq for e in self._order if e.kind == KIND_RECORD]

    def __len__(self) -> int:
        with self._lock:
            self._check_open()
            if self._readonly:
                self._refresh()
            return len(self._index)

    def __contains__(self, seq: object) -> bool:
        with self._lock:
            self._check_open()
            if self._readonly:
                self._refresh()
            return seq in self._index

    def __iter__(self) -> Iterator[Trajectory]:
        """Trajectories oldest first; records evicted while iterating are skipped."""
        for seq in self.seqs():
            try:
                yield self.get(seq)
            except RecordNotFoundError:
                continue

    @property
    def path(self) -> Path:
        return self._path

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Bytes the live records occupy (headers and padding included)."""
        return self._used

    @property
    def first_seq(self) -> int | None:
        """The oldest live record's seq, or None when the buffer is empty."""
        return next((e.seq for e in self._order if e.kind == KIND_RECORD), None)

    @property
    def next_seq(self) -> int:
        """The seq the next append will return."""
        return self._next_seq

    @property
    def readonly(self) -> bool:
        return self._readonly

    def flush(self) -> None:
        """Force written records to disk (``msync``); appends already survive a killed process."""
        with self._lock:
            self._check_open()
            if not self._readonly:
                self._check_size()
                self._mm.flush()

    def close(self) -> None:
        """Flush, release the writer lock and unmap. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if not self._readonly and os.getpid() == self._pid and self._file_size() >= HEADER_PAGE + self._capacity:
                    self._write_hint()
                    self._mm.flush()
            finally:
                self._mm.close()
                self._file.close()  # closing the descriptor releases the flock

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self._readonly else "writer")
        return f"ReplayBuffer({str(self._path)!r}, capacity_bytes={self._capacity}, records={len(self._index)}, {state})"

    def __reduce__(self) -> Any:
        raise TypeError("a ReplayBuffer does not pickle: pass its path and open it in the other process")

    # -- internals -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"the buffer {self._path} is closed; open it again with ReplayBuffer.open(path)")

    def _check_writable(self) -> None:
        self._check_open()
        if self._readonly:
            raise StorageError(f"{self._path} was opened read-only; open it with readonly=False to append")
        if os.getpid() != self._pid:
            raise BufferLockedError(
                f"this handle on {self._path} belongs to process {self._pid}; after a fork, open the buffer in the child"
            )

    def _file_size(self) -> int:
        # lseek(SEEK_END) answers the size at a third of fstat's cost; nothing reads through the offset.
        return os.lseek(self._fd, 0, os.SEEK_END)

    def _check_size(self) -> None:
        """Refuse to touch the map of a file that shrank under us (the access would SIGBUS)."""
        size = self._file_size()
        expected = HEADER_PAGE + self._capacity
        if size < expected:
            raise FormatError(
                f"{self._path} shrank to {size:,} bytes while open (the ring needs {expected:,}): another process "
                "truncated it. Nothing past the end was read. Close this handle, then reopen it for writing with "
                "repair=True to keep the records that remain, or restore the file"
            )

    def _crash_point(self, phase: str) -> None:
        if phase == _crash_phase and self._appends == _crash_on:
            os.kill(os.getpid(), signal.SIGKILL)

    def _make_room(self, span: int) -> int:
        """Where a record of ``span`` bytes goes; evicts (and invalidates) the records in the way."""
        pos, order = self._tail, self._order
        if pos + span > self._capacity:  # wrap: the end region [pos, cap) holds the oldest records
            while order and order[0].off >= pos:
                self._evict(order.popleft())
            self._release(pos, self._capacity)
            pos = 0
        while order and pos <= order[0].off < pos + span:
            self._evict(order.popleft())
        return pos

    def _evict(self, entry: Entry) -> None:
        start = HEADER_PAGE + entry.off
        self._mm[start : start + HEADER_SIZE] = ring.ZERO_HEADER  # invalid before anything overwrites it
        if _crash_phase is not None:
            self._crash_point("evict_one")
        self._used -= ring.span_of(entry.length)
        if entry.kind == KIND_RECORD:
            del self._index[entry.seq]
        else:
            self._lost.discard(entry.seq, entry.width)

    def _read(self, entry: Entry) -> bytes | None:
        """A reader's verified payload of ``entry``, or None if it is no longer (or not) what the index says.

        A reader's index may lag the writer, so the header is checked before the copy and again after
        it (the writer zeroes a header before it touches the payload behind it).
        """
        mm, salt = self._mm, self._salt
        if ring.parse_header(mm, entry.off, salt, HEADER_PAGE, self._capacity) != entry:
            return None
        start = HEADER_PAGE + entry.off + HEADER_SIZE
        payload = mm[start : start + entry.length]
        if ring.crc32c(payload, salt) != entry.crc:
            return None
        if ring.parse_header(mm, entry.off, salt, HEADER_PAGE, self._capacity) != entry:
            return None  # evicted while we copied
        return payload

    def _raise_damaged(self, seq: int) -> NoReturn:
        raise CorruptRecordError(
            f"record {seq} of {self._path} failed its checksum; the file is damaged there. "
            "Reopen the buffer for writing to quarantine it, and read other records"
        )

    def _raise_missing(self, seq: int) -> NoReturn:
        reason = self._lost.reason(seq)
        live = [e.seq for e in self._order if e.kind == KIND_RECORD]
        overwritten = reason == READER_GAP and live and isinstance(seq, (int, np.integer)) and seq < live[0]
        if reason is not None and not overwritten:  # a reader's gap older than the oldest live record was evicted
            raise CorruptRecordError(f"record {seq} of {self._path} {reason}")
        span = f"seqs {live[0]}..{live[-1]}" if live else "no records"
        if isinstance(seq, (int, np.integer)) and seq < 0:
            raise RecordNotFoundError(f"record {seq} cannot exist: seqs count from 0; the buffer holds {span}")
        if isinstance(seq, (int, np.integer)) and seq >= self._next_seq:
            raise RecordNotFoundError(f"record {seq} has not been written yet; the buffer holds {span}")
        if live and isinstance(seq, (int, np.integer)) and seq < live[0]:
            raise RecordNotFoundError(f"record {seq} was evicted by newer records; the buffer holds {span}")
        raise RecordNotFoundError(f"record {seq!r} is not in the buffer; it holds {span}")

    def _draw(self, n: int, gen: np.random.Generator) -> list[int]:
        with self._lock:
            self._check_open()
            if self._readonly:
                self._refresh()
            if not self._index:
                raise StorageError(f"cannot sample from an empty buffer ({self._path}); append trajectories first")
            lo, hi = self._order[0].seq, self._next_seq
            draws = [int(s) for s in gen.integers(lo, hi, size=n)]
            if all(s in self._index for s in draws):
                return draws
            keys = list(self._index)  # holes (quarantined seqs): draw from the keys instead
            return [keys[int(i)] for i in gen.integers(0, len(keys), size=n)]

    def _write_hint(self) -> None:
        head = self._order[0].seq if self._order else self._next_seq
        data = ring.HINT.pack(self._next_seq, head, self._tail, self._pid)  # only the writer (its own pid) writes it
        data += ring.crc32c(data, self._salt).to_bytes(4, "little")
        if _crash_phase is None:
            self._mm[ring.HINT_OFFSET : ring.HINT_OFFSET + ring.HINT_SIZE] = data
        else:
            self._mm[ring.HINT_OFFSET : ring.HINT_OFFSET + 16] = data[:16]
            self._crash_point("hint_half")
            self._mm[ring.HINT_OFFSET + 16 : ring.HINT_OFFSET + ring.HINT_SIZE] = data[16:]

    def _read_hint(self) -> tuple[int, int, int, int] | None:
        for _ in range(3):  # a writer may be halfway through updating it
            data = self._mm[ring.HINT_OFFSET : ring.HINT_OFFSET + ring.HINT_SIZE]
            if ring.crc32c(data[:-4], self._salt) == int.from_bytes(data[-4:], "little"):
                next_seq, head, tail, pid = ring.HINT.unpack(data[:-4])
                return next_seq, head, tail, pid
        return None

    def _sync(self, start: int, length: int) -> None:
        page = mmap.PAGESIZE
        lo = start - start % page
        self._mm.flush(lo, start + length - lo)

    def _release(self, start: int, end: int) -> None:
        """Hand the pages of data region ``[start, end)`` back to the kernel (data stays in the file)."""
        page = mmap.PAGESIZE
        lo = HEADER_PAGE + -(-start // page) * page
        hi = HEADER_PAGE + (end // page) * page
        if hi > lo and hasattr(self._mm, "madvise"):
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def _release_behind(self) -> None:
        """Release the pages more than ``max_resident_bytes`` behind the write position, a chunk at a time."""
        cap = self._capacity
        written = self._lap * cap + self._tail
        if written - self._released < self._resident + RELEASE_CHUNK or self._resident >= cap:
            return
        start, target = self._released, written - self._resident
        while start < target:
            lap, off = divmod(start, cap)
            end = min(target, (lap + 1) * cap)
            self._release(off, end - lap * cap)
            start = end
        self._released = target

    def _recover(self) -> None:
        """Rebuild the index from the file at open (see ``_open.recover``) and report what it found."""
        started = time.perf_counter()
        found = recover(self._path, self._mm, self._salt, self._capacity, self._readonly, self._read_hint())
        self._install(found.index)
        if not self._readonly:
            self._write_hint()
            self._mm.flush()
        self.recovery = RecoveryReport(
            records=len(self._index),
            first_seq=next((e.seq for e in found.index.kept if e.kind == KIND_RECORD), None),
            next_seq=self._next_seq,
            torn_tail=found.torn_tail,
            quarantined=found.quarantined.total(),
            quarantined_seqs=found.quarantined.first(MAX_REPORTED_SEQS),
            stale=found.stale,
            seconds=time.perf_counter() - started,
        )

    def _install(self, index: Index) -> None:
        self._order = deque(index.kept)
        self._index = {e.seq: e for e in index.kept if e.kind == KIND_RECORD}
        self._lost = index.lost
        self._tail = index.tail
        self._next_seq = index.next_seq
        self._used = sum(ring.span_of(e.length) for e in index.kept)
        self._lap = 0
        self._released = index.tail

    def _refresh(self, rescan: bool = False) -> None:
        """Bring a reader's index up to the writer: follow new records, drop evicted ones, or rescan.

        The hint is advisory and may be forged: a record is dropped only once its header is gone from
        the file, and a hint that the records do not bear out triggers one rescan, not one per call.
        """
        self._check_size()
        mm, salt, cap = self._mm, self._salt, self._capacity
        hint = self._read_hint()
        if not rescan and hint is not None:
            next_seq, head, _tail, _pid = hint
            if next_seq > self._next_seq:
                for entry in follow(mm, salt, cap, self._tail, self._next_seq, next_seq):
                    self._order.append(entry)
                    if entry.kind == KIND_RECORD:
                        self._index[entry.seq] = entry
                    self._tail = entry.end
                    self._next_seq = entry.seq + entry.width
                    self._used += ring.span_of(entry.length)
            if self._next_seq >= next_seq or hint == self._doubted_hint:
                for _ in range(evicted(mm, salt, cap, self._order, head)):
                    entry = self._order.popleft()
                    self._index.pop(entry.seq, None)
                    self._used -= ring.span_of(entry.length)
                return
        elif not rescan and self._doubted_hint is None:
            return  # no valid hint, and we rescanned since: no writer is appending (each append rewrites it)
        self._install(scan_index(mm, salt, cap))
        self._doubted_hint = hint  # the records, not this hint, are the truth until the hint changes
