"""JSONL import and export: round trips, and clear errors (never a crash) on hostile lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.data import (
    InvalidTrajectoryError,
    JSONLError,
    ReplayBuffer,
    Trajectory,
    make_step,
    read_jsonl,
    trajectory_from_dict,
    trajectory_to_dict,
    write_jsonl,
)
from agentrl_envs.data.jsonl import json_depth
from tests.data.test_codec import MAP_NAMES, sample_traj, traj_with_maps


def test_round_trip(tmp_path: Path) -> None:
    trajs = [sample_traj(n) for n in range(4)]
    trajs[1].steps[0].observation = b"\xff\xfe binary"  # not UTF-8: travels as observation_b64
    del trajs[2].metadata["run"]
    trajs[3].ClearField("seed")
    path = tmp_path / "t.jsonl"
    assert write_jsonl(path, trajs) == 4
    assert list(read_jsonl(path)) == trajs
    first = json.loads(path.read_text().splitlines()[1])
    assert "observation_b64" in first["steps"][0] and first["steps"][0]["embedding"][1] == pytest.approx(1 / 7)
    assert json.loads(path.read_text().splitlines()[3])["seed"] is None


def test_map_entries_are_written_sorted_by_key(tmp_path: Path) -> None:
    """A protobuf map iterates in no fixed order (it differs between processes, and between a message and its
    copy read back from the ring), so export sorts: the same trajectory is always the same line."""
    names, traj = MAP_NAMES, traj_with_maps()
    line = trajectory_to_dict(traj)
    assert list(line["metadata"]) == sorted([*names, "run"])
    assert list(line["steps"][0]["reward_components"]) == sorted(names)
    with ReplayBuffer.create(tmp_path / "b.ring", capacity_bytes=1 << 20) as buf:
        buf.append(traj)
        write_jsonl(tmp_path / "out.jsonl", buf)
    write_jsonl(tmp_path / "in.jsonl", [traj])
    assert (tmp_path / "out.jsonl").read_bytes() == (tmp_path / "in.jsonl").read_bytes()


def test_import_into_and_export_from_a_buffer(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [sample_traj(2) for _ in range(5)])
    with ReplayBuffer.create(tmp_path / "b.ring", capacity_bytes=1 << 20) as buf:
        for traj in read_jsonl(source):
            buf.append(traj)
        assert write_jsonl(tmp_path / "out.jsonl", buf) == 5
    assert (tmp_path / "out.jsonl").read_bytes() == source.read_bytes()


def _write_lines(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested 100,000 levels deep"),
        (b'{"steps": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested 5,001 levels deep"),
        (b'{"env_id": "x"', "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b'{"env_id": NaN}', "not valid JSON"),
        (b'{"steps": [{"reward": Infinity}]}', "not valid JSON"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b'"just a string"', "must be a JSON object"),
        (b'{"env_id": 5}', "env_id must be a str"),
        (b'{"unknown": 1}', "unknown keys 'unknown'"),
        (b'{"steps": [{"reward": "1.0"}]}', r"steps\[0\].reward must be a number"),
        (b'{"steps": [{"reward": true}]}', r"steps\[0\].reward must be a number"),
        (b'{"steps": [{"embedding": [1, "x"]}]}', "must hold only numbers"),
        (b'{"steps": [{"token_ids": [1.5]}]}', "must hold only ints"),
        (b'{"steps": [{"token_ids": [9999999999]}]}', "32-bit"),
        (b'{"steps": [{"reward_components": {"a": null}}]}', "must be a number"),
        (b'{"steps": [{"observation_b64": "***"}]}', "not valid base64"),
        (b'{"seed": 1e400}', "seed must be a 64-bit int"),
        (b'{"seed": 99999999999999999999999}', "seed must be a 64-bit int"),
        (b'{"metadata": {"k": 1}}', "must be a string"),
        (b'{"steps": [{"prompt": "\\ud800"}]}', r"steps\[0\].prompt holds a lone surrogate"),
        (b'{"steps": [{"observation": "\\udfff"}]}', r"steps\[0\].observation holds a lone surrogate"),
        (b'{"steps": [{"reward": 1e999}]}', "not valid JSON|must be finite"),
    ],
)
def test_hostile_lines_raise_clear_errors(tmp_path: Path, line: bytes, message: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", json.dumps(trajectory_to_dict(sample_traj(1))).encode(), line)
    reader = read_jsonl(path)
    assert next(reader) == sample_traj(1)  # the good line before it is fine
    with pytest.raises(JSONLError, match=message) as info:
        next(reader)
    assert "bad.jsonl:2" in str(info.value)


def test_limits_on_lines_and_files(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "long.jsonl", b'{"env_id": "' + b"x" * 5000 + b'"}')
    with pytest.raises(JSONLError, match="longer than max_line_bytes=1,000"):
        list(read_jsonl(path, max_line_bytes=1000))
    for bad in (-1, 0, True, 1.5):  # -1 read the file as empty: no trajectories and no error; True meant 1 byte
        with pytest.raises(ValueError, match=f"max_line_bytes={bad}: use a positive number of bytes"):
            list(read_jsonl(path, max_line_bytes=bad))
    path = _write_lines(tmp_path / "deep.jsonl", b'{"metadata": {}, "steps": [{"reward_components": {}}]}')
    assert len(list(read_jsonl(path, max_depth=4))) == 1
    with pytest.raises(JSONLError, match="nested 4 levels deep, over the limit of 3"):
        list(read_jsonl(path, max_depth=3))
    with pytest.raises(JSONLError, match="is a directory"):
        list(read_jsonl(tmp_path))
    empty = _write_lines(tmp_path / "empty.jsonl", b"", b"   ")
    assert list(read_jsonl(empty)) == []
    # Writing: the errors name the path given, not the temporary file written first.
    with pytest.raises(FileNotFoundError, match=r"the folder .*nodir does not exist; create it first") as missing:
        write_jsonl(tmp_path / "nodir" / "t.jsonl", [])
    with pytest.raises(IsADirectoryError, match=r"is a directory; pass the path of the \.jsonl file") as folder:
        write_jsonl(tmp_path, [])
    assert ".tmp" not in str(missing.value) + str(folder.value)


def test_invalid_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(JSONLError, match="over the 65,536-byte cap"):
        trajectory_from_dict({"steps": [{"observation": "x" * 70_000}]}, where="line 1")
    traj = Trajectory(steps=[make_step("a", "o", 1.0, embedding=[np.nan])])
    with pytest.raises(InvalidTrajectoryError, match="JSON cannot hold"):
        write_jsonl(tmp_path / "nan.jsonl", [traj])
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "nan.jsonl").exists()


def test_json_depth_counts_without_recursion() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[{{{{"}]}') == 3
    assert json_depth(b'"\\"[[[["') == 0
    assert json_depth(b"[" * 300_000) == 300_000
    assert json_depth(b"42") == 0


@settings(max_examples=40, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
        max_leaves=30,
    )
)
def test_arbitrary_json_never_crashes(tmp_path_factory: pytest.TempPathFactory, value: object) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.jsonl"
    path.write_text(json.dumps(value) + "\n")
    try:
        list(read_jsonl(path))
    except JSONLError:
        pass
