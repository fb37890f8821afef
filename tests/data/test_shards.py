"""Arrow and Parquet shards: round trips, rolling files, plain-pyarrow and Hugging Face reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.data import (
    CorruptRecordError,
    FormatError,
    InvalidTrajectoryError,
    ShardWriter,
    StorageError,
    Trajectory,
    make_step,
    read_columns,
    read_shards,
    read_table,
)
from agentrl_envs.data.shards import SCHEMA, shard_paths, table_to_trajectories, trajectories_to_table
from tests.conftest import require_integration
from tests.data.test_codec import MAP_NAMES, sample_traj, traj_with_maps


def many(n: int) -> list[Trajectory]:
    out = []
    for i in range(n):
        traj = sample_traj(1 + i % 4)
        traj.task_id = f"task-{i}"
        if i % 3 == 0:
            traj.ClearField("seed")
        traj.steps[0].observation = bytes([i % 256]) * (i * 10)
        out.append(traj)
    return out


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_round_trip_and_rolling(tmp_path: Path, fmt: str) -> None:
    trajs = many(60)
    with ShardWriter(tmp_path / "shards", format=fmt, max_shard_bytes=8_000, batch_size=7) as writer:  # type: ignore[arg-type]
        indices = [writer.append(t) for t in trajs]
    assert indices == list(range(60))
    paths = writer.paths
    assert len(paths) > 2 and all(p.suffix == f".{fmt}" for p in paths)
    assert list(read_shards(tmp_path / "shards")) == trajs
    assert not list((tmp_path / "shards").glob(".*.tmp"))
    table = read_table(tmp_path / "shards")
    assert table.num_rows == sum(len(t.steps) for t in trajs) and table.schema.equals(SCHEMA)
    cols = read_columns(tmp_path / "shards")
    expected = np.concatenate([[s.reward for s in t.steps] for t in trajs])
    assert np.array_equal(cols["reward"], expected) and cols["advantage"].dtype == np.float64
    # A new writer on the same folder continues the numbering instead of overwriting.
    with ShardWriter(tmp_path / "shards", format=fmt) as more:  # type: ignore[arg-type]
        more.append(trajs[0])
    assert len(shard_paths(tmp_path / "shards")) == len(paths) + 1


def test_writers_sharing_a_folder_take_distinct_files(tmp_path: Path) -> None:
    """Two writers opened on one folder (two processes, two ranks) both number from the same point: neither
    may write over the other's file, in progress or finished; a crashed writer's leftover is skipped."""
    trajs = many(12)
    (tmp_path / ".shard-00000.arrow.tmp").write_bytes(b"a crashed writer's file")
    a, b = ShardWriter(tmp_path, max_shard_bytes=1, batch_size=1), ShardWriter(tmp_path, max_shard_bytes=1, batch_size=1)
    for i, traj in enumerate(trajs):  # interleaved: each append finishes a file
        (a if i % 2 else b).append(traj)
    a.close()
    b.close()
    names = sorted(p.name for p in a.paths + b.paths)
    assert len(names) == len(set(names)) == 12 and "shard-00000.arrow" not in names
    assert sorted(t.task_id for t in read_shards(tmp_path)) == sorted(t.task_id for t in trajs)
    assert (tmp_path / ".shard-00000.arrow.tmp").read_bytes() == b"a crashed writer's file"


def test_plain_pyarrow_reads_flat_columns(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, format="arrow") as writer:
        writer.extend(many(10))
    with pa.memory_map(str(writer.paths[0])) as source:
        table = pa.ipc.open_stream(source).read_all()
    rewards = table.column("reward").to_numpy()
    assert rewards.dtype == np.float64 and len(rewards) == table.num_rows
    single = table.column("log_prob").chunk(0).to_numpy(zero_copy_only=True)  # no copy out of the map
    assert single.dtype == np.float64
    emb = table.column("embedding").chunk(0).flatten().to_numpy(zero_copy_only=True)
    assert emb.dtype == np.float32
    with ShardWriter(tmp_path / "pq", format="parquet") as writer:
        writer.extend(many(10))
    assert pq.read_table(writer.paths[0], columns=["reward", "advantage"]).num_rows == table.num_rows


def test_hugging_face_datasets_reads_shards(tmp_path: Path) -> None:
    try:
        import datasets
    except ImportError:
        if require_integration():
            pytest.fail("Hugging Face datasets is required under AGENTRL_REQUIRE_INTEGRATION=1: pip install -e '.[dev]'")
        pytest.skip("Hugging Face datasets is not installed (pip install -e '.[dev]')")
    trajs = many(12)
    with ShardWriter(tmp_path / "arrow", format="arrow", max_shard_bytes=4_000) as writer:
        writer.extend(trajs)
    with ShardWriter(tmp_path / "parquet", format="parquet") as pwriter:
        pwriter.extend(trajs)
    rows = sum(len(t.steps) for t in trajs)
    one = datasets.Dataset.from_file(str(writer.paths[0]))
    assert one.num_rows > 0 and isinstance(one[0]["reward"], float)
    cache = str(tmp_path / "hf-cache")
    arrow = datasets.load_dataset("arrow", data_files=[str(p) for p in writer.paths], split="train", cache_dir=cache)
    parquet = datasets.load_dataset("parquet", data_files=[str(p) for p in pwriter.paths], split="train", cache_dir=cache)
    for ds in (arrow, parquet):
        assert ds.num_rows == rows
        assert ds[0]["reward_components"] == [
            {"name": k, "value": v} for k, v in sorted(trajs[0].steps[0].reward_components.items())
        ]
        assert np.allclose(ds.with_format("numpy")["advantage"], [s.advantage for t in trajs for s in t.steps])


def test_refusals_and_damage(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "s")
    with pytest.raises(InvalidTrajectoryError, match="without steps"):
        writer.append(Trajectory(env_id="x"))
    bad = sample_traj(1)
    bad.steps[0].reward = float("nan")
    with pytest.raises(InvalidTrajectoryError, match="reward is nan"):
        writer.append(bad)
    with pytest.raises(TypeError):
        writer.append("not a trajectory")  # type: ignore[arg-type]
    writer.append(sample_traj(2))
    writer.close()
    with pytest.raises(StorageError, match="closed"):
        writer.append(sample_traj(1))
    with pytest.raises(ValueError, match="format"):
        ShardWriter(tmp_path / "x", format="csv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compression='gzip': use one of 'mixed', 'zstd', 'lz4'"):
        ShardWriter(tmp_path / "x", format="parquet", compression="gzip")  # type: ignore[arg-type]
    for bad in (0, -1, "5", 2.5, None, True):
        with pytest.raises(ValueError, match=r"max_shard_bytes=.*: use a positive integer"):
            ShardWriter(tmp_path / "bad", max_shard_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"batch_size=.*: use a positive integer"):
            ShardWriter(tmp_path / "bad", batch_size=bad)  # type: ignore[arg-type]
    with ShardWriter(tmp_path / "lz4", format="parquet", compression="lz4") as lz4:
        lz4.extend(many(3))
    assert pq.ParquetFile(lz4.paths[0]).metadata.row_group(0).column(0).compression == "LZ4"
    assert list(read_shards(tmp_path / "lz4")) == many(3)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="not a directory"):
        ShardWriter(tmp_path / "file")
    damaged = writer.paths[0]
    damaged.write_bytes(damaged.read_bytes()[:200])
    with pytest.raises(CorruptRecordError, match="not a readable"):
        list(read_shards(damaged))
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(CorruptRecordError):
        read_table(tmp_path / "junk.parquet")
    with pytest.raises(FileNotFoundError):
        read_table(tmp_path / "missing")
    (tmp_path / "empty-dir").mkdir()
    assert read_table(tmp_path / "empty-dir").num_rows == 0
    # A wrong column name is an argument error, not a damaged Parquet file (nor a KeyError on an empty folder).
    for folder in ("lz4", "empty-dir"):
        with pytest.raises(ValueError, match=r"unknown shard columns \['rewards'\]; the columns are"):
            read_columns(tmp_path / folder, ["rewards"])
    with pytest.raises(TypeError, match=r"pass a list of column names, e.g. \['reward'\]"):
        read_table(tmp_path / "lz4", "reward")  # type: ignore[arg-type]
    # A foreign file in a shard folder is named, not a pyarrow schema dump.
    pq.write_table(pa.table({"a": [1]}), tmp_path / "lz4" / "zz-other.parquet")
    with pytest.raises(FormatError, match=r"zz-other.parquet has other columns or types than .*shard-00000.parquet"):
        read_table(tmp_path / "lz4")


def _codecs(path: Path) -> dict[str, str]:
    group = pq.ParquetFile(path).metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i).compression for i in range(group.num_columns)}


@pytest.mark.parametrize("compression", ["mixed", "zstd"])
def test_parquet_codecs_round_trip_and_damage(tmp_path: Path, compression: str) -> None:
    """The default ("mixed") puts lz4 on step text, no codec on float arrays and zstd on every other leaf;
    "zstd" is still zstd everywhere. Both read back exactly, and a damaged page is an error, not wrong data."""
    trajs = many(9)
    for traj in trajs:
        traj.steps[-1].embedding = np.arange(8, dtype="<f4").tobytes()
        traj.steps[-1].token_ids = np.arange(3, dtype="<i4").tobytes()
    kwargs = {} if compression == "mixed" else {"compression": compression}
    with ShardWriter(tmp_path / "s", format="parquet", **kwargs) as writer:  # type: ignore[arg-type]
        writer.extend(trajs)
    codecs = _codecs(writer.paths[0])
    assert len(codecs) == len(pq.ParquetFile(writer.paths[0]).schema)  # every leaf column is listed
    if compression == "zstd":
        assert set(codecs.values()) == {"ZSTD"}
    else:
        assert codecs["observation"] == codecs["prompt"] == codecs["action"] == "LZ4"
        assert codecs["embedding.list.element"] == codecs["token_log_probs.list.element"] == "UNCOMPRESSED"
        assert codecs["token_ids.list.element"] == codecs["reward"] == codecs["reward_components.list.element.name"] == "ZSTD"
        assert codecs["metadata.list.element.key"] == codecs["env_id"] == "ZSTD"
    assert list(read_shards(tmp_path / "s")) == trajs
    # Flip bytes inside each column's first data page (past its header), the plain float page included:
    # the page checksums turn each into an error instead of wrong values.
    group = pq.ParquetFile(writer.paths[0]).metadata.row_group(0)
    original = writer.paths[0].read_bytes()
    for i in range(group.num_columns):
        column = group.column(i)
        if column.total_compressed_size < 80:
            continue
        data = bytearray(original)
        at = column.data_page_offset + column.total_compressed_size - 8  # the last bytes of the chunk: page data
        data[at : at + 4] = bytes(b ^ 0x5A for b in data[at : at + 4])
        writer.paths[0].write_bytes(bytes(data))
        with pytest.raises(CorruptRecordError, match="not a readable"):
            list(read_shards(tmp_path / "s"))
    writer.paths[0].write_bytes(original)
    assert list(read_shards(tmp_path / "s")) == trajs


def test_table_helpers(tmp_path: Path) -> None:
    trajs = many(5)
    table = trajectories_to_table(trajs)
    assert table_to_trajectories(table) == trajs
    assert table_to_trajectories(trajectories_to_table([])) == []
    with pytest.raises(FormatError, match="lacks the shard columns"):
        table_to_trajectories(pa.table({"reward": [1.0]}))


def test_map_entries_are_stored_sorted_by_key() -> None:
    """A protobuf map iterates in no fixed order, so the writer sorts: the same trajectories give the same table."""
    names, traj = MAP_NAMES, traj_with_maps()
    table = trajectories_to_table([traj])
    assert [e["name"] for e in table.column("reward_components")[0].as_py()] == sorted(names)
    assert [e["key"] for e in table.column("metadata")[0].as_py()] == sorted([*names, "run"])
    assert table_to_trajectories(table) == [traj]


def test_table_to_trajectories_on_chunks_slices_and_null_lists() -> None:
    trajs = many(9)
    rows = [len(t.steps) for t in trajs]
    table = trajectories_to_table(trajs)
    # Several chunks (read_table concatenates shards) and a slice that starts inside the table.
    chunked = pa.concat_tables([trajectories_to_table(trajs[:4]), trajectories_to_table(trajs[4:], first_index=4)])
    assert chunked.column("reward").num_chunks == 2 and table_to_trajectories(chunked) == trajs
    start, stop = sum(rows[:3]), sum(rows[:6])
    assert table_to_trajectories(table.slice(start, stop - start)) == trajs[3:6]
    # Null lists (a table from another writer) read as empty, even where Arrow lets a null row span values.
    expected = many(9)
    for name in ("reward_components", "embedding", "token_ids"):
        column = table.column(name).combine_chunks()
        mask = np.zeros(len(column), dtype=bool)
        mask[[0, 5]] = True
        nulled = pa.ListArray.from_arrays(column.offsets, column.values, mask=pa.array(mask))
        assert nulled.null_count == 2 and nulled.offsets[1].as_py() > 0  # row 0 is null, yet spans values
        table = table.set_column(table.schema.get_field_index(name), name, nulled)
        for row in (0, 5):
            traj = next(i for i in range(9) if sum(rows[: i + 1]) > row)
            expected[traj].steps[row - sum(rows[:traj])].ClearField(name)  # type: ignore[arg-type]
    assert table_to_trajectories(table) == expected


def test_null_scalars_read_as_defaults_and_bad_utf8_is_corrupt() -> None:
    trajs = many(3)
    table = trajectories_to_table(trajs)
    nulls = {"prompt": pa.string(), "reward": pa.float64(), "terminated": pa.bool_(), "tool": pa.string()}
    for name, kind in nulls.items():
        values = table.column(name).to_pylist()
        values[0] = None
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, type=kind))
    first = trajs[0].steps[0]
    for name in nulls:
        first.ClearField(name)  # type: ignore[arg-type]
    assert table_to_trajectories(table) == trajs
    # A string column with bytes that are not UTF-8 (Arrow does not check them when it reads a file).
    bad = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(np.array([0, 2], dtype=np.int32).tobytes()), pa.py_buffer(b"\xff\xfe")]
    )
    one = trajectories_to_table(many(1)[:1]).slice(0, 1)
    one = one.set_column(one.schema.get_field_index("action"), "action", bad)
    with pytest.raises(CorruptRecordError, match="not UTF-8"):
        table_to_trajectories(one)


_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=300)  # no lone surrogates: proto strings are UTF-8


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            _TEXT,
            st.binary(max_size=300),
            st.floats(allow_nan=False, allow_infinity=False),
            st.dictionaries(_TEXT, st.floats(allow_nan=False, allow_infinity=False), max_size=3),
            st.lists(st.floats(width=32, allow_nan=False), max_size=40),
            st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
    traj_count=st.integers(1, 3),
)
def test_table_round_trip_property(steps: list[tuple], traj_count: int) -> None:  # type: ignore[type-arg]
    """The wire bytes table_to_trajectories builds parse to exactly the messages that were written."""
    trajs = []
    for t in range(traj_count):
        built = [
            make_step(
                text, obs, r, comps, prompt=text[::-1], log_prob=-r, embedding=emb or None, token_ids=ids or None, terminated=flag
            )
            for text, obs, r, comps, emb, ids, flag in steps[t:] or steps
        ]
        trajs.append(Trajectory(env_id="e", task_id=f"t{t}", steps=built, metadata={"k": str(t)} if t else {}))
    assert table_to_trajectories(trajectories_to_table(trajs)) == trajs
