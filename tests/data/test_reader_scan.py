"""A reader's scan of the ring while its writer appends, made deterministic: the writer runs at a chosen byte.

The reader's map is wrapped so that the writer (in this process) appends just before the scan first
touches a chosen offset; nothing waits on time. Two interleavings used to show a gap the file never
had, reported as damage (``recovery.quarantined``, then ``CorruptRecordError``):

- evicted: the scan read the oldest record, then the writer evicted it and the next one, which the
  scan found zeroed: the next one looked lost between the oldest and the third;
- unwritten: the scan passed the write position while the writer was overwriting the oldest record,
  then the writer published two records and the scan read the second: the first looked lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl_envs.data import CorruptRecordError, RecordNotFoundError, ReplayBuffer, Trajectory, _open, make_step
from agentrl_envs.data import replay as replay_module
from agentrl_envs.data._ring import HEADER_PAGE, HEADER_SIZE, crc_extend

SIZE = 1_000  # the obs bytes of the records that fill the ring (all the same span)


def rec(seq: int, size: int = SIZE) -> Trajectory:
    return Trajectory(env_id="scan", task_id=f"task-{seq}", seed=seq, steps=[make_step(f"a{seq}", "o" * size, float(seq))])


class PausingMap:
    """A map that runs ``action`` once, just before the first ``find`` or slice that starts at byte ``at``."""

    def __init__(self, mm: Any, at: int, action: Callable[[], None]) -> None:
        self.mm, self.at, self.action, self.fired = mm, at, action, False

    def _reached(self, start: int | None) -> None:
        if start == self.at and not self.fired:
            self.fired = True
            self.action()

    def find(self, sub: bytes, start: int, end: int) -> int:
        self._reached(start)
        return int(self.mm.find(sub, start, end))

    def __getitem__(self, key: slice) -> bytes:
        self._reached(key.start)
        return bytes(self.mm[key])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mm, name)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[ReplayBuffer]:
    """A writer that has wrapped: the oldest live record sits right at the write position."""
    with ReplayBuffer.create(tmp_path / "ring", capacity_bytes=64 << 10) as buf:
        for seq in range(200):
            buf.append(rec(seq))
        assert buf._index[buf.seqs()[0]].off == buf._tail
        yield buf


def _pause_the_open_at(monkeypatch: pytest.MonkeyPatch, at: int, action: Callable[[], None]) -> list[PausingMap]:
    """Readers opened from now on scan through a PausingMap; returns the maps made."""
    maps: list[PausingMap] = []

    def open_file(*args: Any) -> tuple[Any, ...]:
        file, mm, capacity, salt = _open.open_file(*args)
        maps.append(PausingMap(mm, at, action))
        return file, maps[-1], capacity, salt

    monkeypatch.setattr(replay_module, "open_file", open_file)
    return maps


def _check_reader(reader: ReplayBuffer, writer: ReplayBuffer, sizes: dict[int, int]) -> None:
    assert reader.seqs() == writer.seqs()
    assert all(reader.get(seq) == rec(seq, sizes.get(seq, SIZE)) for seq in reader.seqs())


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


@pytest.mark.parametrize("damaged", [False, True], ids=["clean", "one-record-damaged"])
def test_a_record_evicted_behind_the_scan_is_not_damage(
    writer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch, damaged: bool
) -> None:
    o1, o2, o3 = writer.seqs()[:3]
    victim = writer.seqs()[6]
    if damaged:  # real damage elsewhere in the ring is still found and reported
        _flip(writer.path, HEADER_PAGE + writer._index[victim].off + HEADER_SIZE + 5)
    big = int(SIZE * 1.5)  # one record that needs the space of o1 and o2

    def append_big() -> None:
        writer.append(rec(writer.next_seq, big))

    maps = _pause_the_open_at(monkeypatch, HEADER_PAGE + writer._index[o1].end, append_big)  # o1 read, o2 next
    with ReplayBuffer.open(writer.path, readonly=True) as reader:
        assert maps[0].fired and writer.seqs()[0] == o3  # the writer evicted exactly o1 and o2 mid-scan
        assert reader.recovery.quarantined == int(damaged), reader.recovery
        with pytest.raises(RecordNotFoundError, match="evicted"):
            reader.get(o2)
        if damaged:
            with pytest.raises(CorruptRecordError):
                reader.get(victim)
        else:
            _check_reader(reader, writer, {writer.next_seq - 1: big})


def test_a_record_published_behind_the_scan_is_found(writer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    o1 = writer.seqs()[0]
    first = writer._index[o1]
    published: list[int] = []

    def append_two() -> None:  # b over o1, whose payload the scan is about to read; c over o2
        published.extend(writer.append(rec(writer.next_seq)) for _ in range(2))

    maps = _pause_the_open_at(monkeypatch, HEADER_PAGE + first.off + HEADER_SIZE, append_two)
    with ReplayBuffer.open(writer.path, readonly=True) as reader:
        assert maps[0].fired and writer._index[published[0]].off == first.off
        assert reader.recovery.quarantined == 0, reader.recovery
        assert reader.recovery.next_seq == published[1] + 1  # the scan found c, and b behind it
        assert reader.get(published[0]) == rec(published[0])
        _check_reader(reader, writer, {})


def test_a_readers_rescan_settles_the_same_race(writer: ReplayBuffer) -> None:
    """``scan_index``, the rescan a reader runs when its index falls behind, on the unwritten interleaving."""
    first = writer._index[writer.seqs()[0]]
    published: list[int] = []

    def append_two() -> None:
        published.extend(writer.append(rec(writer.next_seq)) for _ in range(2))

    file, mm, capacity, salt = _open.open_file(writer.path, True, None, "process", False)
    try:
        pausing = PausingMap(mm, HEADER_PAGE + first.off + HEADER_SIZE, append_two)
        index = _open.scan_index(pausing, crc_extend(0, salt), capacity)  # type: ignore[arg-type]
        assert pausing.fired and len(index.lost) == 0, index.lost.first(10)
        assert [e.seq for e in index.kept][-2:] == published and index.next_seq == writer.next_seq
    finally:
        mm.close()
        file.close()


def test_a_gap_the_rounds_cannot_settle_is_not_reported(writer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no rounds left to re-read it, the evicted interleaving's gap stays unsettled: not reported as damage."""
    o1, o2, o3 = writer.seqs()[:3]

    def append_big() -> None:
        writer.append(rec(writer.next_seq, int(SIZE * 1.5)))

    monkeypatch.setattr(_open, "SETTLE_ROUNDS", 0)
    file, mm, capacity, salt = _open.open_file(writer.path, True, None, "process", False)
    try:
        pausing = PausingMap(mm, HEADER_PAGE + writer._index[o1].end, append_big)
        index = _open.scan_index(pausing, crc_extend(0, salt), capacity)  # type: ignore[arg-type]
        seqs = [e.seq for e in index.kept]
        assert pausing.fired and o1 in seqs and o2 not in seqs and o3 in seqs  # the pass saw the gap...
        assert len(index.lost) == 0  # ...which nothing confirmed
    finally:
        mm.close()
        file.close()


def test_scan_of_a_range_finds_the_entries_inside_it(writer: ReplayBuffer) -> None:
    from agentrl_envs.data import _ring

    file, mm, capacity, salt = _open.open_file(writer.path, True, None, "process", False)
    try:
        seed = crc_extend(0, salt)
        whole = _ring.scan(mm, HEADER_PAGE, capacity, seed)
        assert sorted(e.seq for e in whole) == writer.seqs()
        a, b, c = whole[3], whole[4], whole[5]
        assert _ring.scan(mm, HEADER_PAGE, capacity, seed, start=a.off, stop=c.off) == [a, b]
        assert _ring.scan(mm, HEADER_PAGE, capacity, seed, start=b.off, stop=b.off + HEADER_SIZE) == [b]  # its header is inside
        assert _ring.scan(mm, HEADER_PAGE, capacity, seed, start=b.off, stop=b.off + HEADER_SIZE - 8) == []  # not all of it
        assert _ring.scan(mm, HEADER_PAGE, capacity, seed, start=b.off + 8, stop=c.end) == [c]
        assert _ring.scan(mm, HEADER_PAGE, capacity, seed, start=whole[-1].off, stop=capacity + 4096) == [whole[-1]]
    finally:
        mm.close()
        file.close()
