"""ReplayBuffer against forged metadata, truncation under open handles, and planted sidecar paths.

The CRC salt sits in the file header, so anyone who can write the file can forge entries and hints
that pass every checksum. These tests do exactly that. Opens of forged files run in a child process
under a memory rlimit (an unbounded allocation fails fast there, instead of swapping the machine);
truncation runs in a child too, so a SIGBUS shows up as its exit status instead of killing pytest.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentrl_envs.data import CorruptRecordError, FormatError, ReplayBuffer, StorageError, Trajectory, make_step
from agentrl_envs.data._ring import (
    FILE_HEADER,
    HEADER_PAGE,
    HEADER_SIZE,
    HINT,
    HINT_OFFSET,
    KIND_RECORD,
    KIND_TOMBSTONE,
    MAX_SEQ,
    crc_extend,
    max_gap,
    pack_header,
)
from agentrl_envs.data.codec import encode

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 64 << 10
MEMORY_HEADROOM = 256 << 20  # the child may allocate this much beyond what its imports took


def traj(i: int, size: int = 200) -> Trajectory:
    step = make_step(f"action {i}", "o" * size, float(i), {"task": float(i)})
    return Trajectory(env_id="test", task_id=f"task-{i}", seed=i, steps=[step])


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "buffer.ring"


def make_buffer(path: Path, n: int = 10) -> tuple[int, int]:
    """A buffer holding records 0..n-1; answers (the offset after the last record, next seq)."""
    with ReplayBuffer.create(path, capacity_bytes=CAPACITY) as buf:
        for i in range(n):
            buf.append(traj(i))
        return buf._tail, buf.next_seq


def salt_of(path: Path) -> int:
    head = path.read_bytes()[: FILE_HEADER.size]
    return crc_extend(0, FILE_HEADER.unpack(head)[5])


def forge_entry(path: Path, off: int, kind: int, seq: int, aux: int = 0, payload: bytes = b"") -> None:
    """Write an entry that passes every checksum at data offset ``off``."""
    salt = salt_of(path)
    crc = crc_extend(salt, payload) if kind == KIND_RECORD else 0
    header = pack_header(salt, kind, len(payload), seq, crc, aux)
    with open(path, "r+b") as f:
        f.seek(HEADER_PAGE + off)
        f.write(header + payload)


def forge_hint(path: Path, next_seq: int, head: int, tail: int = 0, pid: int = 1) -> None:
    salt = salt_of(path)
    data = HINT.pack(next_seq, head, tail, pid)
    with open(path, "r+b") as f:
        f.seek(HINT_OFFSET)
        f.write(data + crc_extend(salt, data).to_bytes(4, "little"))


def run_child(code: str, *args: str, limit_memory: bool = True) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (under a memory rlimit); answer the JSON it prints last."""
    prelude = textwrap.dedent(
        f"""
        import json, resource, sys
        sys.path.insert(0, {str(ROOT)!r})
        from agentrl_envs.data import ReplayBuffer, StorageError, FormatError, CorruptRecordError
        from agentrl_envs.data.codec import encode
        if {limit_memory!r}:
            vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
            resource.setrlimit(resource.RLIMIT_AS, (vm + {MEMORY_HEADROOM}, vm + {MEMORY_HEADROOM}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"child exited with {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


OPEN_AND_REPORT = """
path = sys.argv[1]
out = {}
for mode in ("reader", "writer"):
    with ReplayBuffer.open(path, readonly=(mode == "reader")) as buf:
        r = buf.recovery
        out[mode] = {
            "seqs": buf.seqs(), "quarantined": r.quarantined, "reported": len(r.quarantined_seqs),
            "next_seq": buf.next_seq, "ok": all(buf.get(s).task_id == f"task-{s}" for s in buf.seqs()),
        }
        if mode == "writer":
            out["appended"] = buf.append_bytes(buf.get_bytes(buf.seqs()[0]))
with ReplayBuffer.open(path) as buf:
    out["reopened"] = buf.seqs()
print(json.dumps(out))
"""


# -- forged entries and hints: bounded memory, no records hidden ----------------------------------


@pytest.mark.parametrize(
    "forgery",
    ["tombstone-u32", "tombstone-max-gap", "seq-u64", "seq-max", "seq-far", "hint-u64", "hint-far", "hint-tail", "gap-far"],
)
def test_forged_counts_do_not_size_allocations(path: Path, forgery: str) -> None:
    tail, next_seq = make_buffer(path)
    if forgery == "tombstone-u32":  # an old open's tombstone standing for 4 billion seqs
        forge_entry(path, tail, KIND_TOMBSTONE, next_seq, aux=0xFFFF_FFFF)
    elif forgery == "tombstone-max-gap":  # the widest tombstone still believed
        forge_entry(path, tail, KIND_TOMBSTONE, next_seq, aux=max_gap(CAPACITY))
    elif forgery == "seq-u64":
        forge_entry(path, tail, KIND_RECORD, (1 << 64) - 1, payload=encode(traj(99)))
    elif forgery == "seq-max":
        forge_entry(path, tail, KIND_RECORD, MAX_SEQ - 1, payload=encode(traj(99)))
    elif forgery == "seq-far":
        forge_entry(path, tail, KIND_RECORD, next_seq + 10**15, payload=encode(traj(99)))
    elif forgery == "hint-u64":
        forge_hint(path, (1 << 64) - 1, 0)
    elif forgery == "hint-far":
        forge_hint(path, next_seq + 10**15, 0)
    elif forgery == "hint-tail":  # the most lost records a hint may still claim
        forge_hint(path, next_seq + max_gap(CAPACITY), 0)
    elif forgery == "gap-far":  # a far-future record followed by one more: a run of two
        forge_entry(path, tail, KIND_RECORD, 10**12, payload=encode(traj(98)))
        forge_entry(path, tail + 1024, KIND_RECORD, 10**12 + 1, payload=encode(traj(99)))
    out = run_child(OPEN_AND_REPORT, str(path))
    width = max_gap(CAPACITY)
    expected_next = next_seq + width if forgery in ("tombstone-max-gap", "hint-tail") else next_seq
    for mode in ("reader", "writer"):
        report = out[mode]
        assert report["seqs"] == list(range(next_seq)), (mode, report)  # every genuine record, nothing hidden
        assert report["ok"] and report["next_seq"] == expected_next, (mode, report)
        assert report["quarantined"] == (width if forgery == "hint-tail" else 0), (mode, report)
        assert report["reported"] == (1000 if forgery == "hint-tail" else 0)
    assert out["appended"] == expected_next < MAX_SEQ
    assert out["reopened"] == [*range(next_seq), expected_next]


def test_the_widest_believed_tombstone_is_kept_as_one_range(path: Path) -> None:
    tail, next_seq = make_buffer(path)
    width = max_gap(CAPACITY)
    forge_entry(path, tail, KIND_TOMBSTONE, next_seq, aux=width)
    with ReplayBuffer.open(path) as buf:
        assert buf.seqs() == list(range(next_seq)) and buf.next_seq == next_seq + width
        assert len(buf._lost) == 1  # one range, whatever its width
        with pytest.raises(CorruptRecordError, match="earlier open"):
            buf.get(next_seq + width - 1)
        assert buf.append(traj(7)) == next_seq + width


def test_a_forged_hint_does_not_hide_records_from_a_live_reader(path: Path) -> None:
    tail, next_seq = make_buffer(path)
    with ReplayBuffer.open(path) as writer, ReplayBuffer.open(path, readonly=True) as reader:
        assert len(reader) == next_seq
        for head, ahead in ((MAX_SEQ, 0), ((1 << 64) - 1, 0), (next_seq, 0), (next_seq, 5), (10**9, 10**9)):
            forge_hint(path, next_seq + ahead, head, tail)
            assert len(reader) == next_seq, (head, ahead)
            assert reader.seqs() == list(range(next_seq))
            assert reader.get(0).task_id == "task-0" and [t.seed for t in reader.latest(2)] == [8, 9]
        # A forged hint that the records do not bear out costs one rescan, not one per call.
        assert reader._doubted_hint is not False
        # The writer's next append rewrites the hint, and the reader follows it again.
        seq = writer.append(traj(next_seq))
        assert reader.seqs() == list(range(seq + 1)) and reader.get(seq).seed == next_seq


def test_a_real_eviction_is_still_followed_by_a_reader(path: Path) -> None:
    make_buffer(path, n=5)
    with ReplayBuffer.open(path) as writer, ReplayBuffer.open(path, readonly=True) as reader:
        assert reader.seqs() == [0, 1, 2, 3, 4]
        for stop in (230, 600):  # evictions the reader follows by walking, then by rescanning after a lap
            for i in range(writer.next_seq, stop):
                writer.append(traj(i))
            live = writer.seqs()
            assert live[0] > 4 and reader.seqs() == live and len(reader) == len(live)


# -- truncation under open handles: an error, never SIGBUS -----------------------------------------

TRUNCATE = """
import os
path, size, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
buf = ReplayBuffer.open(path, readonly=(mode == "reader"))
os.truncate(path, size)
calls = {
    "get": lambda: buf.get(3),
    "get_bytes": lambda: buf.get_bytes(0),
    "len": lambda: len(buf),
    "seqs": lambda: buf.seqs(),
    "latest": lambda: buf.latest(2),
    "sample": lambda: buf.sample(3, rng=0),
    "iter": lambda: list(buf),
    "contains": lambda: 5 in buf,
    "append": lambda: buf.append_bytes(buf_bytes),
    "flush": lambda: buf.flush(),
}
buf_bytes = encode(__import__("agentrl_envs.data", fromlist=["Trajectory"]).Trajectory(env_id="x", task_id="y", seed=0, steps=[]))
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = "ok"
    except FormatError as exc:
        out[name] = "FormatError: " + str(exc)
    except StorageError as exc:
        out[name] = type(exc).__name__
buf.close()
out["closed"] = True
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["reader", "writer"])
@pytest.mark.parametrize("size", [0, 100, HEADER_PAGE, HEADER_PAGE + 4096, HEADER_PAGE + CAPACITY - 1])
def test_truncating_the_file_under_an_open_handle_is_an_error_not_sigbus(path: Path, mode: str, size: int) -> None:
    make_buffer(path)
    out = run_child(TRUNCATE, str(path), str(size), mode, limit_memory=False)
    assert out.pop("closed") is True
    for name, result in out.items():
        if mode == "writer" and name in ("len", "seqs", "contains"):
            assert result == "ok", name  # answered from the writer's index: the map is not touched
        elif mode == "reader" and name == "append":
            assert result == "StorageError"  # read-only, said before anything else
        elif mode == "reader" and name == "flush":
            assert result == "ok"  # a reader has nothing to flush and does not touch the map
        else:
            assert result.startswith("FormatError: ") and "shrank" in result and "repair=True" in result, (name, result)
    with pytest.raises(FormatError, match=r"truncated|empty|not an agentrl"):
        ReplayBuffer.open(path)
    if size >= HEADER_PAGE:  # the header survived: repair keeps what remains
        with ReplayBuffer.open(path, repair=True) as buf:
            assert all(buf.get(s).seed == s for s in buf.seqs())


def test_a_writer_and_reader_survive_truncation_in_process(path: Path) -> None:
    """The same in this process: the check comes before the map is touched, so pytest itself survives."""
    make_buffer(path)
    with ReplayBuffer.open(path) as writer, ReplayBuffer.open(path, readonly=True) as reader:
        os.truncate(path, HEADER_PAGE + 4096)
        with pytest.raises(FormatError, match="shrank"):
            writer.append(traj(1))
        with pytest.raises(FormatError, match="shrank"):
            reader.get(9)
        with pytest.raises(FormatError, match="shrank"):
            len(reader)


# -- the quarantine sidecar is never opened through a planted link ---------------------------------


def _damage_record(path: Path, seq: int) -> None:
    with ReplayBuffer.open(path, readonly=True) as buf:
        off = buf._index[seq].off
    with open(path, "r+b") as f:
        f.seek(HEADER_PAGE + off + HEADER_SIZE + 5)
        byte = f.read(1)[0]
        f.seek(HEADER_PAGE + off + HEADER_SIZE + 5)
        f.write(bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("plant", ["symlink-to-file", "dangling-symlink", "symlink-to-dir", "fifo", "directory"])
def test_a_planted_sidecar_is_refused_and_nothing_changes(path: Path, tmp_path: Path, plant: str) -> None:
    make_buffer(path)
    _damage_record(path, 4)
    sidecar = path.with_name(path.name + ".quarantine")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    if plant == "symlink-to-file":
        sidecar.symlink_to(victim)
    elif plant == "dangling-symlink":
        sidecar.symlink_to(tmp_path / "created-through-the-link")
    elif plant == "symlink-to-dir":
        sidecar.symlink_to(tmp_path)
    elif plant == "fifo":
        os.mkfifo(sidecar)
    else:
        sidecar.mkdir()
    before = path.read_bytes()
    with pytest.raises(StorageError, match="quarantine"):
        ReplayBuffer.open(path)
    assert path.read_bytes() == before  # no tombstone, no zeroed header
    assert victim.read_text() == "precious" and not (tmp_path / "created-through-the-link").exists()
    with open(path, "rb") as f:  # the refused open released the writer lock
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    with ReplayBuffer.open(path, readonly=True) as reader:  # readers write nothing and are unaffected
        assert reader.seqs() == [0, 1, 2, 3, 5, 6, 7, 8, 9]


def test_with_the_planted_path_removed_the_open_quarantines(path: Path) -> None:
    make_buffer(path)
    _damage_record(path, 4)
    sidecar = path.with_name(path.name + ".quarantine")
    sidecar.symlink_to(path.parent / "elsewhere")
    with pytest.raises(StorageError):
        ReplayBuffer.open(path)
    sidecar.unlink()
    with ReplayBuffer.open(path) as buf:
        assert buf.recovery.quarantined_seqs == (4,)
    assert sidecar.is_file() and not sidecar.is_symlink() and b'"first_seq": 4' in sidecar.read_bytes()
