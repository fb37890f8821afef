"""Errors of the storage layer, under :class:`~agentrl_envs.errors.AgentRLError`.

::

    AgentRLError
    └── StorageError                    base of every agentrl_envs.data error
        ├── InvalidTrajectoryError      a write was refused: NaN reward, oversize field (also ValueError)
        │   └── RecordTooLargeError     a record larger than the buffer or the record cap
        ├── CorruptRecordError          a checksum failed, a payload does not decode, a seq was quarantined
        ├── RecordNotFoundError         a seq that was never written or has been evicted (also KeyError)
        ├── BufferLockedError           a second writer on one buffer file
        ├── FormatError                 not a buffer file, a version or capacity mismatch, a truncated file (also ValueError)
        └── JSONLError                  a JSONL line that is not a trajectory: syntax, nesting depth, schema (also ValueError)

Every error pickles with its message intact (they cross process boundaries) and says what to do.
"""

from __future__ import annotations

from agentrl_envs.errors import AgentRLError

__all__ = [
    "BufferLockedError",
    "CorruptRecordError",
    "FormatError",
    "InvalidTrajectoryError",
    "JSONLError",
    "RecordNotFoundError",
    "RecordTooLargeError",
    "StorageError",
]


class StorageError(AgentRLError):
    """Base of the storage layer's errors."""


class InvalidTrajectoryError(StorageError, ValueError):
    """A trajectory that may not be written: a non-finite number, a field over its cap."""


class RecordTooLargeError(InvalidTrajectoryError):
    """A serialized trajectory larger than the buffer's capacity or the record size cap."""


class CorruptRecordError(StorageError):
    """Bytes on disk that failed their checksum or do not decode as a trajectory."""


class RecordNotFoundError(StorageError, KeyError):
    """A sequence number that is not in the buffer (never written, or evicted by newer records)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class BufferLockedError(StorageError):
    """Another process (or another handle in this one) has the buffer open for writing."""


class FormatError(StorageError, ValueError):
    """A file that is not a replay buffer of this format version and capacity."""


class JSONLError(StorageError, ValueError):
    """A JSONL line that is not a trajectory; the message names the line and the problem."""
