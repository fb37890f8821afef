"""ReplayBuffer: the API, wrapping, readers, recovery from damage, and hostile files."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from agentrl_envs.data import (
    BufferLockedError,
    CorruptRecordError,
    FormatError,
    RecordNotFoundError,
    RecordTooLargeError,
    ReplayBuffer,
    StorageError,
    Trajectory,
    as_float32,
    make_step,
)
from agentrl_envs.data._ring import FILE_HEADER, HEADER_PAGE, HEADER_SIZE, crc_extend, span_of
from agentrl_envs.data.codec import encode


def traj(i: int, size: int = 200) -> Trajectory:
    step = make_step(f"action {i}", "o" * size, float(i), {"task": float(i)}, log_prob=-0.5, embedding=[i, i + 1])
    return Trajectory(env_id="test", task_id=f"task-{i}", seed=i, steps=[step])


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "buffer.ring"


def test_append_get_sample_latest(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=1 << 20) as buf:
        assert len(buf) == 0 and buf.first_seq is None and buf.recovery.records == 0
        seqs = [buf.append(traj(i)) for i in range(10)]
        assert seqs == list(range(10)) and len(buf) == 10 and buf.next_seq == 10
        assert buf.get(3) == traj(3) and 3 in buf and 42 not in buf
        assert [t.task_id for t in buf.latest(3)] == ["task-7", "task-8", "task-9"]
        assert len(buf.latest(100)) == 10 and buf.latest(0) == []
        assert [t.task_id for t in buf.sample(5, rng=1)] == [t.task_id for t in buf.sample(5, rng=np.random.default_rng(1))]
        assert all(t.env_id == "test" for t in buf.sample(20))
        assert len(buf.sample(np.int64(2), rng=0)) == 2 and len(buf.latest(np.int64(2))) == 2
        for bad in ("2", None, 1.5, -1, True):  # raw TypeErrors from numpy, or an empty list for -1
            with pytest.raises(ValueError, match=re.escape(f"n={bad!r}: use a number of trajectories")):
                buf.sample(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"n=1\.5: use a number of trajectories"):
            buf.latest(1.5)  # type: ignore[arg-type]
        assert [t.seed for t in buf] == list(range(10))
        emb = as_float32(buf.get(4).steps[0].embedding)
        assert emb.tolist() == [4.0, 5.0]
        with pytest.raises(RecordNotFoundError, match="has not been written yet"):
            buf.get(10)
        with pytest.raises(RecordNotFoundError, match="cannot exist: seqs count from 0"):  # not "evicted"
            buf.get(-1)
    with pytest.raises(StorageError, match="closed"):
        buf.get(0)
    buf.close()  # twice is fine


def test_reopen_keeps_records(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=1 << 20) as buf:
        for i in range(5):
            buf.append(traj(i))
    with ReplayBuffer.open(path, capacity_bytes=1 << 20) as buf:
        assert buf.recovery.records == 5 and not buf.recovery.torn_tail and buf.recovery.quarantined == 0
        assert buf.get(4) == traj(4) and buf.append(traj(5)) == 5


def test_wrapping_evicts_oldest(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        rng = np.random.default_rng(0)
        sizes = {i: int(rng.integers(0, 3000)) for i in range(2000)}
        for i in range(2000):
            buf.append(traj(i, sizes[i]))
            assert buf.used_bytes <= buf.capacity_bytes
        live = buf.seqs()
        assert live == list(range(live[0], 2000)) and len(live) > 10
        assert all(buf.get(s) == traj(s, sizes[s]) for s in live)
        with pytest.raises(RecordNotFoundError, match="evicted") as info:
            buf.get(0)
        assert isinstance(info.value, KeyError)
    with ReplayBuffer.open(path) as buf:
        assert buf.seqs() == live


def test_record_larger_than_capacity(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        buf.append(traj(0))
        with pytest.raises(RecordTooLargeError, match="does not fit"):
            buf.append(Trajectory(steps=[make_step("a", "x" * 60_000, 0.0)] * 2))
        assert buf.get(0) == traj(0) and buf.append(traj(1)) == 1  # still usable


def test_one_writer_many_readers(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as writer:
        with pytest.raises(BufferLockedError, match="one writer"):
            ReplayBuffer.open(path)
        with pytest.raises(BufferLockedError):
            ReplayBuffer.create(path, overwrite=True)
        reader = ReplayBuffer.open(path, readonly=True)
        with pytest.raises(StorageError, match="read-only"):
            reader.append(traj(0))
        assert len(reader) == 0
        for i in range(30):
            writer.append(traj(i))
        assert len(reader) == 30 and reader.get(29) == traj(29)
        held = reader.seqs()[0]
        for i in range(30, 600):  # wrap many times past what the reader has indexed
            writer.append(traj(i, 500))
        assert reader.seqs() == writer.seqs()
        with pytest.raises(RecordNotFoundError, match="evicted"):
            reader.get(held)
        assert reader.get(599) == traj(599, 500)
        assert reader.latest(1)[0].task_id == "task-599"
        reader.close()
    with ReplayBuffer.open(path) as again:  # the lock went with the writer
        assert again.next_seq == 600


def test_reader_retries_when_the_writer_overwrites_its_record(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as writer, ReplayBuffer.open(path, readonly=True) as reader:
        writer.append(traj(0, 1000))
        assert reader.seqs() == [0]
        entry = reader._index[0]
        for i in range(1, 200):  # evict 0 and overwrite its bytes while the reader's index still points there
            writer.append(traj(i, 1000))
        assert reader._index[0] == entry
        with pytest.raises(RecordNotFoundError):
            reader.get(0)
        assert reader.get(199) == traj(199, 1000)


def test_create_refuses_existing_and_overwrites(path: Path) -> None:
    ReplayBuffer.create(path, capacity_bytes=64 << 10).close()
    with pytest.raises(FileExistsError, match=r"ReplayBuffer\.open"):
        ReplayBuffer.create(path)
    with ReplayBuffer.create(path, capacity_bytes=128 << 10, overwrite=True) as buf:
        assert buf.capacity_bytes == 128 << 10
    with pytest.raises(ValueError, match="capacity_bytes"):
        ReplayBuffer.create(path.with_name("x"), capacity_bytes=0)
    with pytest.raises(TypeError, match="create"):
        ReplayBuffer()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_mismatches_refuse_to_open(path: Path) -> None:
    ReplayBuffer.create(path, capacity_bytes=64 << 10).close()
    with pytest.raises(FormatError, match="capacity of 65,536 bytes, not 131,072"):
        ReplayBuffer.open(path, capacity_bytes=128 << 10)
    raw = bytearray(path.read_bytes())
    fields = list(FILE_HEADER.unpack_from(raw))
    fields[1] = 2  # format version
    header = FILE_HEADER.pack(*fields)
    raw[: len(header) + 4] = header + crc_extend(0, header).to_bytes(4, "little")
    path.write_bytes(raw)
    with pytest.raises(FormatError, match="format version 2; this agentrl reads version 1"):
        ReplayBuffer.open(path)
    raw[20] ^= 0xFF  # damage the header without fixing its checksum
    path.write_bytes(raw)
    with pytest.raises(FormatError, match=r"header .* is damaged"):
        ReplayBuffer.open(path)


@pytest.mark.parametrize("capacity", [0, 4096, 70_000, (1 << 64) - 1])
def test_forged_capacity_is_refused_and_repair_keeps_the_file(path: Path, capacity: int) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        buf.append(traj(0))
    raw = bytearray(path.read_bytes())
    fields = list(FILE_HEADER.unpack_from(raw))
    fields[4] = capacity  # a header create() never writes, with a valid checksum
    header = FILE_HEADER.pack(*fields)
    raw[: len(header) + 4] = header + crc_extend(0, header).to_bytes(4, "little")
    path.write_bytes(raw)
    for kwargs in ({}, {"readonly": True}, {"repair": True}):  # repair cut the file to 4 KiB, or OverflowError
        with pytest.raises(FormatError, match=f"capacity of {capacity:,} bytes, which create"):
            ReplayBuffer.open(path, **kwargs)  # type: ignore[arg-type]
    assert path.read_bytes() == raw


def test_truncated_file(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        for i in range(40):
            buf.append(traj(i, 1000))
    os.truncate(path, HEADER_PAGE + (32 << 10))
    with pytest.raises(FormatError, match=r"truncated .* repair=True"):
        ReplayBuffer.open(path)
    with pytest.raises(FormatError, match="truncated"):
        ReplayBuffer.open(path, readonly=True, repair=True)
    with ReplayBuffer.open(path, repair=True) as buf:
        kept = buf.seqs()
        assert kept == list(range(len(kept))) and 20 < len(kept) < 40
        assert buf.recovery.quarantined == 40 - len(kept)  # committed, then cut off with the file
        assert all(buf.get(s) == traj(s, 1000) for s in kept)
        assert buf.append(traj(99)) == 40
    assert path.stat().st_size == HEADER_PAGE + (64 << 10)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"AGRL", "not an agentrl replay buffer"),
        (os.urandom(100_000), "not an agentrl replay buffer"),
        (b'{"json": true}\n' * 1000, "not an agentrl replay buffer"),
    ],
)
def test_hostile_files(path: Path, content: bytes, message: str) -> None:
    path.write_bytes(content)
    with pytest.raises(FormatError, match=message):
        ReplayBuffer.open(path)
    with pytest.raises(FormatError, match=message):
        ReplayBuffer.open(path, readonly=True)


def test_directory_and_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="is a directory"):
        ReplayBuffer.open(tmp_path)
    with pytest.raises(FormatError, match="is a directory"):
        ReplayBuffer.create(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"create it with ReplayBuffer\.create"):
        ReplayBuffer.open(tmp_path / "missing.ring")
    with pytest.raises(FileNotFoundError, match=r"the folder .*nodir does not exist; create it first"):
        ReplayBuffer.create(tmp_path / "nodir" / "buffer.ring")  # not a message about a temporary file


def test_capacity_may_be_a_numpy_integer(tmp_path: Path) -> None:
    with ReplayBuffer.create(tmp_path / "buffer.ring", capacity_bytes=np.int64(64 << 10)) as buf:  # type: ignore[arg-type]
        buf.append(traj(0))
    for bad in (0, -5, 1.5, "64", True):
        with pytest.raises(ValueError, match="use a positive number of bytes"):
            ReplayBuffer.create(tmp_path / "other.ring", capacity_bytes=bad)  # type: ignore[arg-type]


def test_refused_create_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability='bogus'"):
        ReplayBuffer.create(tmp_path / "buffer.ring", durability="bogus")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # not a preallocated 256 MiB file


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


@pytest.mark.parametrize("where", ["magic", "length", "seq", "crc", "hcrc", "payload_start", "payload_end"])
def test_bit_flips_are_detected_and_quarantined(path: Path, where: str) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        for i in range(8):
            buf.append(traj(i, 300))
        entry = buf._index[4]
    start = HEADER_PAGE + entry.off
    offset = {
        "magic": 1,
        "length": 8,
        "seq": 12,
        "crc": 20,
        "hcrc": 29,
        "payload_start": HEADER_SIZE,
        "payload_end": HEADER_SIZE + entry.length - 1,
    }[where]
    _flip(path, start + offset)
    with ReplayBuffer.open(path, readonly=True) as reader:  # a reader sees the gap but writes nothing
        assert reader.recovery.quarantined == 1
        with pytest.raises(CorruptRecordError):
            reader.get(4)
    with ReplayBuffer.open(path) as buf:
        assert buf.recovery.quarantined == 1 and buf.recovery.quarantined_seqs == (4,)
        assert buf.seqs() == [0, 1, 2, 3, 5, 6, 7]
        assert all(buf.get(s) == traj(s, 300) for s in buf.seqs())
        with pytest.raises(CorruptRecordError, match="quarantine"):
            buf.get(4)
    sidecar = path.with_name(path.name + ".quarantine")
    assert sidecar.exists() and b'"first_seq": 4' in sidecar.read_bytes()
    with ReplayBuffer.open(path) as buf:  # the tombstone keeps it from being counted twice
        assert buf.recovery.quarantined == 0
        with pytest.raises(CorruptRecordError, match="earlier open"):
            buf.get(4)
        assert len(buf.sample(50, rng=0)) == 50
        for i in range(8, 300):  # the tombstone is evicted like any record
            buf.append(traj(i, 300))
        assert 4 not in buf._lost
    with ReplayBuffer.open(path) as buf:
        assert buf.recovery.quarantined == 0 and buf.recovery.stale == 0


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_damage_under_an_open_writer_and_reader_is_caught(path: Path, where: str) -> None:
    """A byte flipped in a live payload while the buffer is open fails the writer's get and a reader's alike."""
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf, ReplayBuffer.open(path, readonly=True) as reader:
        for i in range(3):
            buf.append(traj(i))
        entry = buf._index[1]
        offset = {"first": 0, "middle": entry.length // 2, "last": entry.length - 1}[where]
        _flip(path, HEADER_PAGE + entry.off + HEADER_SIZE + offset)  # through the file: the shared map sees it
        # The writer's index is the truth, so its payload CRC decides; a reader rescans and finds the record gone.
        for handle, says in ((buf, "record 1 of .* failed its checksum"), (reader, "record 1 of .*damaged")):
            with pytest.raises(CorruptRecordError, match=says):
                handle.get(1)
            with pytest.raises(CorruptRecordError, match=says):
                handle.get_bytes(1)
            assert handle.get(0) == traj(0) and handle.get(2) == traj(2)


def test_damaged_newest_record_is_counted_via_the_hint(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        for i in range(5):
            buf.append(traj(i))
        entry = buf._index[4]
    _flip(path, HEADER_PAGE + entry.off + HEADER_SIZE + 3)
    with ReplayBuffer.open(path) as buf:
        assert buf.recovery.quarantined_seqs == (4,)
        assert buf.seqs() == [0, 1, 2, 3] and buf.append(traj(5)) == 5  # seq 4 is never reused
        with pytest.raises(CorruptRecordError, match="damaged"):
            buf.get(4)


def test_torn_tail_is_discarded(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        for i in range(3):
            buf.append(traj(i))
        tail = buf._tail
    payload = encode(traj(3))
    with open(path, "r+b") as f:  # a record whose header was half written when the writer died
        f.seek(HEADER_PAGE + tail + HEADER_SIZE)
        f.write(payload)
        f.seek(HEADER_PAGE + tail)
        f.write(b"\x9e\xa7RB" + struct.pack("<HH", 1, 1))
    with ReplayBuffer.open(path) as buf:
        assert buf.recovery.torn_tail and buf.recovery.quarantined == 0
        assert buf.seqs() == [0, 1, 2] and buf.append(traj(3)) == 3
    with ReplayBuffer.open(path) as buf:
        assert not buf.recovery.torn_tail and buf.get(3) == traj(3)


def test_non_proto_payload(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        seq = buf.append_bytes(b"\xff\xfenot a protobuf")
        assert buf.get_bytes(seq) == b"\xff\xfenot a protobuf"
        with pytest.raises(CorruptRecordError, match="do not decode"):
            buf.get(seq)


def test_empty_buffer_and_misuse(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        with pytest.raises(StorageError, match="empty"):
            buf.sample(1, rng=0)
        assert buf.latest(5) == [] and list(buf) == []
        with pytest.raises(TypeError, match="does not pickle"):
            import pickle

            pickle.dumps(buf)
        with pytest.raises(TypeError):
            buf.append({"not": "a trajectory"})  # type: ignore[arg-type]


def test_forked_child_cannot_write(path: Path) -> None:
    with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the inherited handle must refuse to write
            code = 1
            try:
                buf.append(traj(0))
            except BufferLockedError:
                code = 0
            finally:
                os._exit(code)
        os.close(read_fd)
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert buf.append(traj(0)) == 0


def test_buffer_opened_in_a_forked_child_writes(path: Path) -> None:
    """The fork check refuses only handles inherited from the parent, not ones the child opens itself."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with ReplayBuffer.create(path, capacity_bytes=64 << 10) as buf:
                code = 0 if buf.append(traj(0)) == 0 and buf.get(0) == traj(0) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    with ReplayBuffer.open(path) as buf:
        assert buf.get(0) == traj(0)


def test_random_sizes_and_reopens_match_a_model(path: Path) -> None:
    rng = np.random.default_rng(3)
    written: dict[int, Trajectory] = {}
    ReplayBuffer.create(path, capacity_bytes=96 << 10).close()
    for _cycle in range(8):
        with ReplayBuffer.open(path) as buf:
            for _ in range(int(rng.integers(1, 200))):
                t = traj(len(written), int(rng.integers(0, 6000)))
                written[buf.append(t)] = t
            live = buf.seqs()
            assert live[-1] == len(written) - 1 and live == list(range(live[0], len(written)))
            assert sum(span_of(len(encode(written[s]))) for s in live) == buf.used_bytes <= buf.capacity_bytes
            # the ring holds as much as fits: the next older record would not have fitted too
            if live[0] > 0:
                assert buf.used_bytes + span_of(len(encode(written[live[0] - 1]))) > buf.capacity_bytes - 6032
            for s in rng.choice(live, size=min(10, len(live)), replace=False):
                assert buf.get(int(s)) == written[int(s)]


def test_the_file_module_never_reaches_into_a_buffer() -> None:
    """One class, one place: ``_open.py`` works on plain values; only ``ReplayBuffer`` reads and sets its fields."""
    import ast

    from agentrl_envs.data import _open

    tree = ast.parse(Path(_open.__file__).read_text())
    private = sorted(
        {
            f"line {node.lineno}: .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
        }
    )
    assert not private, f"agentrl_envs/data/_open.py reaches private attributes (move that code into ReplayBuffer): {private}"
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "ReplayBuffer" not in names
