"""Arrow and Parquet shards from untrusted files: bombs, forged offsets, wrong types, FIFOs.

Issue #33 (finding 10): a zstd bomb, out-of-bounds offsets and wrong column types raised raw pyarrow
errors (or read on); a FIFO in a shard folder hung the reader forever. Each forged file is read in a
child process under a memory rlimit and a bounded wait (as in test_forged.py): an unbounded allocation
fails fast there, a hang shows up as the wait running out, a crash as the exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl_envs.data import FormatError, ShardWriter, read_shards
from agentrl_envs.data.shards import MAX_DECODED_FLOOR, SCHEMA, trajectories_to_table
from tests.data.test_shards import many

ROOT = Path(__file__).resolve().parents[2]
MEMORY_HEADROOM = 512 << 20  # the child may allocate this much beyond what its imports took

READ_AND_REPORT = """
import json, resource, sys
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + HEADROOM, vm + HEADROOM))
from agentrl_envs.data import read_shards, read_table
out = {}
for name, read in (("read_shards", lambda p: list(read_shards(p))), ("read_table", read_table)):
    try:
        read(sys.argv[1])
        out[name] = ["read", ""]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def read_in_child(path: Path) -> dict[str, Any]:
    """{"read_shards" | "read_table": [exception class or "read", message]} from a fresh interpreter."""
    # Imports first: pyarrow and numpy reserve address space the rlimit must leave them.
    script = f"import pyarrow, pyarrow.parquet, numpy, agentrl_envs.data.shards\nHEADROOM = {MEMORY_HEADROOM}\n" + READ_AND_REPORT
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=120,  # the bounded wait: the old reader blocked forever on a FIFO
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, f"child exited with {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_format_error(path: Path, *pieces: str) -> None:
    for name, (kind, message) in read_in_child(path).items():
        assert kind == "FormatError", (name, kind, message[:500])
        assert str(path) in message, (name, message[:500])
        assert all(piece in message for piece in pieces), (name, message[:500])
        assert len(message) < 1000


def write(table: pa.Table, path: Path, **parquet: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(table, path, **parquet)
    else:
        with pa.ipc.new_stream(path, table.schema) as writer:
            writer.write_table(table)
    return path


def with_column(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, array)


# -- compression bombs ------------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["observation", "prompt", "action"])
def test_a_zstd_bomb_is_refused_before_decoding(tmp_path: Path, column: str) -> None:
    table = trajectories_to_table(many(2))
    values = table.column(column).to_pylist()
    values[0] = "a" * (MAX_DECODED_FLOOR + (32 << 20))  # ~96 MiB of one letter: a few KB of zstd
    path = write(
        with_column(table, column, pa.array(values, pa.string())), tmp_path / "s" / "shard-00000.parquet", compression="zstd"
    )
    assert path.stat().st_size < 64 << 10
    assert_format_error(path, "decode to", "compression bomb")


def test_honest_compressible_shards_still_read(tmp_path: Path) -> None:
    trajs = many(6)
    for traj in trajs:
        traj.steps[0].observation = b"0" * 60_000  # the largest text a writer takes, one byte repeated
        traj.steps[0].prompt = "p" * 1_000_000
    with ShardWriter(tmp_path / "s", format="parquet", compression="zstd") as writer:
        writer.extend(trajs)
    assert list(read_shards(tmp_path / "s")) == trajs


# -- forged offsets ---------------------------------------------------------------------------------


def _forged_offsets(tmp_path: Path, column: str, slot: str) -> Path:
    """An Arrow shard whose ``column`` offsets point outside its data: the middle slot or the last one."""
    table = trajectories_to_table(many(3))
    chunk = table.column(column).chunk(0)
    offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[: len(chunk) + 1].copy()
    with ShardWriter(tmp_path / column, format="arrow") as writer:
        writer.extend(many(3))
    raw = bytearray(writer.paths[0].read_bytes())
    at = bytes(raw).find(offsets.tobytes())
    assert at > 0 and bytes(raw).count(offsets.tobytes()) == 1
    k = 1 if slot == "middle" else len(offsets) - 1
    raw[at + 4 * k : at + 4 * k + 4] = np.int32(0x7FFF0000).tobytes()
    writer.paths[0].write_bytes(bytes(raw))
    return writer.paths[0]


@pytest.mark.parametrize("slot", ["middle", "last"])
@pytest.mark.parametrize("column", ["action", "prompt", "observation"])
def test_out_of_bounds_offsets_are_a_format_error(tmp_path: Path, column: str, slot: str) -> None:
    assert_format_error(_forged_offsets(tmp_path, column, slot), "inconsistent Arrow data")


# -- wrong column types -----------------------------------------------------------------------------

WRONG_TYPES = {
    "traj_index": pa.array(["0"] * 6, pa.string()),
    "step_index": pa.array([0.5] * 6, pa.float64()),
    "reward": pa.array(["1.0"] * 6, pa.string()),
    "observation": pa.array([1] * 6, pa.int64()),
    "token_ids": pa.array([[1]] * 6, pa.list_(pa.int64())),
    "metadata": pa.array([[{"key": 1, "value": 2}]] * 6, pa.list_(pa.struct([("key", pa.int64()), ("value", pa.int64())]))),
    "embedding": pa.array([[[1.0]]] * 6, pa.list_(pa.list_(pa.float32()))),
}


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
@pytest.mark.parametrize("column", list(WRONG_TYPES))
def test_a_column_of_the_wrong_type_is_a_format_error_naming_it(tmp_path: Path, fmt: str, column: str) -> None:
    table = trajectories_to_table(many(3))
    assert table.num_rows == len(WRONG_TYPES[column])
    path = write(with_column(table, column, WRONG_TYPES[column]), tmp_path / "s" / f"shard-00000.{fmt}")
    assert_format_error(path, repr(column), "not written by ShardWriter")


def test_the_schema_is_still_the_one_shards_are_written_with(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "s", format="parquet") as writer:
        writer.extend(many(4))
    assert pq.read_schema(writer.paths[0]).remove_metadata().equals(SCHEMA)
    assert list(read_shards(tmp_path / "s")) == many(4)


# -- files that are not regular files ---------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_a_fifo_in_a_shard_folder_is_refused_without_blocking(tmp_path: Path, fmt: str) -> None:
    with ShardWriter(tmp_path / "s", format=fmt) as writer:  # type: ignore[arg-type]
        writer.extend(many(2))
    fifo = tmp_path / "s" / f"shard-99999.{fmt}"
    os.mkfifo(fifo)
    for target in (tmp_path / "s", fifo):
        for name, (kind, message) in read_in_child(target).items():
            assert kind == "FormatError" and str(fifo) in message and "not a regular file" in message, (name, kind, message)


def test_an_empty_shard_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "shard-00000.arrow").write_bytes(b"")
    with pytest.raises(Exception, match=r"shard-00000\.arrow .*empty") as err:
        list(read_shards(tmp_path))
    assert not isinstance(err.value, (OSError, pa.ArrowException))


def test_messages_report_one_line_with_the_file(tmp_path: Path) -> None:
    path = write(with_column(trajectories_to_table(many(3)), "reward", WRONG_TYPES["reward"]), tmp_path / "x.arrow")
    with pytest.raises(FormatError) as err:
        list(read_shards(path))
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert json.dumps(str(err.value))  # plain text
    assert textwrap.shorten(str(err.value), 1000) == str(err.value)
