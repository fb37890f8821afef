"""Storage benchmark: the replay buffer and Arrow shards against JSON-lines, measured in the same run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_storage.py           # full run (a few minutes)
    .venv/bin/python benchmarks/bench_storage.py --sections 12 --rounds 7   # the ratio sections only
    .venv/bin/python benchmarks/bench_storage.py --quick   # fewer trajectories, 100,000 appends for RSS
    .venv/bin/python benchmarks/bench_storage.py --sections 12 --clock cpu   # CPU time: steadier on a busy machine

Sections:

1. ``ReplayBuffer`` append + get against a JSON-lines buffer holding the same trajectories (one
   line per trajectory written through a buffered file, an in-memory (offset, length) index, one
   ``pread`` + parse per get), for text-only steps and for steps that also carry an embedding and
   per-token arrays; and the codec alone (``encode`` + ``decode``, no store), the most any store
   of protobuf records can do. Gets are in a random order, 64 at a time (like ``sample(64)``).
2. Reading shards against parsing JSONL: the flat reward / log-prob / advantage columns, and whole
   trajectories (the baseline parses each line and builds the same ``Trajectory`` messages).
3. RSS of a process appending 1,000,000 trajectories to a ring that wraps many times.

The JSON side uses orjson when it is installed, the stdlib's C ``json`` otherwise (the header says
which). Every round measures every store, so each round's ratios share one machine load; the tables
print medians over the rounds (``--rounds``, default 5) and the range of the per-round ratios. It
never asserts on time; the ``target`` column only says whether the design target (docs/design.md, "Speed
and scale targets") was met by the median ratio.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Allow ``python benchmarks/bench_storage.py`` from a checkout without installing the package.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from agentrl_envs.data import (  # noqa: E402
    ReplayBuffer,
    ShardWriter,
    Trajectory,
    decode,
    encode,
    make_step,
    read_columns,
    read_jsonl,
    read_shards,
    trajectory_to_dict,
    write_jsonl,
)
from agentrl_envs.data._ring import CRC_IMPLEMENTATION, span_of  # noqa: E402
from agentrl_envs.text.table import format_table  # noqa: E402

BATCH = 64
REPORTED = "the field report measured 1.2k (JSON-lines) and 4.7k samples/s (its faster loader)"


def make_trajectories(n: int, arrays: bool, seed: int = 0) -> list[Trajectory]:
    """Episodes shaped like the SQL -> Python -> SMTP tasks: 8 steps of tool-call text, as a policy logs them."""
    rng = np.random.default_rng(seed)
    words = np.array("select region total amount north south east west report email python sum csv row".split())
    out = []
    for i in range(n):
        steps = []
        for _ in range(8):
            observation = "\n".join(",".join(rng.choice(words, 6)) for _row in range(40))  # ~1.6 KB of CSV-like rows
            extra: dict[str, Any] = {}
            if arrays:
                extra = {
                    "embedding": rng.normal(size=256),
                    "token_log_probs": -rng.exponential(size=48),
                    "token_ids": rng.integers(0, 150_000, size=48),
                }
            steps.append(
                make_step(
                    '<tool_call>{"name": "sql", "arguments": {"query": "SELECT region, SUM(amount) FROM orders GROUP BY region"}}</tool_call>',
                    observation,
                    float(rng.normal()),
                    {"task": 0.0, "aux": 0.3, "fault": 0.0, "format": 0.0},
                    prompt=" ".join(rng.choice(words, 100)),
                    log_prob=float(-rng.exponential()),
                    value=float(rng.normal()),
                    advantage=float(rng.normal()),
                    tool="sql",
                    **extra,
                )
            )
        out.append(Trajectory(env_id="AgentRL/SQLPythonSMTP-v1", task_id=f"task-{i}", seed=i, steps=steps))
    return out


try:  # the fastest JSON codec installed is the baseline: orjson if it is there, else the stdlib's C one
    import orjson

    JSON_CODEC = f"orjson {orjson.__version__}"
    json_dumps: Callable[[Any], bytes] = orjson.dumps
    json_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:
    JSON_CODEC = "stdlib json (C accelerated; orjson is not installed)"

    def json_dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    json_loads = json.loads


class JsonLinesBuffer:
    """The baseline: trajectories as JSON lines in one file, an in-memory (offset, length) index, one ``pread`` per get."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w+b")
        self.fd = self.file.fileno()
        self.index: list[tuple[int, int]] = []
        self.end = 0
        self.unflushed = False

    def append(self, record: dict[str, Any]) -> int:
        line = json_dumps(record) + b"\n"
        self.file.write(line)
        self.index.append((self.end, len(line)))
        self.end += len(line)
        self.unflushed = True
        return len(self.index) - 1

    def get(self, index: int) -> dict[str, Any]:
        if self.unflushed:
            self.file.flush()
            self.unflushed = False
        offset, length = self.index[index]
        return json_loads(os.pread(self.fd, length, offset))

    def close(self) -> None:
        self.file.close()


def trajectory_from_json(d: dict[str, Any]) -> Trajectory:
    """A competent JSON-lines reader's message: the same fields as ``read_shards`` gives, built directly (no checks)."""
    traj = Trajectory(
        env_id=d["env_id"],
        task_id=d["task_id"],
        episode_id=d["episode_id"],
        domain=d["domain"],
        split=d["split"],
        policy_id=d["policy_id"],
        terminated=d["terminated"],
        truncated=d["truncated"],
        success=d["success"],
        created_unix_ns=d["created_unix_ns"],
        metadata=d["metadata"],
    )
    if d["seed"] is not None:
        traj.seed = d["seed"]
    add = traj.steps.add
    for s in d["steps"]:
        add(
            prompt=s["prompt"],
            action=s["action"],
            tool=s["tool"],
            observation=s["observation"].encode() if "observation" in s else base64.b64decode(s["observation_b64"]),
            observation_truncated=s["observation_truncated"],
            reward=s["reward"],
            log_prob=s["log_prob"],
            value=s["value"],
            advantage=s["advantage"],
            reward_components=s["reward_components"],
            embedding=np.asarray(s["embedding"], dtype="<f4").tobytes(),
            token_log_probs=np.asarray(s["token_log_probs"], dtype="<f4").tobytes(),
            token_ids=np.asarray(s["token_ids"], dtype="<i4").tobytes(),
            terminated=s["terminated"],
            truncated=s["truncated"],
        )
    return traj


CLOCK: Callable[[], float] = time.perf_counter  # --clock cpu: time.process_time (this process's CPU, all threads)


def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    start = CLOCK()
    fn()
    return CLOCK() - start


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], footer: Sequence[str] = ()) -> None:
    print("\n" + format_table(header, rows, align="l" + "r" * (len(header) - 1), title=title, footer=footer, boxed=True))
    sys.stdout.flush()


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "-"


def ratio_range(ratios: Sequence[float]) -> str:
    return f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})"


def target(ratios: Sequence[float]) -> str:
    return f">=10x {'ok' if statistics.median(ratios) >= 10 else 'MISSED'}"


# -- 1. append + get -----------------------------------------------------------------------------


def in_batches(get: Callable[[int], Any], keys: Sequence[int], size: int = BATCH) -> None:
    """Get ``keys`` a batch at a time, holding each batch until it is complete (what ``sample(64)`` returns)."""
    for i in range(0, len(keys), size):
        batch = [get(k) for k in keys[i : i + size]]
        del batch


def bench_buffer(tmp: Path, sizes: dict[bool, int], rounds: int) -> None:
    rows = []
    for arrays in (False, True):
        n = sizes[arrays]
        trajs = make_trajectories(n, arrays)
        dicts = [trajectory_to_dict(t) for t in trajs]
        order = np.random.default_rng(1).permutation(n).tolist()
        size = sum(span_of(len(encode(t))) for t in trajs)
        times: dict[str, list[tuple[float, float]]] = {"jsonl": [], "fresh": [], "steady": [], "codec": []}
        for r in range(rounds):  # each round measures every store, so each round's ratios share its machine load
            jbuf = JsonLinesBuffer(tmp / f"jsonl-{arrays}-{r}")
            t_append = timed(lambda jbuf=jbuf, dicts=dicts: [jbuf.append(d) for d in dicts])
            t_get = timed(lambda jbuf=jbuf, order=order: in_batches(jbuf.get, order))
            assert jbuf.get(order[0]) == dicts[order[0]]
            jbuf.close()
            (tmp / f"jsonl-{arrays}-{r}").unlink()
            times["jsonl"].append((t_append, t_get))
            path = tmp / f"ring-{arrays}-{r}"
            # Room for the n trajectories and a little more: the second pass wraps and evicts the first,
            # which is how a replay buffer spends its life (the first lap also pays first-touch page faults).
            with ReplayBuffer.create(path, capacity_bytes=size + size // 8) as buf:
                for lap in ("fresh", "steady"):
                    first = buf.next_seq
                    t_append = timed(lambda buf=buf, trajs=trajs: [buf.append(t) for t in trajs])
                    t_get = timed(lambda buf=buf, first=first, order=order: in_batches(lambda i: buf.get(first + i), order))
                    assert buf.get(first + order[0]) == trajs[order[0]]
                    times[lap].append((t_append, t_get))
            path.unlink()
            payloads = [encode(t) for t in trajs]  # the codec alone, no store: the most a protobuf record can do
            t_append = timed(lambda trajs=trajs: deque(map(encode, trajs), maxlen=0))  # each payload dropped, as a store would
            t_get = timed(lambda payloads=payloads, order=order: in_batches(lambda i: decode(payloads[i]), order))
            times["codec"].append((t_append, t_get))
            del payloads
        shape = "text+arrays" if arrays else "text"
        labels = {
            "jsonl": "JSON-lines buffer [baseline]",
            "fresh": "ReplayBuffer, first lap",
            "steady": "ReplayBuffer, full ring",
            "codec": "encode + decode alone, no store",
        }
        base = [a + g for a, g in times["jsonl"]]
        for name, label in labels.items():
            ratios = [b / (a + g) for b, (a, g) in zip(base, times[name])]
            a, g = (statistics.median(x) for x in zip(*times[name]))
            rows.append(
                (
                    f"{shape}: {label}",
                    rate(n, a),
                    rate(n, g),
                    rate(n, a + g),
                    ratio_range(ratios),
                    "" if name in ("jsonl", "codec") else target(ratios),
                )
            )
        print(f"  {shape}: {n} trajectories x 8 steps, {size / n / 1024:.1f} KiB each in the ring", flush=True)
    print_table(
        f"1. append + get, trajectories/s (medians of {rounds} rounds; ratio: median (min-max) of the per-round ratios)",
        ("store", "append/s", "get/s", "append+get/s", "vs JSON", "target"),
        rows,
        [
            REPORTED,
            f"JSON codec: {JSON_CODEC}; one JSON line per trajectory, read back with one pread",
            f"gets in a random order, {BATCH} at a time (like sample({BATCH})): a parsed Trajectory (ring) or dict (JSON),",
            "both verified against what was written; each round runs every store, so its ratios share one machine load",
            "first lap: a fresh file, whose pages the kernel allocates on first touch; full ring: the second pass,",
            "which evicts the first as it goes (a replay buffer's normal state)",
        ],
    )


# -- 2. shards vs JSONL --------------------------------------------------------------------------


def bench_shards(tmp: Path, n: int, rounds: int) -> None:
    trajs = make_trajectories(n, arrays=True, seed=2)
    steps = sum(len(t.steps) for t in trajs)
    jsonl = tmp / "t.jsonl"
    write_jsonl(jsonl, trajs)
    dirs = {}
    codecs = (
        ("arrow", "arrow", "mixed"),
        ("parquet", "parquet", "mixed"),
        ("parquet-zstd", "parquet", "zstd"),
        ("parquet-lz4", "parquet", "lz4"),
    )
    for name, fmt, codec in codecs:
        with ShardWriter(tmp / name, format=fmt, max_shard_bytes=64 << 20, compression=codec) as w:  # type: ignore[arg-type]
            w.extend(trajs)
        dirs[name] = tmp / name

    def jsonl_columns() -> dict[str, np.ndarray]:
        cols: dict[str, list[float]] = {"reward": [], "log_prob": [], "advantage": []}
        with open(jsonl, "rb") as f:
            for line in f:
                for step in json_loads(line)["steps"]:
                    for name, values in cols.items():
                        values.append(step[name])
        return {name: np.asarray(values) for name, values in cols.items()}

    def jsonl_dicts() -> list[Any]:
        with open(jsonl, "rb") as f:
            return [json_loads(line) for line in f]

    def jsonl_trajectories() -> list[Trajectory]:
        with open(jsonl, "rb") as f:
            return [trajectory_from_json(json_loads(line)) for line in f]

    cases: dict[str, dict[str, Callable[[], Any]]] = {
        "reward/log_prob/advantage columns": {
            "JSONL, parse, pick the columns [baseline]": jsonl_columns,
            "Arrow shards": lambda: read_columns(dirs["arrow"]),
            "Parquet shards (compression='mixed')": lambda: read_columns(dirs["parquet"]),
        },
        "whole trajectories": {
            "JSONL, parse, build Trajectory [baseline]": jsonl_trajectories,
            "JSONL, parse to dicts only": jsonl_dicts,
            "Arrow shards": lambda: list(read_shards(dirs["arrow"])),
            "Parquet shards (compression='mixed', the default)": lambda: list(read_shards(dirs["parquet"])),
            "Parquet shards, compression='zstd'": lambda: list(read_shards(dirs["parquet-zstd"])),
            "Parquet shards, compression='lz4'": lambda: list(read_shards(dirs["parquet-lz4"])),
        },
    }
    expected = np.asarray([s.reward for t in trajs for s in t.steps])
    assert np.array_equal(read_columns(dirs["arrow"])["reward"], expected) and np.array_equal(jsonl_columns()["reward"], expected)
    assert all(list(read_shards(d)) == trajs for d in dirs.values())
    assert jsonl_trajectories() == trajs
    rows = []
    for case, fns in cases.items():
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(timed(fn))
        base = next(v for k, v in times.items() if "[baseline]" in k)
        for name, seconds in times.items():
            ratios = [b / s for b, s in zip(base, seconds)]
            is_target = "[baseline]" not in name and "JSONL" not in name
            median = statistics.median(seconds)
            rows.append(
                (
                    f"{case}: {name}",
                    f"{median * 1e3:.1f}",
                    rate(steps, median),
                    ratio_range(ratios),
                    target(ratios) if is_target else "",
                )
            )
    t_checked = timed(lambda: list(read_jsonl(jsonl)))
    rows.append(
        (
            "whole trajectories: read_jsonl (checks depth, schema, caps), 1 round",
            f"{t_checked * 1e3:.1f}",
            rate(steps, t_checked),
            "",
            "",
        )
    )
    sizes = ", ".join(f"{k} {sum(p.stat().st_size for p in d.iterdir()) / 2**20:.1f} MiB" for k, d in dirs.items())
    print_table(
        f"2. reading {n} trajectories ({steps} steps) from shards vs JSONL (medians of {rounds} rounds)",
        ("read", "ms", "steps/s", "speed-up", "target"),
        rows,
        [
            f"on disk: JSONL {jsonl.stat().st_size / 2**20:.1f} MiB, {sizes}; JSON codec: {JSON_CODEC}",
            "every reader's output is checked against the trajectories written; the baseline builds the same messages",
            "mixed: lz4 on the step text, no codec on the float32 arrays, zstd on the rest; Parquet pages carry checksums",
            "that read_shards verifies",
        ],
    )


# -- 3. RSS over 1,000,000 appends ---------------------------------------------------------------


def rss_mib() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


def bench_rss(tmp: Path, appends: int, capacity: int) -> None:
    if not os.path.exists("/proc/self/status"):
        print("\n3. RSS: skipped (no /proc on this platform)")
        return
    trajs = [
        Trajectory(
            env_id="AgentRL/SQL-v0", task_id=f"t{i}", steps=[make_step("a" * 80, "o" * (100 + 37 * i), 0.5, {"task": 0.5})]
        )
        for i in range(16)
    ]
    resident = capacity // 4
    rows = []
    checkpoints = {appends * k // 10 for k in range(1, 11)}
    start = time.perf_counter()
    with ReplayBuffer.create(tmp / "rss.ring", capacity_bytes=capacity, max_resident_bytes=resident) as buf:
        gc.collect()
        base = rss_mib()
        rows.append(("0", "0", f"{base['VmRSS']:.1f}", f"{base['RssAnon']:.1f}", f"{base['RssFile']:.1f}"))
        first_lap_at = None
        for i in range(1, appends + 1):
            buf.append(trajs[i & 15])
            if first_lap_at is None and buf.first_seq:
                first_lap_at = i
            if i in checkpoints:
                now = rss_mib()
                laps = (buf.next_seq * buf.used_bytes / max(1, len(buf))) / capacity
                rows.append((f"{i:,}", f"{laps:.1f}", f"{now['VmRSS']:.1f}", f"{now['RssAnon']:.1f}", f"{now['RssFile']:.1f}"))
        elapsed = time.perf_counter() - start
        len_live = len(buf)
    vm = [float(r[2]) for r in rows[1:]]
    lap_row = next((k for k, row in enumerate(rows[1:]) if first_lap_at and int(row[0].replace(",", "")) >= first_lap_at), 0)
    print_table(
        f"3. RSS while appending {appends:,} trajectories to a {capacity >> 20} MiB ring, max_resident_bytes={resident >> 20} MiB (MiB)",
        ("appends", "ring laps", "VmRSS", "RssAnon", "RssFile"),
        rows,
        [
            f"{appends / elapsed:,.0f} appends/s; first eviction at append {first_lap_at:,}"
            if first_lap_at
            else "the ring never filled",
            f"VmRSS from the first eviction on: {vm[-1] - vm[lap_row]:+.1f} MiB; over the second half of the appends: "
            f"{vm[-1] - vm[len(vm) // 2 - 1]:+.1f} MiB (target: flat) {'ok' if abs(vm[-1] - vm[len(vm) // 2 - 1]) < 4 else 'MISSED'}",
            "RssFile: ring pages this process has mapped; pages more than max_resident_bytes behind the write",
            "position go back to the kernel (MADV_DONTNEED). RssAnon grows until the ring is full: the index",
            f"holds one entry per live record ({len_live:,} at the end, about 270 bytes each)",
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trajectories and 100,000 appends for the RSS check")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per section; ratios are medians over them (default 5)")
    parser.add_argument("--sections", default="123", help="which sections to run, e.g. 12 (default 123)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time (default); cpu: this process's CPU time, steadier on a machine shared with other jobs "
        "(it leaves out time spent waiting for a core; Parquet's reader threads are summed)",
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    import google.protobuf
    import pyarrow

    print("agentrl storage benchmark" + (" (--quick)" if args.quick else "") + f"; clock: {args.clock}")
    print(f"python {platform.python_version()} on {platform.platform()}; cpus {os.cpu_count()}")
    print(f"protobuf {google.protobuf.__version__}; pyarrow {pyarrow.__version__}; numpy {np.__version__}; JSON: {JSON_CODEC}")
    print(f"ring CRC32C: {CRC_IMPLEMENTATION}")
    if hasattr(os, "getloadavg"):
        print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        if "1" in args.sections:
            bench_buffer(Path(tmp), {False: 500, True: 200} if args.quick else {False: 2000, True: 1000}, args.rounds)
        if "2" in args.sections:
            bench_shards(Path(tmp), 200 if args.quick else 1000, args.rounds)
        if "3" in args.sections:
            bench_rss(Path(tmp), 100_000 if args.quick else 1_000_000, (8 if args.quick else 64) << 20)
    print(f"\ntotal benchmark time: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
