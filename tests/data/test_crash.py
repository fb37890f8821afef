"""Crash safety of the replay buffer: a writer killed at every write phase, and by 200+ random kill -9s.

After each kill the buffer is reopened and checked: every live record decodes to exactly what was
written (0 torn), the live seqs are contiguous, and every committed record (its ``append``
returned, so the writer logged it) is present unless the append in flight evicted it to make room.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl_envs.data import RecordNotFoundError, ReplayBuffer
from agentrl_envs.data.replay import CRASH_PHASES
from tests.data._writer import MAX_OBS, make_traj, span
from tests.procs import alive

WRITER = Path(__file__).with_name("_writer.py")
MAX_SPAN = 32 + MAX_OBS + 4096  # a generous bound on one record's span in these tests
WRAP_APPENDS = 3_000  # ~140 laps of a 96 KiB ring; about 1.5 s of appends on an idle core


class WriterServer:
    """Drives tests/data/_writer.py: fork a writer child, kill it, reap it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._read() == "ready"

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the writer server died (exit {self.proc.poll()})")
        return line

    def start(self, **cmd: object) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        word, pid = self._read().split()
        assert word == "pid"
        return int(pid)

    def wait(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write('"wait"\n')
        word, code = self._read().split()
        assert word == "status"
        return int(code)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server() -> Iterator[WriterServer]:
    srv = WriterServer()
    yield srv
    srv.close()


def committed(log: Path) -> list[tuple[int, int]]:
    """(seq, first live seq) after each append that returned; a line a kill cut short is ignored.

    A complete line is ``<seq> <first_seq> .``; a cut one lacks the ``.`` (the writer starts each
    child's lines on a new line, so a cut line never runs into the next).
    """
    if not log.exists():
        return []
    lines = log.read_text().split("\n")[:-1]  # the part after the last newline is unfinished
    fields = (line.split() for line in lines)
    return [(int(f[0]), int(f[1])) for f in fields if len(f) == 3 and f[2] == "."]


def check(path: Path, log: Path, top: int = -1) -> int:
    """Reopen read-only and check the guarantees; returns the newest live seq (``top`` for the next call).

    A record can be published (its header written) and the writer killed before ``append``
    returned: it is kept, complete, without being in the log. So the newest live seq may pass the
    last logged one by one per kill; ``top`` is the newest live seq the previous check saw.
    """
    history = committed(log)
    with ReplayBuffer.open(path, readonly=True) as buf:
        assert buf.recovery.quarantined == 0, buf.recovery
        live = buf.seqs()
        if live:
            assert live == list(range(live[0], live[-1] + 1)), "live seqs must be contiguous"
        for seq in live:  # 0 torn: every record returned is exactly the one written
            assert buf.get(seq) == make_traj(seq), f"record {seq} differs from what was written"
    if history:
        last_seq, last_head = history[-1]
        assert live, "committed records vanished"
        assert last_seq <= live[-1] <= max(last_seq, top) + 1, (live[-1], last_seq, top)
        present = set(live)
        lost = [seq for seq in range(last_head, last_seq + 1) if seq not in present]
        # Only appends that did not return may have evicted committed records: the oldest ones, and no
        # more than each needed (its own span, the end region it skipped at a wrap, one partly covered record).
        assert lost == list(range(last_head, last_head + len(lost))), f"lost {lost} is not the oldest"
        budget = sum(2 * span(s) + MAX_SPAN for s in range(last_seq + 1, live[-1] + 2))
        assert sum(span(s) for s in lost) <= budget, f"lost too much: {lost}"
    return live[-1] if live else top


def test_kill_at_every_write_phase(server: WriterServer, tmp_path: Path) -> None:
    for phase in CRASH_PHASES:
        for scenario, capacity, on in (("fresh", 4 << 20, 4), ("wrapping", 64 << 10, 7)):
            path = tmp_path / f"{phase}-{scenario}.ring"
            ReplayBuffer.create(path, capacity_bytes=capacity).close()
            log = tmp_path / f"{phase}-{scenario}.log"
            if scenario == "wrapping":  # fill the ring several times over first
                server.start(path=str(path), log=str(log), phase=None, count=60)
                assert server.wait() == 0
            server.start(path=str(path), log=str(log), phase=phase, on=on, count=40)
            status = server.wait()
            if phase == "evict_one" and scenario == "fresh":
                assert status == 0  # nothing to evict in a fresh ring, so the hook never fires
            else:
                assert status == -signal.SIGKILL, f"{phase}/{scenario}: the crash hook did not fire"
            check(path, log)
            assert len(committed(log)) >= on - 1
            # The buffer keeps working after recovery, and a clean close leaves nothing torn.
            server.start(path=str(path), log=str(log), phase=None, count=10)
            assert server.wait() == 0
            check(path, log)
            with ReplayBuffer.open(path) as buf:
                assert not buf.recovery.torn_tail and buf.recovery.quarantined == 0


@pytest.mark.parametrize("durability", ["process", "fsync"])
def test_random_kill9(server: WriterServer, tmp_path: Path, durability: str) -> None:
    """Random SIGKILLs of a writer process; process durability gets 200 kills, fsync 40."""
    rounds, window = (200, 0.025) if durability == "process" else (40, 0.08)  # fsync appends wait for the disk
    rng = random.Random(20261107 + rounds)
    path = tmp_path / "ring"
    log = tmp_path / "log"
    ReplayBuffer.create(path, capacity_bytes=192 << 10).close()
    kills = 0
    top = -1
    for _ in range(rounds):
        pid = server.start(path=str(path), log=str(log), phase=None, count=None, durability=durability)
        time.sleep(rng.uniform(0.0, window))
        os.kill(pid, signal.SIGKILL)
        kills += server.wait() == -signal.SIGKILL
        top = check(path, log, top)
    assert kills >= rounds - 2, "the writer should still be running when killed"
    appended = len(committed(log))
    assert appended >= rounds // 2, "the writers should have committed records between kills"


def test_a_log_line_cut_by_a_kill_is_not_read_as_a_commit(server: WriterServer, tmp_path: Path) -> None:
    """A kill can cut the writer's log line (``5564 55`` of ``5564 5519 .``): the next child's lines do not run into it."""
    path, log = tmp_path / "ring", tmp_path / "log"
    ReplayBuffer.create(path, capacity_bytes=1 << 20).close()
    log.write_text("0 0 .\n1 0 .\n2 0")  # the third line was cut
    server.start(path=str(path), log=str(log), phase=None, count=3)
    assert server.wait() == 0
    assert log.read_text().split("\n")[2] == "2 0"  # the cut line stays on its own line ...
    assert committed(log) == [(0, 0), (1, 0), (0, 0), (1, 0), (2, 0)]  # ... and is not read as a commit


def test_reader_races_a_wrapping_writer(server: WriterServer, tmp_path: Path) -> None:
    """A reader in this process follows a writer process through WRAP_APPENDS appends (~140 laps of the ring).

    The work is a count, not a time: the reader reads while the writer is alive, then once more.
    """
    path, log = tmp_path / "ring", tmp_path / "log"
    ReplayBuffer.create(path, capacity_bytes=96 << 10).close()
    pid = server.start(path=str(path), log=str(log), phase=None, count=WRAP_APPENDS)
    rng = random.Random(7)
    read = evicted = 0
    try:
        with ReplayBuffer.open(path, readonly=True) as reader:  # the open's scan races the writer too
            writing = True
            while writing:
                writing = alive(pid)  # a zombie counts as done: the server reaps it in wait()
                live = reader.seqs()
                for seq in [live[0], live[-1], rng.choice(live)] if live else []:  # the oldest is being overwritten
                    try:
                        assert reader.get(seq) == make_traj(seq)
                        read += 1
                    except RecordNotFoundError:
                        evicted += 1
            final = reader.seqs()
            assert final[-1] == WRAP_APPENDS - 1, (final, read, evicted)
            assert all(reader.get(seq) == make_traj(seq) for seq in final)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        status = server.wait()
    assert status == 0 and len(committed(log)) == WRAP_APPENDS, (status, read, evicted)
