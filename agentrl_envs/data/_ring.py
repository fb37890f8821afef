"""On-disk format of the replay buffer ring, and the scan that recovers it. Private: see replay.py.

File layout::

    [0, 4096)            file header: magic "AGRLRING", format version, capacity, a random salt, CRC
    [512, 548)           writer hint: next seq, head seq, tail offset, writer pid, CRC (advisory only)
    [4096, 4096 + cap)   data region: records, each 8-byte aligned

Record: a 32-byte header, then ``length`` payload bytes, padded to 8::

    magic(4) | version(2) | kind(2) | length(4) | seq(8) | crc32c(4) | aux(4) | hcrc(4) | payload

``crc32c`` covers the payload and ``hcrc`` the 28 header bytes before it; both are CRC32C seeded
with the file's salt, so a record copied in from another file, or one embedded in a payload, never
validates. ``kind`` is RECORD, or TOMBSTONE for ``aux`` seqs quarantined after corruption.

Invariant kept by the writer: every valid entry in the data region is live. Records about to be
overwritten have their header zeroed first, the payload is written before the header that
publishes it, and a torn write leaves an entry that fails its checksums. Recovery therefore needs
no log of its own: scan for valid entries, order them by seq, drop any out of ring order, and
report the seqs missing between two valid entries as corruption.

The salt is in the file header, so anyone who can write the file can forge a valid entry or hint.
Nothing read from the file sizes an allocation: seqs are below ``MAX_SEQ``, a seq gap, a tombstone
width or a hint's count of lost records above :func:`max_gap` (a bound from the capacity) is not
believed, and lost seqs are kept as ranges (:class:`SeqRanges`), never one by one.
"""

from __future__ import annotations

import bisect
import importlib
import operator
import struct
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NamedTuple

import google_crc32c

_crc32c_package: Any = None
try:  # the crc32c package's hardware CRC32C runs ~3x faster than google-crc32c's on 16 KiB payloads
    with warnings.catch_warnings():  # it warns when it falls back to software; we fall back ourselves
        warnings.simplefilter("ignore")
        _crc32c_package = importlib.import_module("crc32c")
except ImportError:  # optional (not a dependency: LGPL, and no measurable gain per get or append)
    pass

__all__: list[str] = []  # private module

FILE_MAGIC = b"AGRLRING"
FORMAT_VERSION = 1
HEADER_PAGE = 4096
FILE_HEADER = struct.Struct("<8sHHIQ16sQ")  # magic, version, flags, header size, capacity, salt, created ns
FILE_CRC_OFFSET = FILE_HEADER.size
HINT_OFFSET = 512
HINT = struct.Struct("<QQQQ")  # next_seq, head_seq, tail, writer pid; a u32 CRC follows
HINT_SIZE = HINT.size + 4

RECORD_MAGIC = b"\x9e\xa7RB"
RECORD_HEADER = struct.Struct("<4sHHIQII")  # magic, version, kind, length, seq, crc32c, aux; u32 hcrc follows
HEADER_SIZE = 32
KIND_RECORD = 1
KIND_TOMBSTONE = 2
ZERO_HEADER = bytes(HEADER_SIZE)
MAX_SEQ = 1 << 62  # seqs at or past this are forged (at a billion appends a second: 146 years)
MAX_WIDTH = 0xFFFF_FFFF  # the most seqs one range stands for (a tombstone's 32-bit width)


def _google_crc32c(data: bytes | memoryview, seed: int = 0) -> int:
    return google_crc32c.extend(seed, bytes(data) if isinstance(data, memoryview) else data)


# ``crc32c(data, seed)``: the CRC32C of ``data`` (bytes or a buffer) continued from ``seed``: the hot path's call.
# Both implementations compute the same CRC32C, so the choice never changes the file format.
crc32c: Callable[[bytes | memoryview, int], int]
if _crc32c_package is not None and _crc32c_package.hardware_based:
    crc32c = _crc32c_package.crc32c
    CRC_IMPLEMENTATION = f"crc32c {_crc32c_package.__version__} (hardware)"
else:  # pragma: no cover - machines without SSE4.2/ARMv8 CRC instructions, or without the package
    crc32c = _google_crc32c
    CRC_IMPLEMENTATION = f"google-crc32c ({google_crc32c.implementation})"


def crc_extend(seed: int, data: bytes) -> int:
    """The CRC32C of ``data`` continued from ``seed`` (google-crc32c's ``extend`` order; both implementations agree)."""
    return crc32c(data, seed)


def span_of(length: int) -> int:
    """Bytes a record with a ``length``-byte payload occupies: header plus payload padded to 8."""
    return HEADER_SIZE + ((length + 7) & ~7)


def max_gap(capacity: int) -> int:
    """The most seqs one gap, one tombstone or a hint's lost tail can stand for in a ring of ``capacity``.

    The seqs of a gap lay between two live entries, at most one per header's worth of bytes, and each
    could itself have been a tombstone of at most that many: a bound that only the file's size sets
    (capped to fit a tombstone's 32-bit width).
    """
    return min(MAX_WIDTH, max(1, capacity // HEADER_SIZE) ** 2)


class Entry(NamedTuple):
    """A valid entry of the ring (a record or a tombstone); offsets are relative to the data region."""

    seq: int
    off: int
    length: int
    kind: int
    width: int  # seqs it stands for: 1 for a record, aux for a tombstone
    crc: int

    @property
    def end(self) -> int:
        return self.off + span_of(self.length)


def pack_header(salt: int, kind: int, length: int, seq: int, crc: int, aux: int) -> bytes:
    head = RECORD_HEADER.pack(RECORD_MAGIC, FORMAT_VERSION, kind, length, seq, crc, aux)
    return head + crc32c(head, salt).to_bytes(4, "little")


def parse_header(buf: bytes | memoryview | object, pos: int, salt: int, base: int, capacity: int) -> Entry | None:
    """The entry whose header starts at data offset ``pos``, or None if there is no valid one."""
    raw = buf[base + pos : base + pos + HEADER_SIZE]  # type: ignore[index]
    if len(raw) < HEADER_SIZE or raw[:4] != RECORD_MAGIC:
        return None
    _magic, version, kind, length, seq, crc, aux = RECORD_HEADER.unpack_from(raw)
    if crc32c(raw[:28], salt) != int.from_bytes(raw[28:32], "little"):
        return None
    if version != FORMAT_VERSION or kind not in (KIND_RECORD, KIND_TOMBSTONE) or pos + span_of(length) > capacity:
        return None
    if kind == KIND_TOMBSTONE and (length or not aux or aux > max_gap(capacity)):
        return None
    width = 1 if kind == KIND_RECORD else aux
    if seq + width > MAX_SEQ:
        return None
    return Entry(seq, pos, length, kind, width, crc)


def payload_ok(buf: object, base: int, entry: Entry, salt: int) -> bool:
    start = base + entry.off + HEADER_SIZE
    return crc32c(buf[start : start + entry.length], salt) == entry.crc  # type: ignore[index]


def scan(
    buf: object, base: int, capacity: int, salt: int, verify: bool = True, start: int = 0, stop: int | None = None
) -> list[Entry]:
    """Every valid entry of the data region ``buf[base : base + capacity]``, in offset order.

    Jumps from magic to magic with ``find`` (C speed), so garbage costs one pass; a valid entry's
    payload is skipped. With ``verify`` a record whose payload fails its CRC is left out. ``start``
    and ``stop`` (data-region offsets) limit the scan to the entries whose header lies inside ``[start, stop)``.
    """
    find = buf.find  # type: ignore[attr-defined]
    entries: list[Entry] = []
    stop = capacity if stop is None else min(stop, capacity)
    last = base + stop - HEADER_SIZE  # the last position a header can start
    pos = base + max(0, start)
    while pos <= last:
        hit = find(RECORD_MAGIC, pos, last + len(RECORD_MAGIC))
        if hit < 0:
            break
        rel = hit - base
        if rel & 7:  # records are 8-aligned: this is payload bytes
            pos = base + ((rel + 7) & ~7)
            continue
        entry = parse_header(buf, rel, salt, base, capacity)
        if entry is not None and (not verify or entry.kind != KIND_RECORD or payload_ok(buf, base, entry, salt)):
            entries.append(entry)
            pos = base + entry.end
        else:
            pos = hit + 8
    return entries


@dataclass
class Gap:
    """Seqs missing between two valid entries (mid-log corruption), and where their bytes lie."""

    first_seq: int
    count: int
    regions: list[tuple[int, int]]  # (offset, length) in the data region
    tombstone_at: int | None  # where a tombstone header fits, if anywhere


@dataclass
class Plan:
    """What a scan says the ring holds."""

    kept: list[Entry]
    gaps: list[Gap] = field(default_factory=list)
    stale: list[Entry] = field(default_factory=list)
    lost_tail: int = 0  # committed seqs past the newest valid entry (the hint says they existed)
    next_seq: int = 0
    tail: int = 0


def plan(entries: Sequence[Entry], capacity: int, hint_next_seq: int | None) -> Plan:
    """Order scanned entries into the live ring (see the module docstring).

    Entries split into runs wherever two seqs lie further apart than :func:`max_gap` allows; only
    the run with the most entries (the newest on a tie) is the ring, so one forged entry with a far
    seq cannot push the genuine ones out. A hint claiming more lost records than fit is ignored.
    """
    if hint_next_seq is not None and not 0 <= hint_next_seq < MAX_SEQ:
        hint_next_seq = None
    by_seq: dict[int, Entry] = {}
    dupes: list[Entry] = []
    for entry in entries:
        if entry.seq in by_seq:
            dupes.append(entry)
        else:
            by_seq[entry.seq] = entry
    ordered = sorted(by_seq.values())
    if not ordered:
        return Plan(kept=[], stale=dupes, next_seq=hint_next_seq or 0, tail=0)
    bound = max_gap(capacity)
    runs: list[list[Entry]] = [[ordered[0]]]
    for older, newer in pairwise(ordered):
        if newer.seq - (older.seq + older.width) > bound:
            runs.append([])
        runs[-1].append(newer)
    chosen = max(range(len(runs)), key=lambda i: (len(runs[i]), i))
    dupes += [e for i, run in enumerate(runs) if i != chosen for e in run]
    ordered = runs[chosen]
    newest = ordered[-1]
    kept = [newest]
    wrapped = False
    for entry in reversed(ordered[:-1]):
        newer = kept[-1]
        if entry.seq + entry.width > newer.seq:
            break
        if entry.end <= newer.off and (not wrapped or entry.off >= newest.end):
            pass
        elif not wrapped and entry.off >= newest.end:
            wrapped = True
        else:
            break
        kept.append(entry)
    kept.reverse()
    result = Plan(kept=kept, stale=sorted(dupes + ordered[: len(ordered) - len(kept)]))
    for older, newer in pairwise(kept):
        expected = older.seq + older.width
        if newer.seq > expected:
            result.gaps.append(_gap(older, newer, expected, capacity))
    top = newest.seq + newest.width
    if hint_next_seq is not None and top < hint_next_seq <= top + bound:
        result.lost_tail = hint_next_seq - top
    result.next_seq = top + result.lost_tail
    result.tail = newest.end
    return result


def _gap(older: Entry, newer: Entry, first_seq: int, capacity: int) -> Gap:
    count = newer.seq - first_seq
    if newer.off >= older.end:
        regions = [(older.end, newer.off - older.end)]
        place = older.end if newer.off - older.end >= HEADER_SIZE else None
    else:  # the gap wraps past the end of the region
        regions = [(older.end, capacity - older.end), (0, newer.off)]
        place = older.end if capacity - older.end >= HEADER_SIZE else (0 if newer.off >= HEADER_SIZE else None)
    return Gap(first_seq, count, [r for r in regions if r[1] > 0], place)


class SeqRanges:
    """Seqs that were lost, with the reason for each, stored as ranges.

    Memory grows with the number of ranges (at most one per gap, tombstone or lost tail, so bounded
    by the ring's size), never with how many seqs a range covers: a forged count cannot exhaust it.
    """

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, str]] = []  # (first, end, reason), sorted by first

    def add(self, first: int, count: int, reason: str) -> None:
        """Mark seqs ``[first, first + count)`` lost for ``reason``."""
        if count <= 0:
            return
        i = bisect.bisect_right(self._starts, first)
        self._starts.insert(i, first)
        self._ranges.insert(i, (first, first + count, reason))

    def reason(self, seq: object) -> str | None:
        """Why ``seq`` was lost, or None if it was not."""
        try:
            key = operator.index(seq)  # type: ignore[arg-type]
        except TypeError:
            return None
        i = bisect.bisect_right(self._starts, key) - 1
        while i >= 0:  # ranges may overlap after repeated damage: look back while one could cover seq
            first, end, why = self._ranges[i]
            if key < end:
                return why
            if first + MAX_WIDTH < key:
                break
            i -= 1
        return None

    def discard(self, first: int, count: int) -> None:
        """Forget the ranges inside ``[first, first + count)`` (their tombstone was evicted)."""
        lo = bisect.bisect_left(self._starts, first)
        hi = lo
        while hi < len(self._ranges) and self._ranges[hi][1] <= first + count:
            hi += 1
        del self._starts[lo:hi]
        del self._ranges[lo:hi]

    def total(self) -> int:
        """How many seqs the ranges cover (overlaps counted twice)."""
        return sum(end - first for first, end, _ in self._ranges)

    def first(self, n: int) -> tuple[int, ...]:
        """The lowest ``n`` lost seqs, ascending."""
        out: list[int] = []
        for first, end, _ in self._ranges:
            out.extend(range(first, min(end, first + n - len(out))))
            if len(out) >= n:
                break
        return tuple(sorted(set(out)))[:n]

    def __contains__(self, seq: object) -> bool:
        return self.reason(seq) is not None

    def __len__(self) -> int:
        return len(self._ranges)
