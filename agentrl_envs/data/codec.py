"""The trajectory codec: the protobuf messages, the write-time checks, and float arrays as bytes.

:class:`Trajectory` and :class:`Step` are the generated protobuf classes of
``proto/agentrl/v1/trajectory.proto``. :func:`encode` is the one way records are written (the
replay buffer, shards and JSONL all go through it): it refuses non-finite numbers and fields over
their caps, so a NaN reward is caught where it was produced instead of where it poisons a batch.
:func:`decode` turns bytes back into a message and reports undecodable bytes as
:class:`CorruptRecordError`. Float arrays travel as little-endian bytes; :func:`as_float32` reads
them back as zero-copy numpy views.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from agentrl_envs.data.errors import CorruptRecordError, InvalidTrajectoryError, RecordTooLargeError
from agentrl_envs.data.trajectory_pb2 import Step, Trajectory

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "Step",
    "Trajectory",
    "as_float32",
    "as_int32",
    "cap_utf8",
    "decode",
    "encode",
    "float32_bytes",
    "int32_bytes",
    "make_step",
    "step_columns",
    "validate",
]

_SCALARS = ("reward", "log_prob", "value", "advantage")
_ARRAYS = ("embedding", "token_log_probs", "token_ids")
_TEXTS = ("prompt", "action")
_TRAJ_TEXTS = ("env_id", "task_id", "episode_id", "domain", "split", "policy_id")


def is_int(value: object) -> bool:
    """An int or a numpy integer, not a bool (``True`` is not a count). The data layer's one check for counts."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class Limits:
    """Caps checked by :func:`encode`; raise one only if your data needs it.

    Attributes:
        max_text_bytes: UTF-8 size of a step's prompt or action, or a trajectory string field.
        max_observation_bytes: size of a step's observation (the env's 16,000 characters fit).
        max_array_bytes: size of one float32/int32 array field (embedding, token arrays).
        max_steps: steps in one trajectory.
        max_metadata_items: entries in ``Trajectory.metadata``.
        max_record_bytes: size of one serialized trajectory.
    """

    max_text_bytes: int = 1 << 20
    max_observation_bytes: int = 64 << 10
    max_array_bytes: int = 1 << 20
    max_steps: int = 100_000
    max_metadata_items: int = 1_000
    max_record_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not is_int(value) or value < 1:
                raise ValueError(f"Limits({field.name}={value!r}): use a positive integer, e.g. {field.default:_}")

    @cached_property  # read on every encode
    def smallest_field_cap(self) -> int:
        """A payload no larger than this cannot hold an oversize field, so size checks are skipped."""
        return min(self.max_text_bytes, self.max_observation_bytes, self.max_array_bytes)


DEFAULT_LIMITS = Limits()


def encode(traj: Trajectory, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Validate ``traj`` and serialize it.

    Raises:
        TypeError: ``traj`` is not a :class:`Trajectory`.
        InvalidTrajectoryError: a non-finite number or a field over its cap.
        RecordTooLargeError: the serialized trajectory is over ``limits.max_record_bytes``.
    """
    if not isinstance(traj, Trajectory):
        raise TypeError(f"expected an agentrl_envs.data.Trajectory, got {type(traj).__name__}")
    payload = traj.SerializeToString()
    if len(payload) > limits.max_record_bytes:
        raise RecordTooLargeError(
            f"the trajectory serializes to {len(payload):,} bytes, over the {limits.max_record_bytes:,}-byte record cap; "
            "split the episode, drop large fields (embeddings, prompts) or raise Limits.max_record_bytes"
        )
    validate(traj, limits, payload=payload)
    return payload


def validate(traj: Trajectory, limits: Limits = DEFAULT_LIMITS, payload: bytes | None = None) -> None:
    """Raise :class:`InvalidTrajectoryError` if ``traj`` may not be written.

    Checks that rewards, reward components, log-probs, values and advantages are finite, that
    array fields hold whole 4-byte items, and that no field is over its cap. ``payload``, the
    serialized ``traj`` if the caller has it, lets most checks be skipped: a payload no larger than
    the smallest cap cannot hold an oversize field, and one in which no double field's bytes look
    like a NaN or infinity cannot hold one (see :func:`_may_hold_non_finite`); the array sizes are
    then checked by parsing the payload (see :func:`_arrays_whole`), not by reading every step.
    """
    steps = traj.steps
    if len(steps) > limits.max_steps:
        raise InvalidTrajectoryError(
            f"the trajectory has {len(steps):,} steps, over the {limits.max_steps:,}-step cap; split it or raise Limits.max_steps"
        )
    if payload is None or _may_hold_non_finite(payload):
        isfinite = math.isfinite
        for i, step in enumerate(steps):
            # One sum per step: it is finite only if every term is (or it overflowed; _check_scalars decides).
            if not isfinite(step.reward + step.log_prob + step.value + step.advantage):
                _check_scalars(i, step)
            components = step.reward_components
            if components and not isfinite(sum(map(components.__getitem__, components))):  # faster than .values()
                _check_components(i, components)
            if (len(step.embedding) | len(step.token_log_probs) | len(step.token_ids)) & 3:
                _check_arrays(i, step)
    elif not _arrays_whole(payload):  # the payload proves every number finite; only a bad array size is left to find
        for i, step in enumerate(steps):
            if (len(step.embedding) | len(step.token_log_probs) | len(step.token_ids)) & 3:
                _check_arrays(i, step)
    if payload is None or len(payload) > limits.smallest_field_cap:
        _check_sizes(traj, limits)


def _array_sizes_message() -> type[Message]:
    """A private message that reads a serialized Trajectory's step arrays as packed fixed32 and nothing else.

    A packed fixed32 field whose length is not a multiple of 4 does not parse, so a payload parses
    into this message only if every ``embedding``, ``token_log_probs`` and ``token_ids`` holds whole
    4-byte items. The other fields are skipped as unknown. Field numbers come from the real
    descriptors, so the two cannot drift apart.
    """
    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="agentrl/v1/_array_sizes.proto", package="agentrl.v1.check", syntax="proto3")
    step = file.message_type.add(name="StepArrays")
    for name in _ARRAYS:
        number = Step.DESCRIPTOR.fields_by_name[name].number
        step.field.add(name=name, number=number, type=field.TYPE_FIXED32, label=field.LABEL_REPEATED)
    steps = Trajectory.DESCRIPTOR.fields_by_name["steps"].number
    traj = file.message_type.add(name="TrajectoryArrays")
    traj.field.add(
        name="steps", number=steps, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED, type_name=".agentrl.v1.check.StepArrays"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("agentrl.v1.check.TrajectoryArrays"))


_ArraySizes = _array_sizes_message()


def _arrays_whole(payload: bytes) -> bool:
    """True only if every step array in the serialized trajectory ``payload`` holds whole 4-byte items.

    One parse of the (just serialized, so cached) payload in C: ~2x faster than reading three
    fields of every step through upb, and it never touches the message. False means "look field by
    field", which finds the step and names the field.
    """
    try:
        _ArraySizes.FromString(payload)
    except DecodeError:
        return False
    return True


# The one-byte tags that precede every double on the wire: Step.reward (5), log_prob (7), value (8),
# advantage (9), and the value (2) of a reward_components map entry. No other field is a double.
_DOUBLE_TAGS = frozenset(((5 << 3) | 1, (7 << 3) | 1, (8 << 3) | 1, (9 << 3) | 1, (2 << 3) | 1))
_SCAN_BUDGET = 64  # top-byte candidates looked at before the field-by-field check is cheaper


def _may_hold_non_finite(payload: bytes) -> bool:
    """False only if no double in the serialized trajectory ``payload`` can be a NaN or an infinity.

    A non-finite double has all eleven exponent bits set: its last (little-endian top) byte is 0x7F
    or 0xFF and the byte before it is at least 0xF0, and its tag byte sits eight bytes before the top
    byte. ``bytes.find`` jumps between 0x7F/0xFF bytes at C speed; text never holds 0xFF, and holds
    0x7F only as DEL, so a text-heavy payload costs a handful of probes. Too many candidates (float
    arrays are full of them) and the caller checks field by field instead.
    """
    budget = _SCAN_BUDGET
    find = payload.find
    for top in (b"\x7f", b"\xff"):
        i = find(top, 8)
        while i >= 0:
            if payload[i - 1] >= 0xF0 and payload[i - 8] in _DOUBLE_TAGS:
                return True
            budget -= 1
            if budget < 0:
                return True
            i = find(top, i + 1)
    return False


def _check_scalars(i: int, step: Step) -> None:
    for name in _SCALARS:
        value = getattr(step, name)
        if not math.isfinite(value):
            raise InvalidTrajectoryError(
                f"step {i}: {name} is {value}; rewards, log-probs, values and advantages must be finite: "
                "fix the computation that produced it, or clip it before recording"
            )


def _check_components(i: int, components: Mapping[str, float]) -> None:
    for name, value in components.items():
        if not math.isfinite(value):
            raise InvalidTrajectoryError(
                f"step {i}: reward_components[{name!r}] is {value}; every reward component must be finite: "
                "fix the reward term that produced it"
            )


def _check_arrays(i: int, step: Step) -> None:
    for name in _ARRAYS:
        size = len(getattr(step, name))
        if size % 4:
            raise InvalidTrajectoryError(
                f"step {i}: {name} is {size} bytes, not a whole number of 4-byte items; "
                f"build it with float32_bytes()/int32_bytes()"
            )


def _check_sizes(traj: Trajectory, limits: Limits) -> None:
    for name in _TRAJ_TEXTS:
        _check_text(f"trajectory {name}", getattr(traj, name), limits.max_text_bytes)
    if len(traj.metadata) > limits.max_metadata_items:
        raise InvalidTrajectoryError(
            f"metadata has {len(traj.metadata):,} entries, over the {limits.max_metadata_items:,} cap; "
            "keep metadata to a few tags"
        )
    for key, value in traj.metadata.items():
        _check_text(f"metadata[{key[:40]!r}]", key + value, limits.max_text_bytes)
    for i, step in enumerate(traj.steps):
        if len(step.observation) > limits.max_observation_bytes:
            raise InvalidTrajectoryError(
                f"step {i}: observation is {len(step.observation):,} bytes, over the {limits.max_observation_bytes:,}-byte "
                "cap; cap it with make_step() or cap_utf8() (RecordTrajectories does), or raise Limits.max_observation_bytes"
            )
        for name in _TEXTS:
            _check_text(f"step {i}: {name}", getattr(step, name), limits.max_text_bytes)
        for name in _ARRAYS:
            size = len(getattr(step, name))
            if size > limits.max_array_bytes:
                raise InvalidTrajectoryError(
                    f"step {i}: {name} is {size:,} bytes, over the {limits.max_array_bytes:,}-byte cap; "
                    "store a smaller array or raise Limits.max_array_bytes"
                )


def _check_text(what: str, text: str, cap: int) -> None:
    if len(text) * 4 > cap and len(text.encode("utf-8", "surrogatepass")) > cap:
        raise InvalidTrajectoryError(
            f"{what} is {len(text.encode('utf-8', 'surrogatepass')):,} bytes of UTF-8, over the {cap:,}-byte cap; "
            "shorten it (cap_utf8() cuts at a character boundary) or raise Limits.max_text_bytes"
        )


def decode(payload: bytes) -> Trajectory:
    """Parse a serialized trajectory.

    Raises:
        CorruptRecordError: the bytes are not a Trajectory (wrong wire format, bad UTF-8, nesting).
    """
    try:
        return Trajectory.FromString(payload)
    except DecodeError as exc:
        raise CorruptRecordError(
            f"{len(payload):,} bytes do not decode as an agentrl Trajectory ({exc}); "
            "the data is damaged or was written by something else"
        ) from None


def float32_bytes(values: Any) -> bytes:
    """Little-endian float32 bytes of an array-like, for ``Step.embedding`` and ``Step.token_log_probs``."""
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def int32_bytes(values: Any) -> bytes:
    """Little-endian int32 bytes of an array-like, for ``Step.token_ids``."""
    return np.ascontiguousarray(values, dtype="<i4").tobytes()


def as_float32(data: bytes) -> np.ndarray:
    """A read-only float32 view of ``data`` (no copy), e.g. ``as_float32(step.embedding)``."""
    return np.frombuffer(data, dtype="<f4")


def as_int32(data: bytes) -> np.ndarray:
    """A read-only int32 view of ``data`` (no copy), e.g. ``as_int32(step.token_ids)``."""
    return np.frombuffer(data, dtype="<i4")


def cap_utf8(text: str | bytes, max_bytes: int) -> tuple[bytes, bool]:
    """UTF-8 bytes of ``text`` cut to at most ``max_bytes`` at a character boundary; and whether it was cut."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data, False
    cut = max_bytes
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # back off to the start of a character
        cut -= 1
    return data[:cut], True


def make_step(
    action: str,
    observation: str | bytes,
    reward: float,
    reward_components: Mapping[str, float] | None = None,
    *,
    prompt: str = "",
    log_prob: float = 0.0,
    value: float = 0.0,
    advantage: float = 0.0,
    embedding: Any = None,
    token_log_probs: Any = None,
    token_ids: Any = None,
    terminated: bool = False,
    truncated: bool = False,
    tool: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Step:
    """Build a :class:`Step`, capping the observation at ``limits.max_observation_bytes``.

    Array arguments take anything numpy accepts; they are stored as little-endian bytes.
    """
    obs, cut = cap_utf8(observation, limits.max_observation_bytes)
    step = Step(
        prompt=prompt,
        action=action,
        observation=obs,
        observation_truncated=cut,
        reward=float(reward),
        log_prob=float(log_prob),
        value=float(value),
        advantage=float(advantage),
        terminated=bool(terminated),
        truncated=bool(truncated),
        tool=tool or "",
    )
    if reward_components:
        step.reward_components.update({str(k): float(v) for k, v in reward_components.items()})
    if embedding is not None:
        step.embedding = float32_bytes(embedding)
    if token_log_probs is not None:
        step.token_log_probs = float32_bytes(token_log_probs)
    if token_ids is not None:
        step.token_ids = int32_bytes(token_ids)
    return step


def step_columns(traj: Trajectory, names: Sequence[str] = _SCALARS) -> dict[str, np.ndarray]:
    """Per-step float64 columns of a trajectory: ``{"reward": array([...]), "log_prob": ..., ...}``."""
    steps = traj.steps
    return {name: np.fromiter((getattr(s, name) for s in steps), dtype=np.float64, count=len(steps)) for name in names}
