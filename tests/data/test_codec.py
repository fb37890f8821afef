"""The trajectory schema and codec: generated code freshness, write-time validation, float arrays."""

from __future__ import annotations

import math
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.data import (
    CorruptRecordError,
    InvalidTrajectoryError,
    Limits,
    RecordTooLargeError,
    Step,
    Trajectory,
    as_float32,
    as_int32,
    cap_utf8,
    codec,
    decode,
    encode,
    float32_bytes,
    make_step,
    protogen,
    step_columns,
)
from agentrl_envs.data.errors import StorageError
from tests.conftest import require_integration


def sample_traj(n: int = 3) -> Trajectory:
    steps = [
        make_step(
            f'<tool_call>{{"name": "sql", "arguments": {{"query": "SELECT {i}"}}}}</tool_call>',
            f"sql ok: {i} row(s)",
            0.5 * i,
            {"task": 0.0, "aux": 0.5 * i},
            prompt=f"observation {i}",
            log_prob=-1.5,
            value=0.25,
            advantage=0.1,
            embedding=np.arange(8) / 7,
            token_log_probs=[-0.1, -0.2],
            token_ids=[1, 2, 3],
            tool="sql",
        )
        for i in range(n)
    ]
    return Trajectory(env_id="AgentRL/SQL-v0", task_id="SQL/retail/train/1", seed=7, steps=steps, metadata={"run": "a"})


MAP_NAMES = ["task", "aux", "sql", "python", "smtp", "http", "penalty", "format", "z", "a"]


def traj_with_maps() -> Trajectory:
    """One step whose ``reward_components`` and ``metadata`` hold :data:`MAP_NAMES` (plus ``run``), not in key order."""
    traj = sample_traj(1)
    traj.steps[0].reward_components.clear()
    traj.steps[0].reward_components.update({name: 0.1 for name in MAP_NAMES})
    traj.metadata.update({name: name for name in MAP_NAMES})
    return traj


def test_generated_code_is_fresh() -> None:
    """Regenerating trajectory_pb2.py(i) from the .proto gives the committed bytes."""
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        if require_integration():
            pytest.fail("grpcio-tools is required under AGENTRL_REQUIRE_INTEGRATION=1: pip install -e '.[dev]'")
        pytest.skip("grpcio-tools is not installed (pip install -e '.[dev]'), so the pb2 freshness check cannot run")
    assert protogen.check() == [], "run: python -m agentrl_envs.data.protogen"


def test_import_is_lazy_and_torch_free() -> None:
    code = (
        "import sys, agentrl_envs\n"
        "assert 'agentrl_envs.data' not in sys.modules, 'agentrl_envs must not import the data package'\n"
        "import agentrl_envs.data\n"
        "assert 'pyarrow' not in sys.modules, 'pyarrow loads on first shard use only'\n"
        "from agentrl_envs.data import ShardWriter\n"
        "assert not {'torch', 'transformers', 'peft'} & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_round_trip_and_pickle() -> None:
    traj = sample_traj()
    assert decode(encode(traj)) == traj
    assert pickle.loads(pickle.dumps(traj)) == traj
    assert type(traj).__module__ == "agentrl_envs.data.trajectory_pb2"
    assert not Trajectory().HasField("seed") and traj.HasField("seed")


def test_float_arrays_are_zero_copy_views() -> None:
    step = decode(encode(sample_traj(1))).steps[0]
    data = step.embedding
    view = as_float32(data)
    assert view.dtype == np.float32 and np.allclose(view, np.arange(8) / 7)
    assert np.shares_memory(view, np.frombuffer(data, dtype=np.uint8))
    assert not view.flags.writeable
    assert as_int32(step.token_ids).tolist() == [1, 2, 3]
    cols = step_columns(sample_traj(3))
    assert cols["reward"].tolist() == [0.0, 0.5, 1.0] and cols["log_prob"].dtype == np.float64


@pytest.mark.parametrize("field", ["reward", "log_prob", "value", "advantage"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(field: str, bad: float) -> None:
    traj = sample_traj()
    setattr(traj.steps[1], field, bad)
    with pytest.raises(InvalidTrajectoryError, match=f"step 1: {field} is"):
        encode(traj)


def test_non_finite_component_is_refused() -> None:
    traj = sample_traj()
    traj.steps[2].reward_components["fault"] = math.nan
    with pytest.raises(InvalidTrajectoryError, match=r"reward_components\['fault'\] is nan"):
        encode(traj)


def test_huge_but_finite_numbers_pass() -> None:
    traj = sample_traj(1)
    traj.steps[0].reward = 1e308
    traj.steps[0].value = 1e308  # the sum overflows; each number is still finite
    assert decode(encode(traj)).steps[0].reward == 1e308


def test_oversize_fields_and_records_are_refused() -> None:
    traj = sample_traj(1)
    traj.steps[0].observation = b"x" * ((64 << 10) + 1)
    with pytest.raises(InvalidTrajectoryError, match=r"observation is .* over the 65,536-byte cap"):
        encode(traj)
    traj = sample_traj(1)
    traj.steps[0].prompt = "é" * 600_000  # 1.2 MB of UTF-8 in 600k characters
    with pytest.raises(InvalidTrajectoryError, match="prompt is 1,200,000 bytes"):
        encode(traj)
    traj = sample_traj(1)
    traj.steps[0].embedding = b"\0" * 6
    with pytest.raises(InvalidTrajectoryError, match="not a whole number of 4-byte items"):
        encode(traj)
    with pytest.raises(RecordTooLargeError, match="record cap"):
        encode(sample_traj(50), Limits(max_record_bytes=1000))
    with pytest.raises(InvalidTrajectoryError, match="steps"):
        encode(sample_traj(5), Limits(max_steps=4))
    with pytest.raises(TypeError, match="Trajectory"):
        encode({"steps": []})  # type: ignore[arg-type]


def test_limits_refuse_caps_that_are_not_positive_integers() -> None:
    # a string cap failed later, inside encode, as a raw TypeError from min(); 0 refused every record
    for bad in ("1000", 0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match=r"Limits\(max_text_bytes=.*\): use a positive integer, e.g. 1_048_576"):
            Limits(max_text_bytes=bad)  # type: ignore[arg-type]
    assert Limits(max_steps=np.int64(3)).max_steps == 3


def test_empty_trajectory_encodes_to_nothing() -> None:
    assert encode(Trajectory()) == b""
    assert decode(b"") == Trajectory()


@pytest.mark.parametrize(
    "payload",
    [b"\xff\xff\xff\xff", b'{"env_id": "x"}', b"\x0b" * 200, b"hello world", bytes(range(256)), b"\x22\x03\xff\xfe\xfd"],
)
def test_garbage_payloads_are_corrupt_records(payload: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="do not decode"):
        decode(payload)


def test_deep_unknown_nesting_is_refused_not_crashed() -> None:
    deep = b"\x0b" * 100_000 + b"\x0c" * 100_000  # 100k nested groups of an unknown field
    with pytest.raises(CorruptRecordError):
        decode(deep)


def test_cap_utf8_cuts_on_a_character_boundary() -> None:
    data, cut = cap_utf8("aé€😀" * 10, 11)
    assert cut and len(data) <= 11
    data.decode("utf-8")  # no broken character
    assert cap_utf8("short", 100) == (b"short", False)
    step = make_step("a", "ø" * 40_000, 0.0)
    assert step.observation_truncated and len(step.observation) <= 64 << 10


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=0, max_size=6),
    text=st.text(max_size=200),
    obs=st.binary(max_size=300),
    emb=st.lists(st.floats(width=32, allow_nan=False), max_size=20),
)
def test_codec_round_trip_property(rewards: list[float], text: str, obs: bytes, emb: list[float]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates cannot be proto strings
    steps = [Step(prompt=text, action=text, observation=obs, reward=r, embedding=float32_bytes(emb)) for r in rewards]
    traj = Trajectory(env_id=text, steps=steps)
    back = decode(encode(traj))
    assert back == traj
    for step in back.steps:
        assert as_float32(step.embedding).tolist() == np.asarray(emb, dtype=np.float32).tolist()


# Every bit pattern (so NaNs with any payload and sign), plus the usual floats and the non-finite ones directly.
_DOUBLES = st.one_of(
    st.integers(0, 2**64 - 1).map(lambda bits: struct.unpack("<d", struct.pack("<Q", bits))[0]),
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, -math.nan]),
)


@settings(max_examples=150, deadline=None)
@given(
    numbers=st.lists(st.tuples(_DOUBLES, _DOUBLES, _DOUBLES, _DOUBLES, _DOUBLES), min_size=1, max_size=4),
    obs=st.binary(max_size=64),
    text=st.sampled_from(["", "\x7f\x7f", "SELECT 1", "\U0010ffff\x7f"]),
)
def test_encode_refuses_exactly_the_non_finite_doubles(
    numbers: list[tuple[float, float, float, float, float]], obs: bytes, text: str
) -> None:
    """The byte scan that skips the field-by-field check never lets a NaN or an infinity through."""
    steps = [
        Step(prompt=text, observation=obs, reward=r, log_prob=lp, value=v, advantage=a, reward_components={"aux": c})
        for r, lp, v, a, c in numbers
    ]
    traj = Trajectory(env_id=text, steps=steps)
    if all(math.isfinite(x) for row in numbers for x in row):
        assert decode(encode(traj)) == traj
    else:
        with pytest.raises(InvalidTrajectoryError, match="finite"):
            encode(traj)


def test_non_finite_found_past_many_lookalike_bytes() -> None:
    """Payloads full of 0x7F/0xFF bytes (float arrays, binary observations) fall back to the full check."""
    traj = sample_traj(3)
    traj.steps[0].observation = b"\x41\0\0\0\0\0\xf0\x7f" * 500  # a value-field tag and an infinity's bytes, as data
    traj.steps[1].embedding = float32_bytes(np.full(300, np.nan))
    assert decode(encode(traj)) == traj  # look-alikes in bytes fields are not numbers
    traj.steps[2].advantage = -math.inf
    with pytest.raises(InvalidTrajectoryError, match="step 2: advantage is -inf"):
        encode(traj)


def test_storage_errors_pickle_with_their_message() -> None:
    from agentrl_envs import AgentRLError
    from agentrl_envs.data import RecordNotFoundError

    for exc in (InvalidTrajectoryError("bad reward"), RecordNotFoundError("record 3 was evicted")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert isinstance(back, StorageError) and isinstance(back, AgentRLError)
    assert isinstance(RecordNotFoundError("x"), KeyError) and str(RecordNotFoundError("record 3")) == "record 3"


_ARRAY_FIELDS = ("embedding", "token_log_probs", "token_ids")


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.tuples(*(st.integers(0, 41) for _ in _ARRAY_FIELDS)), min_size=1, max_size=5),
    text=st.sampled_from(["", "R\x05Z\x06b\x07", "SELECT 1"]),  # text holding the array fields' tag bytes
)
def test_encode_refuses_exactly_the_partial_array_items(sizes: list[tuple[int, int, int]], text: str) -> None:
    """The one-parse array check (taken when the payload proves every number finite) agrees with the field-by-field one."""
    steps = [Step(prompt=text, reward=0.5, **{name: b"\x01" * size for name, size in zip(_ARRAY_FIELDS, row)}) for row in sizes]
    traj = Trajectory(env_id=text, steps=steps)
    bad = [(i, name, size) for i, row in enumerate(sizes) for name, size in zip(_ARRAY_FIELDS, row) if size % 4]
    assert codec._arrays_whole(traj.SerializeToString()) == (not bad)
    if not bad:
        assert decode(encode(traj)) == traj
    else:
        i, name, size = bad[0]
        with pytest.raises(InvalidTrajectoryError, match=rf"^step {i}: {name} is {size} bytes, not a whole number"):
            encode(traj)


def test_array_check_on_large_and_unknown_fields() -> None:
    traj = sample_traj(2)
    traj.steps[1].embedding = b"\0" * 1_000_001  # under the 1 MiB cap: the item size is what is wrong
    with pytest.raises(InvalidTrajectoryError, match=r"step 1: embedding is 1000001 bytes, not a whole number"):
        encode(traj)
    traj.steps[1].embedding = b"\0" * 1_000_000
    assert decode(encode(traj)) == traj
    # A step carrying a field this schema does not know (written by a newer one) is still checked, and kept.
    step = Step.FromString(Step(action="a").SerializeToString() + b"\xa2\x06\x03abc")  # field 100, 3 bytes
    traj = Trajectory(steps=[step])
    assert decode(encode(traj)) == traj
    traj.steps[0].token_ids = b"\0" * 5
    with pytest.raises(InvalidTrajectoryError, match="step 0: token_ids is 5 bytes"):
        encode(traj)


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xff" * 64, b"\x22\x03\x52\x01", b"\x22\x7f", bytes(range(256)), b"\x0b" * 100_000 + b"\x0c" * 100_000],
)
def test_array_check_answers_garbage_without_raising(payload: bytes) -> None:
    """The private check only ever says whether the one-parse proof held; encode never feeds it anything but its own bytes."""
    assert codec._arrays_whole(payload) is (payload == b"")
