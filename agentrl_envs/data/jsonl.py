"""JSON-lines import and export of trajectories, for tools that speak JSON.

One trajectory per line, as the dict :func:`trajectory_to_dict` builds: the proto field names,
``observation`` as text (or ``observation_b64`` when it is not UTF-8), float arrays as lists of
numbers, map entries (``metadata``, ``reward_components``) sorted by key, so that a trajectory is always
written as the same line. Reading is defensive: every line is checked for nesting depth *before* ``json.loads``
(which raises ``RecursionError`` around depth 1,000 and would accept ``NaN``), for size, and
against the schema, and a bad line raises :class:`JSONLError` naming the line and the problem.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agentrl_envs.data.codec import (
    DEFAULT_LIMITS,
    Limits,
    Step,
    Trajectory,
    as_float32,
    as_int32,
    float32_bytes,
    int32_bytes,
    is_int,
    validate,
)
from agentrl_envs.data.errors import InvalidTrajectoryError, JSONLError

__all__ = ["json_depth", "read_jsonl", "trajectory_from_dict", "trajectory_to_dict", "write_jsonl"]

MAX_DEPTH = 32  # a trajectory needs 4: line -> steps -> step -> reward_components / arrays
MAX_LINE_BYTES = 64 << 20
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_TRAJ_STR = ("env_id", "task_id", "episode_id", "domain", "split", "policy_id")
_TRAJ_BOOL = ("terminated", "truncated", "success")
_STEP_STR = ("prompt", "action", "tool")
_STEP_BOOL = ("observation_truncated", "terminated", "truncated")
_STEP_NUM = ("reward", "log_prob", "value", "advantage")
_STEP_F32 = ("embedding", "token_log_probs")
_TRAJ_KEYS = frozenset((*_TRAJ_STR, *_TRAJ_BOOL, "seed", "created_unix_ns", "metadata", "steps"))
_STEP_KEYS = frozenset(
    (*_STEP_STR, *_STEP_BOOL, *_STEP_NUM, *_STEP_F32, "token_ids", "observation", "observation_b64", "reward_components")
)


def trajectory_to_dict(traj: Trajectory) -> dict[str, Any]:
    """A JSON-ready dict of ``traj`` (see the module docstring for the mapping)."""
    out: dict[str, Any] = {name: getattr(traj, name) for name in _TRAJ_STR}
    out.update({name: getattr(traj, name) for name in _TRAJ_BOOL})
    out["seed"] = traj.seed if traj.HasField("seed") else None
    out["created_unix_ns"] = traj.created_unix_ns
    out["metadata"] = dict(sorted(traj.metadata.items()))  # a protobuf map iterates in no fixed order
    out["steps"] = [_step_to_dict(step) for step in traj.steps]
    return out


def _step_to_dict(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(step, name) for name in _STEP_STR}
    try:
        out["observation"] = step.observation.decode("utf-8")
    except UnicodeDecodeError:
        out["observation_b64"] = base64.b64encode(step.observation).decode("ascii")
    out.update({name: getattr(step, name) for name in _STEP_BOOL})
    out.update({name: getattr(step, name) for name in _STEP_NUM})
    out["reward_components"] = dict(sorted(step.reward_components.items()))
    for name in _STEP_F32:
        out[name] = as_float32(getattr(step, name)).tolist()
    out["token_ids"] = as_int32(step.token_ids).tolist()
    return out


def trajectory_from_dict(data: Any, where: str = "trajectory", limits: Limits = DEFAULT_LIMITS) -> Trajectory:
    """Build and validate a Trajectory from a dict shaped like :func:`trajectory_to_dict`'s output.

    Raises:
        JSONLError: a wrong type, an unknown key, or a value the codec refuses; ``where`` prefixes the message.
    """
    try:
        traj = _build(data, where, limits)
    except JSONLError:
        raise
    except (ValueError, TypeError, UnicodeError, OverflowError) as exc:  # e.g. a value protobuf refuses
        raise JSONLError(f"{where}: {exc}") from None
    try:
        validate(traj, limits)
    except InvalidTrajectoryError as exc:
        raise JSONLError(f"{where}: {exc}") from None
    return traj


def _build(data: Any, where: str, limits: Limits) -> Trajectory:
    _expect(isinstance(data, dict), where, "must be a JSON object (one trajectory per line)", data)
    _no_unknown(data, _TRAJ_KEYS, where)
    traj = Trajectory()
    for name in _TRAJ_STR:
        setattr(traj, name, _get(data, name, str, where, ""))
    for name in _TRAJ_BOOL:
        setattr(traj, name, _get(data, name, bool, where, False))
    seed = data.get("seed")
    if seed is not None:
        _expect(_is_int(seed) and -(2**63) <= seed < 2**63, f"{where}.seed", "must be a 64-bit int or null", seed)
        traj.seed = seed
    created = _get(data, "created_unix_ns", int, where, 0)
    _expect(-(2**63) <= created < 2**63, f"{where}.created_unix_ns", "must fit in 64 bits", created)
    traj.created_unix_ns = created
    metadata = _get(data, "metadata", dict, where, {})
    for key, value in metadata.items():
        _expect(isinstance(value, str), f"{where}.metadata[{key[:40]!r}]", "must be a string", value)
    traj.metadata.update(metadata)
    steps = _get(data, "steps", list, where, [])
    _expect(len(steps) <= limits.max_steps, f"{where}.steps", f"has more than {limits.max_steps:,} steps", len(steps))
    traj.steps.extend(_step_from_dict(step, f"{where}.steps[{i}]") for i, step in enumerate(steps))
    return traj


def _step_from_dict(data: Any, where: str) -> Step:
    _expect(isinstance(data, dict), where, "must be a JSON object", data)
    _no_unknown(data, _STEP_KEYS, where)
    step = Step()
    for name in _STEP_STR:
        setattr(step, name, _get(data, name, str, where, ""))
    for name in _STEP_BOOL:
        setattr(step, name, _get(data, name, bool, where, False))
    for name in _STEP_NUM:
        setattr(step, name, _number(data.get(name, 0.0), f"{where}.{name}"))
    if "observation_b64" in data:
        _expect("observation" not in data, where, "has both observation and observation_b64; keep one", None)
        try:
            step.observation = base64.b64decode(_get(data, "observation_b64", str, where, ""), validate=True)
        except ValueError:
            raise JSONLError(f"{where}.observation_b64 is not valid base64") from None
    else:
        step.observation = _get(data, "observation", str, where, "").encode("utf-8")
    components = _get(data, "reward_components", dict, where, {})
    step.reward_components.update(
        {key: _number(value, f"{where}.reward_components[{key[:40]!r}]") for key, value in components.items()}
    )
    for name in _STEP_F32:
        setattr(step, name, float32_bytes(_numbers(data.get(name, []), f"{where}.{name}", float)))
    step.token_ids = int32_bytes(_numbers(data.get("token_ids", []), f"{where}.token_ids", int))
    return step


def _expect(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        shown = type(value).__name__ if not isinstance(value, (int, float)) else repr(value)
        raise JSONLError(f"{where} {what} (got {shown})")


def _no_unknown(data: dict[str, Any], known: frozenset[str], where: str) -> None:
    unknown = set(data) - known
    if unknown:
        names = ", ".join(sorted(repr(k[:40]) for k in unknown)[:5])
        raise JSONLError(f"{where} has unknown keys {names}; known keys: {', '.join(sorted(known))}")


def _get(data: dict[str, Any], name: str, kind: type, where: str, default: Any) -> Any:
    value = data.get(name, default)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    _expect(ok, f"{where}.{name}", f"must be {'an' if kind is int else 'a'} {kind.__name__}", value)
    if kind is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise JSONLError(
                f"{where}.{name} holds a lone surrogate (\\ud800-\\udfff), which is not text; fix the producer"
            ) from None
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, where: str) -> float:
    _expect(isinstance(value, (int, float)) and not isinstance(value, bool), where, "must be a number", value)
    return float(value)


def _numbers(values: Any, where: str, kind: type) -> np.ndarray:
    _expect(isinstance(values, list), where, "must be a list of numbers", values)
    ok = all((_is_int(v) if kind is int else isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
    _expect(ok, where, f"must hold only {'ints' if kind is int else 'numbers'}", values)
    if kind is int:
        _expect(all(-(2**31) <= v < 2**31 for v in values), where, "must hold 32-bit ints", values)
    return np.asarray(values, dtype=np.float32 if kind is float else np.int32)


def json_depth(line: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in a JSON text, counted without recursion."""
    if line.count(b"[") + line.count(b"{") == 0:
        return 0
    codes = np.frombuffer(_STRING.sub(b"", line), dtype=np.uint8)
    delta = ((codes == 0x5B) | (codes == 0x7B)).astype(np.int64) - ((codes == 0x5D) | (codes == 0x7D))
    return int(np.cumsum(delta).max(initial=0))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_line(line: bytes, where: str, max_depth: int = MAX_DEPTH, limits: Limits = DEFAULT_LIMITS) -> Trajectory:
    """Parse one JSONL line into a validated Trajectory (depth-checked before ``json.loads``)."""
    if line.count(b"[") + line.count(b"{") > max_depth:
        depth = json_depth(line)
        if depth > max_depth:
            raise JSONLError(
                f"{where} is nested {depth:,} levels deep, over the limit of {max_depth} (a trajectory needs 4); "
                "it is not a trajectory: check what produced the file, or raise max_depth"
            )
    try:
        data = json.loads(line, parse_constant=_reject_constant)
    except RecursionError:  # json_depth ran, so only a huge max_depth gets here
        raise JSONLError(f"{where} is nested too deeply for Python's json parser; lower max_depth") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JSONLError(f"{where} is not valid JSON: {exc}") from None
    return trajectory_from_dict(data, where, limits)


def read_jsonl(
    path: str | os.PathLike[str],
    *,
    max_depth: int = MAX_DEPTH,
    max_line_bytes: int = MAX_LINE_BYTES,
    limits: Limits = DEFAULT_LIMITS,
) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file, one per non-blank line.

    Raises:
        JSONLError: a line that is too long, too deep, not JSON or not a trajectory; the message
            gives the file and line number.
    """
    path = Path(path)
    if not is_int(max_line_bytes) or max_line_bytes < 1:  # readline(0) reads nothing: the file would look empty
        raise ValueError(f"max_line_bytes={max_line_bytes!r}: use a positive number of bytes, e.g. {MAX_LINE_BYTES}")
    if path.is_dir():
        raise JSONLError(f"{path} is a directory; pass the path of a .jsonl file")
    with open(path, "rb") as f:
        number = 0
        while True:
            line = f.readline(max_line_bytes + 1)
            if not line:
                return
            number += 1
            where = f"{path}:{number}"
            if len(line) > max_line_bytes:
                raise JSONLError(f"{where} is longer than max_line_bytes={max_line_bytes:,}; split the file or raise the limit")
            if line.strip():
                yield parse_line(line, where, max_depth, limits)


def write_jsonl(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> int:
    """Write ``trajectories`` to ``path`` (atomically: a temporary file renamed at the end); return the count.

    Raises:
        InvalidTrajectoryError: a float array holds NaN or infinity, which JSON cannot represent.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass the path of the .jsonl file to write")
    if not path.parent.is_dir():  # else the error names the temporary file
        raise FileNotFoundError(f"the folder {path.parent} does not exist; create it first (the .jsonl file goes in it)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for traj in trajectories:
                try:
                    f.write(json.dumps(trajectory_to_dict(traj), ensure_ascii=False, allow_nan=False))
                except ValueError:
                    raise InvalidTrajectoryError(
                        f"trajectory {count} has NaN or infinity in a float array, which JSON cannot hold; clean the array first"
                    ) from None
                f.write("\n")
                count += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count
