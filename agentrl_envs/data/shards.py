"""Arrow and Parquet shards of trajectories: one row per step, flat columns, rolling files by size.

A shard set is a folder of ``shard-00000.arrow`` (Arrow IPC stream format, uncompressed, read
zero-copy through a memory map) or ``shard-00000.parquet`` (by default lz4 on the step text, zstd on
the rest, page checksums verified on read) files. Each row is one step;
trajectory fields repeat on every row of the trajectory, so ``reward``, ``log_prob``, ``value``
and ``advantage`` are plain float64 columns. A trajectory never spans two files. Files are written
under a temporary name and renamed when complete, so a reader never sees half a shard.

Step text columns: ``action`` is the agent's text; ``observation`` is the env's reply as a UTF-8
string (null only for the rare observation whose bytes are not valid UTF-8, which then sits in
``observation_bytes``, null otherwise); ``prompt`` is what the policy saw before acting: the previous
observation as :class:`~agentrl_envs.wrappers.record_trajectories.RecordTrajectories` records it (the reset observation, i.e.
the instruction, for step 0), or the whole context when the policy passed it with ``annotate(prompt=...)``.
:func:`agentrl_envs.integrations.chat.to_messages` rebuilds the chat from these columns.

Plain pyarrow reads them (``pa.ipc.open_stream(path).read_all()``, ``pq.read_table(path)``) and so
does Hugging Face ``datasets`` (``Dataset.from_file(path)``, ``load_dataset("arrow" | "parquet",
data_files=...)``). Importing this module imports pyarrow; ``import agentrl_envs.data`` does not.

Readers treat a shard as untrusted: regular files only (opened without blocking, checked on the
descriptor), every column ShardWriter writes checked for its type before any data is read, a Parquet
footer declaring more than :data:`MAX_DECODED_RATIO` decoded bytes per file byte (past
:data:`MAX_DECODED_FLOOR`) refused before a page is decoded, and every table fully validated (offsets,
list bounds, UTF-8) before a kernel touches it. Each refusal is a
:class:`~agentrl_envs.data.FormatError` naming the file; bytes that do not decode at all stay a
:class:`~agentrl_envs.data.CorruptRecordError`. Limit: the sizes checked are the footer's; a file
that forges them can still make one page allocate what its page header claims (up to 2 GiB).
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from google.protobuf.message import DecodeError

from agentrl_envs.data.codec import DEFAULT_LIMITS, Limits, Trajectory, is_int, validate
from agentrl_envs.data.errors import CorruptRecordError, FormatError, InvalidTrajectoryError, StorageError

__all__ = [
    "SCHEMA",
    "ShardWriter",
    "read_columns",
    "read_shards",
    "read_table",
    "shard_paths",
    "table_to_trajectories",
    "trajectories_to_table",
]

_KV = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
_COMPONENTS = pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))
SCHEMA = pa.schema(
    [
        ("traj_index", pa.int64()),
        ("step_index", pa.int32()),
        ("num_steps", pa.int32()),
        ("env_id", pa.string()),
        ("task_id", pa.string()),
        ("seed", pa.int64()),
        ("episode_id", pa.string()),
        ("domain", pa.string()),
        ("split", pa.string()),
        ("policy_id", pa.string()),
        ("created_unix_ns", pa.int64()),
        ("episode_terminated", pa.bool_()),
        ("episode_truncated", pa.bool_()),
        ("success", pa.bool_()),
        ("metadata", _KV),
        ("prompt", pa.string()),
        ("action", pa.string()),
        ("observation", pa.string()),
        ("observation_bytes", pa.binary()),
        ("observation_truncated", pa.bool_()),
        ("reward", pa.float64()),
        ("reward_components", _COMPONENTS),
        ("log_prob", pa.float64()),
        ("value", pa.float64()),
        ("advantage", pa.float64()),
        ("embedding", pa.list_(pa.float32())),
        ("token_log_probs", pa.list_(pa.float32())),
        ("token_ids", pa.list_(pa.int32())),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("tool", pa.string()),
    ]
)
_TRAJ_STR = ("env_id", "task_id", "episode_id", "domain", "split", "policy_id")
_STEP_STR = ("prompt", "action", "tool")
_STEP_NUM = ("reward", "log_prob", "value", "advantage")
_STEP_BOOL = ("observation_truncated", "terminated", "truncated")
_ARRAYS = (("embedding", np.float32), ("token_log_probs", np.float32), ("token_ids", np.int32))
_SUFFIX = {"arrow": ".arrow", "parquet": ".parquet"}
_COMPRESSION = ("mixed", "zstd", "lz4", "snappy", "none")
# Parquet: dictionary-encode only the columns that repeat (per trajectory, or the tool name); a dictionary
# on unique text or random floats fills up, falls back to plain pages and slows reads. Statistics
# (min/max for filters) only on the number columns: on long text they cost space and read time.
_PARQUET_DICTIONARY = [*_TRAJ_STR, "tool"]
_PARQUET_STATISTICS = ["traj_index", "step_index", "num_steps", "seed", "created_unix_ns", *_STEP_NUM]
# compression="mixed" (the default): lz4 on the step text, which is most of a shard and which zstd makes
# ~2x smaller but reads ~2x slower; no codec on the float32 arrays, which zstd shrinks by ~8% at twice
# their read time; zstd on everything else (numbers, ids, token ids, reward-component names).
_MIXED_LZ4 = ("prompt", "action", "observation", "observation_bytes")
_MIXED_PLAIN = ("embedding", "token_log_probs")


def _leaf_paths(field: pa.Field) -> list[str]:
    """The Parquet column paths a field writes to (a per-column codec is set on these leaves)."""
    if pa.types.is_list(field.type):
        item = field.type.value_type
        if pa.types.is_struct(item):
            return [f"{field.name}.list.element.{child.name}" for child in item]
        return [f"{field.name}.list.element"]
    return [field.name]


def _parquet_codecs(compression: str) -> str | dict[str, str]:
    """The ``compression`` argument of ``pq.ParquetWriter`` for a :class:`ShardWriter` ``compression`` choice."""
    if compression != "mixed":
        return compression
    codec = {name: "lz4" if name in _MIXED_LZ4 else "none" if name in _MIXED_PLAIN else "zstd" for name in SCHEMA.names}
    return {leaf: codec[field.name] for field in SCHEMA for leaf in _leaf_paths(field)}


def trajectories_to_table(trajectories: Sequence[Trajectory], first_index: int = 0) -> pa.Table:
    """One row per step of ``trajectories``; ``traj_index`` counts from ``first_index``."""
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    arrays: dict[str, list[bytes]] = {name: [] for name, _ in _ARRAYS}
    for t, traj in enumerate(trajectories):
        n = len(traj.steps)
        traj_row = {name: getattr(traj, name) for name in _TRAJ_STR}
        traj_row.update(
            traj_index=first_index + t,
            num_steps=n,
            seed=traj.seed if traj.HasField("seed") else None,
            created_unix_ns=traj.created_unix_ns,
            episode_terminated=traj.terminated,
            episode_truncated=traj.truncated,
            success=traj.success,
            metadata=[{"key": k, "value": v} for k, v in sorted(traj.metadata.items())],
        )
        for name, value in traj_row.items():
            cols[name].extend([value] * n)
        for i, step in enumerate(traj.steps):
            cols["step_index"].append(i)
            for name in (*_STEP_STR, *_STEP_NUM, *_STEP_BOOL):
                cols[name].append(getattr(step, name))
            text = _utf8(step.observation)
            cols["observation"].append(text)
            cols["observation_bytes"].append(None if text is not None else step.observation)
            cols["reward_components"].append([{"name": k, "value": v} for k, v in sorted(step.reward_components.items())])
            for name, _ in _ARRAYS:
                arrays[name].append(getattr(step, name))
    columns = {name: pa.array(values, type=SCHEMA.field(name).type) for name, values in cols.items() if name not in arrays}
    for name, dtype in _ARRAYS:
        columns[name] = _list_array(arrays[name], dtype, SCHEMA.field(name).type)
    return pa.table(columns, schema=SCHEMA)


def _list_array(chunks: list[bytes], dtype: type, arrow_type: pa.DataType) -> pa.Array:
    """A list column from per-row little-endian byte strings, built from one flat buffer."""
    sizes = np.fromiter((len(c) // 4 for c in chunks), dtype=np.int32, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    values = np.frombuffer(b"".join(chunks), dtype=np.dtype(dtype).newbyteorder("<"))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(dtype, copy=False)), type=arrow_type)


def table_to_trajectories(table: pa.Table) -> list[Trajectory]:
    """Rebuild trajectories from rows in :data:`SCHEMA` (rows of one trajectory must be contiguous).

    Column at a time: Arrow kernels build every step's protobuf wire bytes (see ``_steps_wire``), and
    each trajectory parses its steps in one ``MergeFromString``; trajectory fields are converted only
    at the first row of each trajectory. Several times faster than building messages row by row.

    Raises:
        FormatError: a shard column is missing.
        CorruptRecordError: a text column holds bytes that are not UTF-8.
    """
    legacy = table.schema.field("observation").type == pa.binary() if "observation" in table.column_names else False
    missing = [name for name in SCHEMA.names if name not in table.column_names and not (legacy and name == "observation_bytes")]
    if missing:
        raise FormatError(f"the table lacks the shard columns {missing}; it was not written by ShardWriter")
    n = table.num_rows
    if n == 0:
        return []
    traj_index = table.column("traj_index").to_numpy(zero_copy_only=False)
    step_index = table.column("step_index").to_numpy(zero_copy_only=False)
    new = step_index == 0
    new[0] = True
    new[1:] |= traj_index[1:] != traj_index[:-1]
    starts = np.flatnonzero(new)
    head = table.select(["seed", "created_unix_ns", "episode_terminated", "episode_truncated", "success", "metadata", *_TRAJ_STR])
    heads = head.take(pa.array(starts)).to_pydict()
    wire = _steps_wire(table, legacy)
    offsets = np.frombuffer(wire.buffers()[1], dtype=np.int64)[wire.offset : wire.offset + n + 1]
    data = memoryview(wire.buffers()[2])
    bounds = offsets[np.append(starts, n)].tolist()
    env_id, task_id, episode_id, domain, split, policy_id = (heads[name] for name in _TRAJ_STR)
    created, ep_term, ep_trunc, success, seed, metadata = (
        heads[name] for name in ("created_unix_ns", "episode_terminated", "episode_truncated", "success", "seed", "metadata")
    )
    out: list[Trajectory] = []
    for t, start in enumerate(starts.tolist()):
        traj = Trajectory(
            env_id=env_id[t],
            task_id=task_id[t],
            episode_id=episode_id[t],
            domain=domain[t],
            split=split[t],
            policy_id=policy_id[t],
            created_unix_ns=created[t],
            terminated=ep_term[t],
            truncated=ep_trunc[t],
            success=success[t],
        )
        if seed[t] is not None:
            traj.seed = seed[t]
        if metadata[t]:
            tags = traj.metadata
            for kv in metadata[t]:
                tags[kv["key"]] = kv["value"]
        try:
            traj.MergeFromString(data[bounds[t] : bounds[t + 1]])  # type: ignore[arg-type]  # upb takes any buffer
        except DecodeError as exc:
            raise CorruptRecordError(
                f"the steps of trajectory {traj_index[start]} do not make a valid Trajectory ({exc}); a text column "
                "holds bytes that are not UTF-8: the shard is damaged or was not written by ShardWriter"
            ) from None
        out.append(traj)
    return out


def _list_parts(column: pa.ChunkedArray) -> tuple[list[int], pa.Array]:
    """A list column's row offsets (counted from 0, null rows empty) and the values they index."""
    array = _one(column)
    bounds = np.asarray(array.offsets, dtype=np.int64)
    first = int(bounds[0]) if len(bounds) else 0
    values = array.values.slice(first, int(bounds[-1]) - first if len(bounds) else 0)
    bounds -= first
    if array.null_count:  # a null row may still span values (Arrow allows it): keep only the other rows' values
        null = array.is_null().to_numpy(zero_copy_only=False)
        keep = [(int(lo), int(hi)) for lo, hi, skip in zip(bounds[:-1], bounds[1:], null) if not skip]
        values = pa.concat_arrays([values.slice(lo, hi - lo) for lo, hi in keep]) if keep else values.slice(0, 0)
        bounds = np.concatenate([[0], np.cumsum(np.where(null, 0, np.diff(bounds)))])
    return bounds.tolist(), values


# -- steps as protobuf wire bytes, built column at a time -------------------------------------------
#
# table_to_trajectories builds every step's serialized Step in Arrow compute kernels (tag bytes, varint
# lengths and field bytes joined row by row, in C++), then parses each trajectory's steps with one
# MergeFromString: one call per trajectory instead of one per step and field. Field numbers are those of
# proto/agentrl/v1/trajectory.proto; every field is written, defaults too, which parses to the same message.

_EMPTY = pa.scalar(b"", pa.large_binary())
_VARINT_BYTES = 5  # enough for any length below 2**35


def _from_parts(offsets: np.ndarray, data: bytes | np.ndarray) -> pa.Array:
    """A large_binary array from int64 offsets and the bytes they index."""
    # Zero-copy: the Arrow buffers keep the numpy arrays alive (a tobytes() here copied every step's bytes once more).
    raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(raw)])


def _tag_and_length(tag: int, lengths: np.ndarray) -> pa.Array:
    """Per row: the field's tag byte, then ``lengths[row]`` as a varint."""
    lengths = lengths.astype(np.uint64)
    size = np.ones(len(lengths), dtype=np.int64)
    for k in range(1, _VARINT_BYTES):
        size += lengths >= (1 << (7 * k))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(size + 1, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), dtype=np.uint8)
    start = offsets[:-1]
    out[start] = tag
    for k in range(_VARINT_BYTES):
        rows = np.flatnonzero(size > k)
        byte = (lengths[rows] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (size[rows] > k + 1).astype(np.uint64) << np.uint64(7)
        out[start[rows] + 1 + k] = (byte | more).astype(np.uint8)
    return _from_parts(offsets, out)


def _fixed(fields: Sequence[tuple[int, np.ndarray, str]]) -> pa.Array:
    """Per row, each ``(tag, values, dtype)`` field: its tag byte, then the value as little-endian ``dtype``.

    ``<f8`` is a double, ``u1`` a bool; all of the fields go into one fixed-size record per row.
    """
    layout = [(name, kind) for i, (_, _, dtype) in enumerate(fields) for name, kind in ((f"t{i}", "u1"), (f"v{i}", dtype))]
    record = np.empty(len(fields[0][1]), dtype=layout)
    for i, (tag, values, _) in enumerate(fields):
        record[f"t{i}"] = tag
        record[f"v{i}"] = values
    return _from_parts(np.arange(len(record) + 1, dtype=np.int64) * record.dtype.itemsize, record)


def _delimited(tag: int, data: pa.Array) -> list[pa.Array]:
    """The pieces of a length-delimited field: tag + length, then the bytes."""
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False)
    return [_tag_and_length(tag, lengths), data]


def _join(pieces: list[pa.Array]) -> pa.Array:
    return pc.binary_join_element_wise(*pieces, _EMPTY)


def _one(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one array (a copy only when it has several chunks)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _binary(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A text or bytes column as one large_binary array, nulls as empty."""
    array = _one(column).cast(pa.large_binary())
    return array.fill_null(b"") if array.null_count else array


def _numbers(column: pa.ChunkedArray | pa.Array, fill: Any) -> np.ndarray:
    array = _one(column)
    return (array.fill_null(fill) if array.null_count else array).to_numpy(zero_copy_only=False)


def _list_bytes(column: pa.ChunkedArray, dtype: type) -> pa.Array:
    """A list column (embedding, token arrays) as each row's little-endian bytes (null rows empty)."""
    bounds, values = _list_parts(column)
    size = np.dtype(dtype).itemsize
    data = np.asarray(_numbers(values, 0), dtype=np.dtype(dtype).newbyteorder("<"))
    return _from_parts(np.asarray(bounds, dtype=np.int64) * size, data)


def _components_wire(column: pa.ChunkedArray) -> pa.Array:
    """Each row's ``reward_components`` map entries (field 6), concatenated."""
    bounds, entries = _list_parts(column)
    names, values = entries.flatten()
    names = _binary(names)
    entry = _join([*_delimited(0x0A, names), _fixed([(0x11, _numbers(values, 0.0), "<f8")])])
    entry = _join(_delimited(0x32, entry))
    rows = pa.LargeListArray.from_arrays(pa.array(np.asarray(bounds, dtype=np.int64)), entry)
    return pc.binary_join(rows, _EMPTY)


def _steps_wire(table: pa.Table, legacy: bool) -> pa.Array:
    """Per row: that step as a ``Trajectory.steps`` entry (field 4) in protobuf wire format."""
    observation = _binary(table.column("observation"))
    if not legacy:
        raw = table.column("observation_bytes").combine_chunks()
        if raw.null_count < len(raw):  # the rare observation that is not UTF-8
            observation = pc.coalesce(raw.cast(pa.large_binary()), observation)
    numbers = [(0x29, "reward"), (0x39, "log_prob"), (0x41, "value"), (0x49, "advantage")]
    flags = [(0x20, "observation_truncated"), (0x68, "terminated"), (0x70, "truncated")]
    pieces = [
        *_delimited(0x0A, _binary(table.column("prompt"))),
        *_delimited(0x12, _binary(table.column("action"))),
        *_delimited(0x1A, observation),
        _components_wire(table.column("reward_components")),
        _fixed(
            [(tag, _numbers(table.column(name), 0.0), "<f8") for tag, name in numbers]
            + [(tag, _numbers(table.column(name), False), "u1") for tag, name in flags]
        ),
        *_delimited(0x52, _list_bytes(table.column("embedding"), np.float32)),
        *_delimited(0x5A, _list_bytes(table.column("token_log_probs"), np.float32)),
        *_delimited(0x62, _list_bytes(table.column("token_ids"), np.int32)),
        *_delimited(0x7A, _binary(table.column("tool"))),
    ]
    # The Trajectory.steps field (4) around each step: its length is the sum of the pieces', so one join builds all.
    step_lengths = sum(pc.binary_length(piece).to_numpy(zero_copy_only=False).astype(np.int64) for piece in pieces)
    return _join([_tag_and_length(0x22, np.asarray(step_lengths)), *pieces])


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class ShardWriter:
    """Append trajectories to a folder of shards; rolls to a new file past ``max_shard_bytes``.

    Args:
        directory: created if missing. Existing shards are kept; numbering continues after them, and
            writers sharing a folder (and prefix) take distinct file numbers.
        format: ``"arrow"`` (IPC stream, zero-copy reads) or ``"parquet"`` (compressed, smaller).
        max_shard_bytes: start a new file once the current one is at least this big.
        batch_size: trajectories buffered in memory per written batch (a row group in Parquet).
        prefix: file name prefix.
        limits: caps checked on every append.
        compression: Parquet's codecs: ``"mixed"`` (the default: lz4 on the step text, none on the float32
            arrays, zstd on the rest; whole-trajectory reads ~1.3x faster than ``"zstd"``, files ~30% larger),
            ``"zstd"`` on every column (smallest), ``"lz4"``, ``"snappy"`` or ``"none"``. Arrow shards are
            never compressed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        format: Literal["arrow", "parquet"] = "arrow",
        max_shard_bytes: int = 256 << 20,
        batch_size: int = 256,
        prefix: str = "shard",
        limits: Limits = DEFAULT_LIMITS,
        compression: Literal["mixed", "zstd", "lz4", "snappy", "none"] = "mixed",
    ) -> None:
        if format not in _SUFFIX:
            raise ValueError(f"format={format!r}: use 'arrow' or 'parquet'")
        if compression not in _COMPRESSION:
            raise ValueError(f"compression={compression!r}: use one of {', '.join(map(repr, _COMPRESSION))}")
        for name, value in (("max_shard_bytes", max_shard_bytes), ("batch_size", batch_size)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r}: use a positive integer")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
            raise ValueError(f"prefix={prefix!r}: use letters, digits, '_', '-' or '.'")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise StorageError(f"{self.directory} exists and is not a directory; pass a folder for the shards")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.format = format
        self.max_shard_bytes = max_shard_bytes
        self.batch_size = batch_size
        self.prefix = prefix
        self.limits = limits
        self.compression = compression
        self.paths: list[Path] = []
        existing = [
            int(m.group(1)) for p in self.directory.iterdir() if (m := re.fullmatch(rf"{re.escape(prefix)}-(\d+)\.\w+", p.name))
        ]
        self._next_file = max(existing, default=-1) + 1
        self._pending: list[Trajectory] = []
        self._count = 0
        self._sink: Any = None
        self._writer: Any = None
        self._tmp: Path | None = None
        self._closed = False

    def append(self, traj: Trajectory) -> int:
        """Queue ``traj`` for writing; return its index among this writer's trajectories."""
        if self._closed:
            raise StorageError("this ShardWriter is closed; create a new one to write more")
        if not isinstance(traj, Trajectory):
            raise TypeError(f"expected an agentrl_envs.data.Trajectory, got {type(traj).__name__}")
        if not traj.steps:
            raise InvalidTrajectoryError("shards store one row per step, so a trajectory without steps cannot be stored; drop it")
        validate(traj, self.limits)
        self._pending.append(traj)
        self._count += 1
        if len(self._pending) >= self.batch_size:
            self.flush()
        return self._count - 1

    def extend(self, trajectories: Iterable[Trajectory]) -> None:
        for traj in trajectories:
            self.append(traj)

    def flush(self) -> None:
        """Write the queued trajectories as one batch; roll to a new file if this one is full."""
        if not self._pending:
            return
        table = trajectories_to_table(self._pending, first_index=self._count - len(self._pending))
        self._pending = []
        if self._writer is None:
            self._open_file()
        if self.format == "arrow":
            self._writer.write_table(table)
        else:
            self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        if self._sink.tell() >= self.max_shard_bytes:
            self._finish_file()

    def close(self) -> list[Path]:
        """Write what is queued, complete the current file and return every shard written."""
        if not self._closed:
            self.flush()
            self._finish_file()
            self._closed = True
        return list(self.paths)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _open_file(self) -> None:
        # Claim the number with an exclusive create of its temporary file, so that two writers on one
        # folder (a second process, a second ShardWriter) never write, or rename over, the same file.
        while True:
            name = f"{self.prefix}-{self._next_file:05d}{_SUFFIX[self.format]}"
            self._next_file += 1
            final, tmp = self.directory / name, self.directory / f".{name}.tmp"
            if final.exists():
                continue
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:  # another writer's file in progress (or a crashed one's)
                continue
            if final.exists():  # the other writer renamed it into place between the two looks
                tmp.unlink()
                continue
            break
        self._tmp = tmp
        self._sink = pa.OSFile(str(self._tmp), "wb")
        if self.format == "arrow":
            self._writer = pa.ipc.new_stream(self._sink, SCHEMA)
        else:
            self._writer = pq.ParquetWriter(
                self._sink,
                SCHEMA,
                compression=_parquet_codecs(self.compression),
                use_dictionary=_PARQUET_DICTIONARY,
                write_statistics=_PARQUET_STATISTICS,
                write_page_checksum=True,  # every page carries a CRC32 that read_shards checks (plain pages too)
            )

    def _finish_file(self) -> None:
        if self._writer is None or self._tmp is None:
            return
        self._writer.close()
        self._sink.close()
        final = self._tmp.with_name(self._tmp.name[1:].removesuffix(".tmp"))
        os.replace(self._tmp, final)
        self.paths.append(final)
        self._writer = self._sink = self._tmp = None


def shard_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The shard files at ``path``: the file itself, or a folder's ``*.arrow`` and ``*.parquet`` in name order."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".arrow", ".parquet") and not p.name.startswith("."))
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; pass a shard file or the folder a ShardWriter wrote")
    return [path]


#: A Parquet shard may declare at most this many decoded bytes per byte of file (plus the floor below):
#: honest shards decode to a few times their size (lz4 tops out near 255x), a zstd bomb to ~30,000x.
MAX_DECODED_RATIO = 1000
#: Decoded bytes any Parquet shard may declare whatever its size, so small honest files are never refused.
MAX_DECODED_FLOOR = 64 << 20


def _map(path: Path) -> pa.Buffer:
    """The bytes of ``path`` memory-mapped (zero-copy), or FormatError unless it is a regular file.

    Opened without blocking and checked on the descriptor: a FIFO in a shard folder blocked the reader
    forever, and a check of the path before the open could be raced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(f"{path} is a directory; pass a shard file or a folder of them")
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(f"{path} is not a regular file (a pipe, socket or device); a shard is a file ShardWriter wrote")
        if info.st_size == 0:
            raise CorruptRecordError(f"{path} is not a readable Arrow/Parquet shard (it is empty); it is damaged or not a shard")
        return pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _check_schema(path: Path, schema: pa.Schema, columns: Sequence[str] | None) -> None:
    """FormatError naming ``path`` and the column unless every shard column it has holds SCHEMA's type."""
    for field in schema:
        if (columns and field.name not in columns) or field.name not in SCHEMA.names:
            continue  # a column nobody reads, or one ShardWriter does not write (read_table reports foreign files)
        want = SCHEMA.field(field.name).type
        if field.type != want and not (field.name == "observation" and field.type == pa.binary()):  # legacy shards
            raise FormatError(
                f"{path}: column {field.name!r} holds {str(field.type)[:120]}, not {want}; the file was not written by "
                "ShardWriter (or was altered): move it out of the folder"
            )


def _check_parquet_sizes(path: Path, metadata: pq.FileMetaData, file_size: int) -> None:
    """FormatError before any page is decoded when the footer declares more decoded bytes than a shard can hold."""
    declared = sum(
        max(0, metadata.row_group(g).column(c).total_uncompressed_size)
        for g in range(metadata.num_row_groups)
        for c in range(metadata.num_columns)
    )
    limit = MAX_DECODED_RATIO * file_size + MAX_DECODED_FLOOR
    if declared > limit:
        raise FormatError(
            f"{path}: its pages decode to {declared:,} bytes from a {file_size:,}-byte file (the limit is {limit:,}); "
            "a compression bomb, not a shard"
        )


def _read_one(path: Path, columns: Sequence[str] | None) -> pa.Table:
    """One shard file as a table whose schema and data were checked: FormatError or CorruptRecordError naming it."""
    try:
        data = _map(path)
        if path.suffix == ".parquet":
            parquet = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
            _check_schema(path, parquet.schema_arrow, columns)
            _check_parquet_sizes(path, parquet.metadata, data.size)
            # Pages written with a checksum are verified (files from before they were written read as before).
            table = _validated(path, parquet.read(columns=list(columns) if columns else None))
        else:
            try:
                reader = pa.ipc.open_stream(pa.BufferReader(data))
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(pa.BufferReader(data))
            _check_schema(path, reader.schema, columns)
            table = _validated(path, reader.read_all())
            if table.nbytes > 2 * data.size + (1 << 20):  # ShardWriter's IPC is uncompressed: its data is the file
                raise FormatError(
                    f"{path}: its batches decode to {table.nbytes:,} bytes from a {data.size:,}-byte file; not a shard"
                )
            table = table.select(list(columns)) if columns else table
    except (FormatError, CorruptRecordError, FileNotFoundError, IsADirectoryError):
        raise
    except KeyError as exc:
        raise FormatError(f"{path} has no column {exc}; it was not written by ShardWriter") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptRecordError(
            f"{path} is not a readable Arrow/Parquet shard ({str(exc)[:200]}); it is damaged or not a shard"
        ) from None
    return table


def _validated(path: Path, table: pa.Table) -> pa.Table:
    """``table`` after Arrow's full validation: offsets inside their buffers, list bounds, UTF-8 strings.

    A forged file fails here, with FormatError naming it, instead of in a compute kernel later.
    """
    try:
        table.validate(full=True)
    except pa.ArrowException as exc:
        raise FormatError(f"{path}: inconsistent Arrow data ({str(exc)[:200]}); the file is forged or damaged") from None
    return table


def read_table(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
    """All shards at ``path`` as one Arrow table (Arrow shards are memory-mapped, not copied).

    Raises:
        ValueError: ``columns`` names a column that shards do not have.
        FormatError: the files at ``path`` do not share one schema (a foreign file, or shards of an older version),
            a file is not a regular file, holds a shard column of the wrong type, declares a compression bomb
            or fails Arrow's full validation.
        CorruptRecordError: a file's bytes do not decode as Arrow or Parquet.
    """
    if isinstance(columns, str):
        raise TypeError(f"columns={columns!r}: pass a list of column names, e.g. [{columns!r}]")
    unknown = [name for name in columns or () if name not in SCHEMA.names]
    if unknown:  # else Parquet reports the file as damaged, and an empty folder raises KeyError
        raise ValueError(f"unknown shard columns {unknown}; the columns are {', '.join(SCHEMA.names)}")
    paths = shard_paths(path)
    tables = [_read_one(p, columns) for p in paths]
    if not tables:
        return SCHEMA.empty_table().select(list(columns)) if columns else SCHEMA.empty_table()
    odd = next((p for p, table in zip(paths, tables) if not table.schema.equals(tables[0].schema)), None)
    if odd is not None:
        raise FormatError(
            f"{odd} has other columns or types than {paths[0]}, so they do not make one table; move files not "
            "written by ShardWriter out of the folder, pass columns=[...], or read trajectories with read_shards()"
        )
    return pa.concat_tables(tables)


def read_columns(
    path: str | os.PathLike[str], columns: Sequence[str] = ("reward", "log_prob", "advantage")
) -> dict[str, np.ndarray]:
    """Flat numpy columns of every shard at ``path`` (zero-copy for a single Arrow shard of one batch)."""
    table = read_table(path, columns)
    return {name: table.column(name).to_numpy() for name in columns}


def read_shards(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Yield the trajectories stored at ``path``, shard by shard, in write order."""
    for shard in shard_paths(path):
        yield from table_to_trajectories(_read_one(shard, None))
