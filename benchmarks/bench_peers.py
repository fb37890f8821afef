"""agentrl side by side with two peer suites, skyrl-gym 0.4.0 and gem-llm 0.1.0, in one interleaved run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_peers.py           # ~2-4 minutes after the first install
    .venv/bin/python benchmarks/bench_peers.py --quick   # fewer rounds

The peers are installed from the package index into the benchmark's own virtual environment
(``~/.cache/agentrl/bench-peers-venv``, or ``--venv``), never into agentrl's; if that fails the
peer rows are skipped with the reason and the agentrl and raw rows still print. The peer work runs
in one worker process of that venv, driven over a pipe; every round times a batch of each variant
in turn (agentrl, skyrl-gym, gem, the raw baseline), alternating the order, so machine load hits
them alike. It prints p50s and ratios and asserts nothing.

The same work through each suite:

- reset: agentrl ``env.reset(seed)`` of every env id (seeds seen before: the task cache), against
  each peer's make + init (skyrl-gym ``make("text2sql")`` + ``init``, gem
  ``make("game:GuessTheNumber-v0-easy")`` + ``reset``) and the raw private database copy
  (``sqlite3.deserialize``). Target: agentrl <= the lighter peer.
- SQL point lookup (``WHERE id = 17`` on a 600-row table) and a 10,000-row aggregate: agentrl
  ``env.step`` on AgentRL/SQL-v0 and skyrl-gym's text2sql ``env.step("<sql>...</sql>")`` on the
  same data, against raw ``sqlite3`` execute + fetchall. Targets: +0.3 ms; 1.2x. gem has no SQL tool.
- Python ``print(1)``: agentrl ``env.step`` on AgentRL/Python-v0 (the sandbox, every isolation layer
  on), skyrl-gym's ``PythonCodeExecutorToolGroup`` and gem's ``PythonCodeTool`` (both an unsandboxed
  ``python -c``), against a cold ``python -I -S -c``. Targets: 0.35x and 300 runs/s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import gymnasium as gym  # noqa: E402

import agentrl_envs  # noqa: E402
from agentrl_envs.core.actions import format_call  # noqa: E402
from benchmarks.bench_env import AGG_QUERY, agg_tables, env_step_on, ms, p50, print_table  # noqa: E402
from simulators.sql import build_database  # noqa: E402

PEERS = ("skyrl-gym==0.4.0", "gem-llm==0.1.0")
DEFAULT_VENV = Path.home() / ".cache" / "agentrl" / "bench-peers-venv"
POINT_QUERY = "SELECT * FROM {fact} WHERE id = 17"

# The peer worker: runs in the peers' venv, reads one JSON command per line, answers one JSON line.
WORKER = r"""
import json, os, sys, time, types, warnings
warnings.simplefilter("ignore")
fns, errors = {}, {}

def setup(cmd):
    root, db_id = cmd["root"], "bench"
    try:
        import skyrl_gym
        from skyrl_gym.tools.python import PythonCodeExecutorToolGroup
        cfg = types.SimpleNamespace(db_path=root)
        def make_sql(db):
            extras = {"db_id": db, "reward_spec": {"ground_truth": "SELECT 1"}, "data": "synsql", "max_turns": 10**9}
            env = skyrl_gym.make("text2sql", env_config=cfg, extras=extras)
            env.init([{"role": "user", "content": "question"}])
            return env
        point, agg = make_sql("point"), make_sql("agg")
        point_action, agg_action = "<sql>" + cmd["point_query"] + "</sql>", "<sql>" + cmd["agg_query"] + "</sql>"
        out = point.step(point_action)
        assert "Error" not in str(out["observations"]), out
        group = PythonCodeExecutorToolGroup()
        run = getattr(group, "execute_tool", None)
        py = (lambda: run("python", "print(1)")) if run else (lambda: group.python("print(1)"))
        assert "1" in str(py()), py()
        fns["skyrl-gym make+init"] = lambda: make_sql("point")
        fns["skyrl-gym sql point"] = lambda: point.step(point_action)
        fns["skyrl-gym sql aggregate"] = lambda: agg.step(agg_action)
        fns["skyrl-gym python"] = py
    except Exception as exc:
        errors["skyrl-gym"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        import gem
        from gem.tools.python_code_tool import PythonCodeTool
        seeds = iter(range(10**9))
        def make_init():
            env = gem.make("game:GuessTheNumber-v0-easy")  # gem 0.1.0 ids carry a difficulty
            env.reset(seed=next(seeds))
            return env
        make_init()
        tool = PythonCodeTool(timeout=5)
        out = tool.execute_action("<python>print(1)</python>")
        assert "1" in str(out), out
        fns["gem make+init"] = make_init
        fns["gem python"] = lambda: tool.execute_action("<python>print(1)</python>")
    except Exception as exc:
        errors["gem"] = f"{type(exc).__name__}: {exc}"[:300]
    return {"ok": True, "fns": sorted(fns), "errors": errors}

def timed(cmd):
    fn, out = fns[cmd["name"]], []
    clock = time.perf_counter
    for _ in range(cmd["n"]):
        t0 = clock(); fn(); out.append(clock() - t0)
    return {"ok": True, "samples": out}

for line in sys.stdin:
    cmd = json.loads(line)
    try:
        reply = setup(cmd) if cmd["op"] == "setup" else timed(cmd)
    except Exception as exc:
        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write(json.dumps(reply) + "\n"); sys.stdout.flush()
"""


def ensure_peers(venv: Path) -> tuple[Path | None, str]:
    """The peers' venv python, installing the pinned peers on first use; (None, why) on failure."""
    python = venv / "bin" / "python"
    stamp = venv / ".bench-peers-installed"
    if python.exists() and stamp.exists() and stamp.read_text() == " ".join(PEERS):
        return python, "cached"
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        print(f"installing {' '.join(PEERS)} into {venv} (first run only; a few minutes)...", flush=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *PEERS], capture_output=True, text=True, timeout=1800
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not create the peers' venv at {venv}: {exc}"
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if "ignored: it is neither" not in line][-3:]
        return None, f"pip install {' '.join(PEERS)} failed (exit {done.returncode}): {' | '.join(tail)}"
    stamp.write_text(" ".join(PEERS))
    return python, "installed now"


class PeerWorker:
    """The worker process in the peers' venv; ``time(name, n)`` runs a prepared variant n times."""

    def __init__(self, python: Path, root: str, point_query: str) -> None:
        env = dict(os.environ, PATH=f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}")  # `python` = that venv
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            [str(python), "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=root,
            env=env,
        )
        reply = self._ask({"op": "setup", "root": root, "point_query": point_query, "agg_query": AGG_QUERY})
        self.names: list[str] = reply.get("fns", [])
        self.errors: dict[str, str] = reply.get("errors", {})

    def _ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the peer worker exited")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error", "peer worker error"))
        return reply

    def time(self, name: str, n: int) -> list[float]:
        return list(self._ask({"op": "time", "name": name, "n": n})["samples"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def local_timer(fn: Callable[[], Any]) -> Callable[[int], list[float]]:
    def run(n: int) -> list[float]:
        out, clock = [], time.perf_counter
        for _ in range(n):
            t0 = clock()
            fn()
            out.append(clock() - t0)
        return out

    return run


def peer_timer(peer: PeerWorker, name: str) -> Callable[[int], list[float]]:
    return lambda n: peer.time(name, n)


def make_env(env_id: str, **kwargs: Any) -> gym.Env[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gym.make(env_id, **kwargs)


def sqlite_file(path: Path, image: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    mem = sqlite3.connect(":memory:")
    mem.deserialize(image)
    disk = sqlite3.connect(path)
    mem.backup(disk)
    disk.close()
    mem.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the peers' virtual environment")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers (agentrl and raw rows only)")
    args = parser.parse_args(argv)
    rounds, batch = (6, 10) if args.quick else (20, 20)
    print(f"agentrl vs peers: python {platform.python_version()}, {os.cpu_count()} cpus; {rounds} rounds x {batch} calls")
    if hasattr(os, "getloadavg"):
        print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))

    tmp = tempfile.TemporaryDirectory(prefix="agentrl-bench-peers-")
    root = Path(tmp.name)
    timers: dict[str, Callable[[int], list[float]]] = {}
    closers: list[Callable[[], None]] = []
    notes: list[str] = []
    try:
        # -- agentrl and raw baselines --------------------------------------------------------------
        for env_id in agentrl_envs.ENV_IDS:
            env = make_env(env_id)
            closers.append(env.close)
            for s in range(50):  # every seed the timed loop uses, generated once (the task cache)
                env.reset(seed=s)
            seeds = iter(range(10**9))
            timers[f"agentrl reset {env_id.split('/')[1]}"] = local_timer(
                lambda env=env, seeds=seeds: env.reset(seed=next(seeds) % 50)
            )

        sql_env = make_env("AgentRL/SQL-v0", max_steps=10**9)
        closers.append(sql_env.close)
        sql_env.reset(seed=0)
        task: Any = sql_env.unwrapped.task
        fact = next(
            name for name in task.data.tables if name not in ("staff",) and "id" in dict(task.data.tables[name]["columns"])
        )
        point_query = POINT_QUERY.format(fact=fact)
        point_image = build_database(task.data.tables)
        point_raw = sqlite3.connect(":memory:")
        point_raw.deserialize(point_image)
        point_action = format_call("sql", {"query": point_query})
        _, _, _, _, info = sql_env.step(point_action)
        if info["tool_result"].get("row_count") != 1:
            notes.append(f"agentrl point lookup returned {info['tool_result']}")
        timers["raw sqlite3 point"] = local_timer(lambda: point_raw.execute(point_query).fetchall())
        timers["agentrl sql point"] = local_timer(lambda: sql_env.step(point_action))

        agg_image = build_database(agg_tables())
        agg_raw = sqlite3.connect(":memory:")
        agg_raw.deserialize(agg_image)
        expected = agg_raw.execute(AGG_QUERY).fetchall()
        agg_env = make_env("AgentRL/SQL-v0", max_steps=10**9)
        closers.append(agg_env.close)
        timers["raw sqlite3 aggregate"] = local_timer(lambda: agg_raw.execute(AGG_QUERY).fetchall())
        timers["agentrl sql aggregate"] = local_timer(env_step_on(agg_env, agg_image, AGG_QUERY, expected))

        copy_raw = sqlite3.connect(":memory:")
        timers["raw private database copy"] = local_timer(lambda: copy_raw.deserialize(point_image))

        py_env = make_env("AgentRL/Python-v0", max_steps=10**9)
        closers.append(py_env.close)
        py_env.reset(seed=0)
        py_action = format_call("python", {"code": "print(1)"})
        _, _, _, _, info = py_env.step(py_action)
        tier = py_env.unwrapped._sandbox_tier
        if info["tool_result"].get("stdout", "").strip() != "1":
            notes.append(f"agentrl python step: {info['tool_result']}")
        cold = [sys.executable, "-I", "-S", "-c", "print(1)"]
        timers["cold python -I -S -c"] = local_timer(lambda: subprocess.run(cold, capture_output=True, check=False))
        timers["agentrl python"] = local_timer(lambda: py_env.step(py_action))

        # -- peers ----------------------------------------------------------------------------------
        peer: PeerWorker | None = None
        if args.no_peers:
            notes.append("peers skipped (--no-peers)")
        else:
            python, how = ensure_peers(args.venv)
            if python is None:
                notes.append(f"peers skipped: {how}")
            else:
                for name, image in (("point", point_image), ("agg", agg_image)):
                    sqlite_file(root / "SynSQL-2.5M" / "databases" / name / f"{name}.sqlite", image)
                try:
                    peer = PeerWorker(python, str(root), point_query)
                    closers.append(peer.close)
                    notes += [f"peer {k} skipped: {v}" for k, v in peer.errors.items()]
                    for name in peer.names:
                        timers[name] = peer_timer(peer, name)
                    notes.append(f"peers from {args.venv} ({how})")
                except Exception as exc:
                    notes.append(f"peers skipped: the worker failed: {type(exc).__name__}: {exc}")

        # -- interleaved rounds ---------------------------------------------------------------------
        samples: dict[str, list[float]] = {name: [] for name in timers}
        names = list(timers)
        rng = random.Random(0)
        for name in names:  # warm-up batch
            timers[name](max(2, batch // 5))
        gc.collect()
        start = time.perf_counter()
        for _ in range(rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                n = batch if "python" not in name else max(3, batch // 2)
                samples[name] += timers[name](n)
        elapsed = time.perf_counter() - start
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception:
                pass
        tmp.cleanup()

    def mid(name: str) -> float:
        return p50(samples[name]) if samples.get(name) else float("nan")

    def row(name: str, base: str | None, kind: str = "x") -> tuple[str, ...]:
        if name not in samples:
            return (name, "0", "-", "-", "-")
        m = mid(name)
        vs = "-" if base is None else (f"{m / mid(base):.2f}x" if kind == "x" else f"+{ms(m - mid(base))} ms")
        return (name, str(len(samples[name])), ms(m), vs, f"{1 / m:.0f}/s" if "python" in name else "")

    header = ("variant", "n", "p50 ms", "vs baseline", "runs/s")
    peers_reset = [n for n in ("skyrl-gym make+init", "gem make+init") if n in samples]
    light = min(peers_reset, key=mid) if peers_reset else None
    reset_rows = [row(n, light) for n in samples if n.startswith("agentrl reset")]
    reset_rows += [row(n, light) for n in peers_reset] + [row("raw private database copy", light)]
    target = [f"baseline: the lighter peer's make+init ({light}); target: every agentrl reset <= 1.00x"] if light else []
    print_table("reset", header, reset_rows, target)
    print_table(
        "SQL point lookup (" + point_query + ")",
        header,
        [
            row("raw sqlite3 point", None),
            row("agentrl sql point", "raw sqlite3 point", "+"),
            row("skyrl-gym sql point", "raw sqlite3 point", "+"),
        ],
        ["target: agentrl <= +0.3 ms over raw sqlite3"],
    )
    print_table(
        f"SQL aggregate over 10,000 rows ({len(expected)} result rows)",
        header,
        [
            row("raw sqlite3 aggregate", None),
            row("agentrl sql aggregate", "raw sqlite3 aggregate"),
            row("skyrl-gym sql aggregate", "raw sqlite3 aggregate"),
        ],
        ["target: agentrl <= 1.2x raw sqlite3"],
    )
    print_table(
        "Python print(1)",
        header,
        [
            row("cold python -I -S -c", None),
            row("agentrl python", "cold python -I -S -c"),
            row("skyrl-gym python", "cold python -I -S -c"),
            row("gem python", "cold python -I -S -c"),
        ],
        [
            f"agentrl runs in its sandbox (tier {tier}); the peers run an unsandboxed `python -c`",
            "target: agentrl <= 0.35x a cold interpreter and >= 300 runs/s",
        ],
    )
    print(f"\ninterleaved rounds took {elapsed:.1f} s")
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
