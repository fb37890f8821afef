"""Trajectory storage for agentrl, without torch: a schema, a replay buffer, shards, JSONL.

::

    from agentrl_envs.data import ReplayBuffer, Trajectory
    from agentrl_envs.wrappers.record_trajectories import RecordTrajectories

    with ReplayBuffer.create("replay.ring", capacity_bytes=256 << 20) as buf:
        env = RecordTrajectories(gym.make("AgentRL/SQLPythonSMTP-v1"), buf)
        ...                                   # every finished episode is appended to buf
        batch = buf.sample(32, rng=0)         # list of Trajectory messages

Modules:

- ``codec``: the protobuf classes :class:`Trajectory` and :class:`Step` (generated from
  ``proto/agentrl/v1/trajectory.proto``), :func:`encode` (validates, then serializes),
  :func:`decode`, float arrays as bytes and back as zero-copy numpy views.
- ``replay``: :class:`ReplayBuffer`, a crash-safe mmap ring of checksummed records.
- ``shards``: :class:`ShardWriter` and readers for Arrow IPC / Parquet shards with flat reward
  columns (imports pyarrow when first used, not on ``import agentrl_envs.data``).
- ``jsonl``: JSON-lines import and export with a depth-limited, schema-checked parser.
- ``errors``: :class:`StorageError` and its subclasses (the tree is drawn in that module).

The wrappers that record episodes into these stores (``RecordTrajectories``, ``RecordVectorTrajectories``)
live with the other wrappers, in :mod:`agentrl_envs.wrappers.record_trajectories`.

``import agentrl_envs`` does not import this package; import it explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl_envs.data.codec import (
    DEFAULT_LIMITS,
    Limits,
    Step,
    Trajectory,
    as_float32,
    as_int32,
    cap_utf8,
    decode,
    encode,
    float32_bytes,
    int32_bytes,
    make_step,
    step_columns,
    validate,
)
from agentrl_envs.data.errors import (
    BufferLockedError,
    CorruptRecordError,
    FormatError,
    InvalidTrajectoryError,
    JSONLError,
    RecordNotFoundError,
    RecordTooLargeError,
    StorageError,
)
from agentrl_envs.data.jsonl import read_jsonl, trajectory_from_dict, trajectory_to_dict, write_jsonl
from agentrl_envs.data.replay import RecoveryReport, ReplayBuffer

if TYPE_CHECKING:
    from agentrl_envs.data.shards import ShardWriter, read_columns, read_shards, read_table

_LAZY = {name: "agentrl_envs.data.shards" for name in ("ShardWriter", "read_columns", "read_shards", "read_table")}


def __getattr__(name: str) -> Any:
    # The shard API pulls in pyarrow (~0.2 s); load it on first use only.
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentrl_envs.data' has no attribute {name!r}")


__all__ = [
    "DEFAULT_LIMITS",
    "BufferLockedError",
    "CorruptRecordError",
    "FormatError",
    "InvalidTrajectoryError",
    "JSONLError",
    "Limits",
    "RecordNotFoundError",
    "RecordTooLargeError",
    "RecoveryReport",
    "ReplayBuffer",
    "ShardWriter",
    "Step",
    "StorageError",
    "Trajectory",
    "as_float32",
    "as_int32",
    "cap_utf8",
    "decode",
    "encode",
    "float32_bytes",
    "int32_bytes",
    "make_step",
    "read_columns",
    "read_jsonl",
    "read_shards",
    "read_table",
    "step_columns",
    "trajectory_from_dict",
    "trajectory_to_dict",
    "validate",
    "write_jsonl",
]
