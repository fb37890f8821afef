"""Files written by an earlier agentrl still read: a replay buffer and Arrow / Parquet shards, committed.

The fixtures in ``tests/data/fixtures/v1/`` were written by the code before the storage speed-up of
issue #16 (the ring format version 1, the shard schema as it was). The readers changed; these tests
pin that what the old writers produced comes back record for record. Regenerate them only when a
format version changes (and then keep the old ones too)::

    .venv/bin/python -m tests.data.test_compat tests/data/fixtures/vN
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from agentrl_envs.data import ReplayBuffer, Trajectory, make_step, read_columns, read_shards

FIXTURES = Path(__file__).parent / "fixtures" / "v1"


def expected_trajectories() -> list[Trajectory]:
    """What the fixtures hold: text-only and array steps, a non-UTF-8 observation, a missing seed, metadata."""
    out = []
    for t in range(5):
        steps = [
            make_step(
                f'<tool_call>{{"name": "sql", "arguments": {{"query": "SELECT {t} + {i}"}}}}</tool_call>',
                b"\xff\xfe not UTF-8" if (t, i) == (2, 1) else f"sql ok: {t * 10 + i} row(s)\nregion,total\nnorth,{i}",
                0.25 * i - t,
                {"task": float(i == 2), "aux": 0.125 * t},
                prompt=f"observation {t}.{i}: é ✓",
                log_prob=-0.5 - i,
                value=0.75 * t,
                advantage=0.1 * (i - t),
                embedding=np.arange(4) / (t + 1) if t % 2 else None,
                token_log_probs=[-0.25, -0.5] if t % 2 else None,
                token_ids=[t, i, 7] if t % 2 else None,
                terminated=i == 2,
                tool="sql" if i else "",
            )
            for i in range(1 + t % 3)
        ]
        traj = Trajectory(
            env_id="AgentRL/SQL-v0",
            task_id=f"SQL/retail/train/{t}",
            episode_id=f"ep-{t}",
            domain="retail",
            split="train",
            policy_id="fixture",
            created_unix_ns=1_700_000_000_000_000_000 + t,
            terminated=True,
            success=t % 2 == 0,
            metadata={"run": "fixture", "t": str(t)},
            steps=steps,
        )
        if t != 3:
            traj.seed = 100 + t
        out.append(traj)
    return out


def write_fixtures(directory: Path) -> None:
    """Write the fixtures with the code of this checkout (see the module docstring)."""
    from agentrl_envs.data import ShardWriter

    directory.mkdir(parents=True, exist_ok=True)
    trajs = expected_trajectories()
    ring = directory / "replay.ring"
    with ReplayBuffer.create(ring, capacity_bytes=64 << 10, overwrite=True) as buf:
        for traj in trajs:
            buf.append(traj)
    with open(directory / "replay.ring.gz", "wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as dst:
        dst.write(ring.read_bytes())
    ring.unlink()
    for fmt in ("arrow", "parquet"):
        target = directory / fmt
        shutil.rmtree(target, ignore_errors=True)
        with ShardWriter(target, format=fmt, batch_size=2) as writer:  # type: ignore[arg-type]
            writer.extend(trajs)


@pytest.fixture
def ring_file(tmp_path: Path) -> Path:
    path = tmp_path / "replay.ring"
    with gzip.open(FIXTURES / "replay.ring.gz", "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


@pytest.mark.parametrize("readonly", [True, False])
def test_old_replay_buffer_reads(ring_file: Path, readonly: bool) -> None:
    expected = expected_trajectories()
    with ReplayBuffer.open(ring_file, readonly=readonly) as buf:
        assert buf.seqs() == list(range(len(expected)))
        assert [buf.get(seq) for seq in buf.seqs()] == expected
        assert list(buf) == expected and buf.recovery.quarantined == 0 and not buf.recovery.torn_tail
        if not readonly:  # and the old file takes new records
            seq = buf.append(expected[0])
            assert buf.get(seq) == expected[0]


def test_ring_crc_matches_google_crc32c() -> None:
    """The ring's CRC32C (the crc32c package's hardware one when present) is google-crc32c's, seeded the same way:
    choosing the faster implementation never changes a file's checksums."""
    import google_crc32c

    from agentrl_envs.data import _ring

    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 28, 31, 4096, 17_701, 70_000):
        data = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        for seed in (0, 1, 0xDEADBEEF, 0xFFFF_FFFF):
            expected = google_crc32c.extend(seed, data)
            assert _ring.crc32c(data, seed) == expected == _ring.crc_extend(seed, data)
            assert _ring.crc32c(memoryview(data), seed) == expected
    assert _ring.CRC_IMPLEMENTATION


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_old_shards_read(fmt: str) -> None:
    expected = expected_trajectories()
    assert len(list((FIXTURES / fmt).iterdir())) == 1  # one file of three batches (batch_size=2)
    assert list(read_shards(FIXTURES / fmt)) == expected
    cols = read_columns(FIXTURES / fmt, ("reward", "advantage"))
    assert np.array_equal(cols["reward"], [s.reward for t in expected for s in t.steps])


if __name__ == "__main__":
    write_fixtures(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)
