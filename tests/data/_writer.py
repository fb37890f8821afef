"""A writer process for the crash tests: a small server that forks one buffer writer per command.

Run as ``python tests/data/_writer.py``. It imports agentrl once, prints ``ready``, then reads JSON
commands from stdin, one per line:

* ``{"path": ..., "log": ..., "phase": null | "payload" | ..., "on": 3, "count": 50, "durability": "process"}``:
  fork a child that opens the buffer, sets the crash hook, and appends ``make_traj(seq)`` for
  ``count`` appends (forever if null), writing ``"<seq> <first_seq> .\\n"`` to ``log`` after each
  append returns (so the log lists exactly the committed records). A kill can cut that write short
  (seen: ``5564 55`` of ``5564 5519 .``), so each line ends with ``.``, and a child first ends a
  line the previous child left cut, so that the cut part stays on a line of its own. Prints ``pid <pid>``.
* ``"wait"``: reap the child; prints ``status <exit code or -signal>``.

The test kills the child with SIGKILL from outside, or the crash hook kills it at a named phase.
Forking from a warm server keeps 200+ kills fast; each child is a fresh writer all the same.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script from anywhere: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from agentrl_envs.data import ReplayBuffer, Trajectory, encode, make_step
from agentrl_envs.data import replay as replay_module
from agentrl_envs.data._ring import span_of

MAX_OBS = 12_000


def make_traj(seq: int, max_obs: int = MAX_OBS) -> Trajectory:
    """The trajectory written as record ``seq``: content and size follow from ``seq`` alone."""
    rng = np.random.default_rng(seq)
    steps = []
    for i in range(int(rng.integers(1, 4))):
        size = int(rng.integers(0, max_obs // 3))
        steps.append(
            make_step(
                f"action {seq}.{i}",
                bytes(rng.integers(32, 127, size=size, dtype=np.uint8)),
                float(rng.normal()),
                {"task": float(seq), "aux": float(i)},
                log_prob=-float(i),
                embedding=rng.normal(size=int(rng.integers(0, 16))),
            )
        )
    return Trajectory(env_id="crash-test", task_id=f"task-{seq}", seed=seq, steps=steps)


def span(seq: int) -> int:
    """Bytes record ``seq`` takes in the ring."""
    return span_of(len(encode(make_traj(seq))))


def _child(cmd: dict) -> None:
    log = os.open(cmd["log"], os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    size = os.fstat(log).st_size
    if size and os.pread(log, 1, size - 1) != b"\n":  # the previous child was killed mid-line
        os.write(log, b"\n")
    replay_module.set_crash_hook(cmd.get("phase"), int(cmd.get("on", 1)))
    buf = ReplayBuffer.open(cmd["path"], durability=cmd.get("durability", "process"))
    count = cmd.get("count")
    done = 0
    while count is None or done < count:
        seq = buf.next_seq
        got = buf.append(make_traj(seq))
        assert got == seq
        os.write(log, f"{seq} {buf.first_seq} .\n".encode())
        done += 1
        if count is None and done >= 20_000:  # a safety net if nobody kills us
            break
    buf.close()


def main() -> None:
    print("ready", flush=True)
    child = None
    for line in sys.stdin:
        line = line.strip()
        if line == '"wait"':
            _, status = os.waitpid(child, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            print(f"status {code}", flush=True)
            continue
        cmd = json.loads(line)
        child = os.fork()
        if child == 0:
            code = 0
            try:
                _child(cmd)
            except BaseException as exc:  # report, then leave without running the server's cleanup
                print(f"child error: {exc!r}", file=sys.stderr, flush=True)
                code = 3
            os._exit(code)
        print(f"pid {child}", flush=True)


if __name__ == "__main__":
    main()
