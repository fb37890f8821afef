"""Latency benchmark of the agentrl envs against raw baselines measured in the same run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_env.py           # full run (~1 minute)
    .venv/bin/python benchmarks/bench_env.py --quick   # repetitions divided by 5

It prints tables of p50/p99 latencies and their RATIOS against a baseline measured in the same
process (raw ``sqlite3``, a cold ``subprocess.run``, building the ``EmailMessage`` directly, task
generation alone). Absolute numbers depend on the machine; the ratios and the "added ms" are what
to compare across runs. It never asserts on time: the ``target`` column only says whether the
design target was met in this run, and the script exits 0 unless it crashes.

Sections:

1a. SQL aggregate over a 10,000-row table: ``SimBackend.handle`` and ``env.step`` vs raw sqlite3
    (target <= 1.2x).
1b. SQL point lookup through the whole env (``env.step`` on AgentRL/SQL-v0) vs raw sqlite3
    (target <= 0.3 ms added).
2.  ``env.reset(seed=i)``: a seed seen before (target <= 0.25 ms, the light peer's make+init),
    after an episode that made a call, and a new seed (the task generated).
3.  Python step vs a cold ``subprocess.run([python, -I, -S, -c, ...])``.
4.  SMTP step vs building the same ``EmailMessage`` and ``as_bytes()``.
5.  Whole oracle episodes per env id.
6.  ``make`` + ``reset`` + ``close`` of each env id in a fresh process, and the child processes it
    started (the Python sandbox's, for the envs with the python tool).

Rows marked "(layer)" are attribution rows: the same call one layer down the stack, so the table
shows where the added time goes (SQL engine, in-process HTTP, env core). They reach into private
attributes and are skipped, with a note, if those change.
"""

from __future__ import annotations

import argparse
import email.policy
import gc
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from email.message import EmailMessage
from pathlib import Path
from typing import Any

# Allow ``python benchmarks/bench_env.py`` from a checkout without installing the package.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import gymnasium as gym  # noqa: E402
from gymnasium.utils import seeding  # noqa: E402

import agentrl_envs  # noqa: E402
from agentrl_envs.backends import DatabaseSpec, EpisodeSetup, ToolRequest  # noqa: E402
from agentrl_envs.backends.sim import SimBackend  # noqa: E402
from agentrl_envs.core.actions import format_call  # noqa: E402
from agentrl_envs.tasks.domains import DOMAINS  # noqa: E402
from agentrl_envs.text.table import format_table  # noqa: E402
from simulators.app import template_fingerprint  # noqa: E402
from simulators.sql import ReadOnlyDatabase, build_database  # noqa: E402

ENV_IDS = tuple(agentrl_envs.ENV_IDS)
BIG_MAX_STEPS = 10**9  # repeated steps in one episode must never truncate it
_NOTES: list[str] = []

# -- measurement helpers -------------------------------------------------------------------------


def measure(fns: dict[str, Callable[[], Any]], n: int, warmup: int) -> dict[str, list[float]]:
    """Time each function ``n`` times (seconds), interleaved so drift hits every variant alike.

    The order alternates between repetitions so no variant always runs right after another.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    clock = time.perf_counter
    for i in range(n):
        for name in names if i % 2 == 0 else reversed(names):
            fn = fns[name]
            t0 = clock()
            fn()
            samples[name].append(clock() - t0)
    return samples


def pct(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation."""
    xs = sorted(samples)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def p50(samples: Sequence[float]) -> float:
    return pct(samples, 0.5)


def ms(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "-"
    value = seconds * 1e3
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def verdict(ok: bool, target: str) -> str:
    return f"{target} {'ok' if ok else 'MISSED'}"


def check(ok: bool, what: str) -> None:
    """A correctness check of the benchmark's own calls (a wrong result makes a timing meaningless)."""
    if not ok:
        _NOTES.append(f"CHECK FAILED: {what}")
        print(f"  !! CHECK FAILED: {what}", flush=True)


def optional(what: str, build: Callable[[], Callable[[], Any]]) -> Callable[[], Any] | None:
    """Build an attribution-row function that reaches into internals; None (with a note) if it fails."""
    try:
        return build()
    except Exception as exc:  # attribution rows are best effort
        _NOTES.append(f"skipped attribution row {what!r}: {type(exc).__name__}: {exc}")
        return None


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], footer: Sequence[str] = ()) -> None:
    print("\n" + format_table(header, rows, align="l" + "r" * (len(header) - 1), title=title, footer=footer, boxed=True))
    sys.stdout.flush()


LATENCY_HEADER = ("path", "n", "p50 ms", "p99 ms", "vs base", "added ms", "target")


def latency_rows(samples: dict[str, list[float]], base: str, targets: dict[str, str] | None = None) -> list[tuple[str, ...]]:
    base_p50 = p50(samples[base])
    rows = []
    for name, xs in samples.items():
        mid = p50(xs)
        is_base = name == base
        rows.append(
            (
                name + (" [baseline]" if is_base else ""),
                str(len(xs)),
                ms(mid),
                ms(pct(xs, 0.99)),
                "1.00x" if is_base else ratio(mid, base_p50),
                "-" if is_base else ms(mid - base_p50),
                (targets or {}).get(name, ""),
            )
        )
    return rows


def make_env(env_id: str, **kwargs: Any) -> gym.Env[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gym.make(env_id, **kwargs)


# -- 1a. SQL aggregate over 10k rows -------------------------------------------------------------

AGG_ROWS = 10_000
AGG_QUERY = (
    "SELECT region, category, COUNT(*) AS n, ROUND(SUM(amount), 2) AS total, AVG(quantity) AS avg_qty "
    "FROM events WHERE day >= '2025-03-01' GROUP BY region, category ORDER BY region, category"
)


def agg_tables() -> dict[str, dict[str, Any]]:
    rng = random.Random(20250101)
    regions = ("north", "south", "east", "west", "central")
    categories = ("books", "games", "garden", "music", "sports", "tools")
    rows = [
        [
            i + 1,
            rng.randint(1, 500),
            rng.choice(categories),
            rng.choice(regions),
            f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            round(rng.lognormvariate(4.0, 0.6), 2),
            rng.randint(1, 20),
        ]
        for i in range(AGG_ROWS)
    ]
    columns = [
        ["id", "INTEGER"],
        ["customer_id", "INTEGER"],
        ["category", "TEXT"],
        ["region", "TEXT"],
        ["day", "TEXT"],
        ["amount", "REAL"],
        ["quantity", "INTEGER"],
    ]
    return {"events": {"columns": columns, "rows": rows}}


def raw_connection(image: bytes) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(image)
    return conn


def bench_sql_aggregate(reps: int) -> None:
    tables = agg_tables()
    image = build_database(tables)
    backend = SimBackend()
    try:
        backend.open_episode(EpisodeSetup("bench-agg", DatabaseSpec(template_fingerprint("bench-agg-10k", tables), tables)))
        request = ToolRequest("bench-agg", "sql", {"query": AGG_QUERY})
        raw = raw_connection(image)
        engine = ReadOnlyDatabase(image)

        expected = raw.execute(AGG_QUERY).fetchall()
        response = backend.handle(request)
        check(response.ok, f"SimBackend sql aggregate returned {response.status} {response.error}")
        check(
            [tuple(r) for r in response.result.get("rows", [])] == expected, "SimBackend aggregate rows differ from raw sqlite3"
        )
        check(engine.query(AGG_QUERY).rows == expected, "ReadOnlyDatabase aggregate rows differ from raw sqlite3")
        (count,) = raw.execute("SELECT COUNT(*) FROM events").fetchone()
        check(count >= 10_000, f"aggregate table has {count} rows (< 10,000)")

        fns: dict[str, Callable[[], Any]] = {
            "raw sqlite3 execute+fetchall": lambda: raw.execute(AGG_QUERY).fetchall(),
            "(layer) ReadOnlyDatabase.query": lambda: engine.query(AGG_QUERY),
            "SimBackend.handle(ToolRequest)": lambda: backend.handle(request),
        }
        env = make_env("AgentRL/SQL-v0", max_steps=BIG_MAX_STEPS)
        step = optional("env.step on the 10k table", lambda: env_step_on(env, image, AGG_QUERY, expected))
        if step is not None:
            fns["env.step(sql aggregate)"] = step
        samples = measure(fns, n=reps, warmup=max(5, reps // 10))
        env.close()
        engine.close()
        raw.close()
    finally:
        backend.close()
    raw_p50 = p50(samples["raw sqlite3 execute+fetchall"])
    targets = {
        name: verdict(p50(samples[name]) <= 1.2 * raw_p50, "<=1.2x")
        for name in ("SimBackend.handle(ToolRequest)", "env.step(sql aggregate)")
        if name in samples
    }
    rows = latency_rows(samples, "raw sqlite3 execute+fetchall", targets)
    print_table(
        f"1a. SQL aggregate over a {count:,}-row table ({len(expected)} result rows): SimBackend vs raw sqlite3",
        LATENCY_HEADER,
        rows,
        [f"query: {AGG_QUERY}"],
    )


def env_step_on(env: gym.Env[str, str], image: bytes, query: str, expected: list[Any]) -> Callable[[], Any]:
    """``env.step`` of one SQL call on an episode whose database is swapped for ``image`` (internals)."""
    env.reset(seed=0)
    core: Any = env.unwrapped
    action = format_call("sql", {"query": "SELECT 1"})
    env.step(action)  # opens the episode on the service
    episode = core._backend.app._episodes[core._episode_id]
    episode.database.close()
    episode.database = ReadOnlyDatabase(image)
    action = format_call("sql", {"query": query})
    _, _, _, _, info = env.step(action)
    check(
        info["tool_result"]["ok"] and info["tool_result"]["row_count"] == len(expected),
        f"env aggregate step: {info['tool_result']}",
    )
    return lambda: env.step(action)


# -- 1b. SQL point lookup through the env --------------------------------------------------------


def bench_sql_point(reps: int) -> None:
    env = make_env("AgentRL/SQL-v0", max_steps=BIG_MAX_STEPS)
    try:
        env.reset(seed=0)
        core: Any = env.unwrapped
        task = core.task
        fact = DOMAINS[task.domain].fact
        query = f"SELECT * FROM {fact} WHERE id = 17"
        action = format_call("sql", {"query": query})
        image = build_database(task.data.tables)
        raw = raw_connection(image)
        expected = raw.execute(query).fetchall()
        check(len(expected) == 1, f"point lookup returned {len(expected)} rows from raw sqlite3")
        _, _, terminated, truncated, info = env.step(action)
        result = info["tool_result"]
        check(result["ok"] and result["row_count"] == 1 and not (terminated or truncated), f"env sql step: {result}")

        fns: dict[str, Callable[[], Any]] = {"raw sqlite3 execute+fetchall": lambda: raw.execute(query).fetchall()}
        engine = optional("ReadOnlyDatabase.query", lambda: ReadOnlyDatabase(image).query)
        if engine is not None:
            fns["(layer) ReadOnlyDatabase.query"] = lambda: engine(query)
        handle = optional(
            "SimBackend.handle",
            lambda: (lambda b, r: lambda: b.handle(r))(core._backend, ToolRequest(core._episode_id, "sql", {"query": query})),
        )
        if handle is not None:
            fns["(layer) SimBackend.handle"] = handle
        fns["env.step(sql point lookup)"] = lambda: env.step(action)
        samples = measure(fns, n=reps, warmup=max(10, reps // 10))
        raw.close()
    finally:
        env.close()
    name = "env.step(sql point lookup)"
    added = p50(samples[name]) - p50(samples["raw sqlite3 execute+fetchall"])
    rows = latency_rows(samples, "raw sqlite3 execute+fetchall", {name: verdict(added <= 0.3e-3, "<=0.3ms added")})
    print_table(
        f"1b. SQL point lookup through AgentRL/SQL-v0 ({task.domain}, {len(task.data.tables[fact]['rows'])}-row {fact})",
        LATENCY_HEADER,
        rows,
        [f"query: {query}", "env.step = parse action + backend (in-process HTTP) + CSV save + progress + render"],
    )


# -- 2. reset --------------------------------------------------------------------------------------


def task_seed_of(seed: int) -> int:
    """The task seed ``reset(seed=seed)`` draws (the env seeds np_random, then draws one int)."""
    rng, _ = seeding.np_random(seed)
    return int(rng.integers(0, 2**31 - 1))


def first_call(env_id: str) -> str:
    """A cheap tool call of ``env_id``: it opens the episode on the service (episodes open lazily)."""
    if env_id == "AgentRL/Python-v0":
        return format_call("python", {"code": "pass"})
    if env_id == "AgentRL/SMTP-v0":
        return format_call("smtp", {"to": ["nobody@example.invalid"], "subject": "x", "body": "x"})
    return format_call("sql", {"query": "SELECT 1"})


def bench_reset(reps: int) -> None:
    """Reset of a seed seen before (the task cache), of a new seed, and after an episode that made a call."""
    from agentrl_envs.tasks.sampler import clear_task_cache

    rows = []
    clear_task_cache()
    for env_id in ENV_IDS:
        env = make_env(env_id)
        try:
            core: Any = env.unwrapped
            seeds = list(range(reps))
            task_seeds = [task_seed_of(s) for s in seeds]
            cold_t: list[float] = []
            clock = time.perf_counter
            for s in seeds:  # the first reset of each seed generates its task (timed: "new seed")
                t0 = clock()
                env.reset(seed=s)
                cold_t.append(clock() - t0)
            check(core.task.seed == task_seeds[-1], f"{env_id}: reset(seed) did not draw the predicted task seed")
            reset_t: list[float] = []
            sample_t: list[float] = []
            after_call_t: list[float] = []
            action = first_call(env_id)
            gc.collect()
            for i, (s, ts) in enumerate(zip(seeds, task_seeds)):
                for what in ("sample", "reset") if i % 2 == 0 else ("reset", "sample"):
                    t0 = clock()
                    if what == "sample":
                        core._sampler.sample(ts)
                        sample_t.append(clock() - t0)
                    else:
                        env.reset(seed=s)
                        reset_t.append(clock() - t0)
                env.step(action)  # the next reset closes an episode the service holds
                t0 = clock()
                env.reset(seed=s)
                after_call_t.append(clock() - t0)
        finally:
            env.close()
        rows.append(
            (
                env_id,
                str(len(reset_t)),
                ms(p50(reset_t)),
                ms(pct(reset_t, 0.99)),
                ms(p50(after_call_t)),
                ms(p50(cold_t)),
                ms(p50(sample_t)),
                verdict(p50(reset_t) <= 0.25e-3, "<=0.25ms"),
            )
        )
    print_table(
        "2. env.reset(seed=i): a seed seen before, after an episode that made a call, a new seed",
        ("env id", "n", "reset p50", "reset p99", "after a call p50", "new seed p50", "sample p50", "target"),
        rows,
        [
            "reset = a cached task + bookkeeping (the episode opens on the service at its first call);",
            "after a call = the same, plus closing the previous episode's database, workspace and mailbox;",
            "new seed = the task generated (gold plan run on the data); sample = the task cache look-up alone;",
            "the target (the light peer's make+init, ~0.25 ms) is checked in the same run by benchmarks/bench_peers.py",
        ],
    )


# -- 3. python -------------------------------------------------------------------------------------


def bench_python(reps: int) -> None:
    env = make_env("AgentRL/Python-v0", max_steps=BIG_MAX_STEPS)
    try:
        env.reset(seed=0)
        core: Any = env.unwrapped
        action = format_call("python", {"code": "print(1)"})
        _, _, _, _, info = env.step(action)
        result = info["tool_result"]
        check(result["ok"] and result["stdout"].strip() == "1", f"env python step: {result}")
        cmd = [sys.executable, "-I", "-S", "-c", "print(1)"]
        out = subprocess.run(cmd, capture_output=True, check=False)
        check(out.returncode == 0 and out.stdout.strip() == b"1", f"raw subprocess: {out}")

        fns: dict[str, Callable[[], Any]] = {
            "cold subprocess.run(-I -S -c)": lambda: subprocess.run(cmd, capture_output=True, check=False),
        }

        def runner_call() -> Callable[[], Any]:
            runner = core._backend.app.runner
            workspace = core._backend.app._episodes[core._episode_id].workspace
            return lambda: runner.run("print(1)", workspace)

        def bootstrap_call() -> Callable[[], Any]:
            from simulators.python.subprocess_runner import _BOOTSTRAP

            workspace = core._backend.app._episodes[core._episode_id].workspace
            path = os.path.join(workspace, "bench_print1.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write("print(1)\n")
            argv = [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, path]
            return lambda: subprocess.run(argv, capture_output=True, check=False)

        boot = optional("subprocess.run with the runner's bootstrap", bootstrap_call)
        if boot is not None:
            fns["(layer) subprocess.run + runner bootstrap"] = boot
        run = optional("PythonRunner.run", runner_call)
        if run is not None:
            fns["(layer) PythonRunner.run"] = run
        fns["env.step(python print(1))"] = lambda: env.step(action)
        samples = measure(fns, n=reps, warmup=max(3, reps // 20))
    finally:
        env.close()
    name = "env.step(python print(1))"
    rows = latency_rows(samples, "cold subprocess.run(-I -S -c)")
    runs = [
        f"runs/s (1 / p50): {name}: {1 / p50(samples[name]):.1f}; cold subprocess: {1 / p50(samples['cold subprocess.run(-I -S -c)']):.1f}"
    ]
    print_table("3. Python step on AgentRL/Python-v0 vs a cold interpreter", LATENCY_HEADER, rows, runs)


# -- 4. smtp ---------------------------------------------------------------------------------------


def bench_smtp(reps: int) -> None:
    env = make_env("AgentRL/SMTP-v0", max_steps=BIG_MAX_STEPS)
    try:
        env.reset(seed=0)
        core: Any = env.unwrapped
        task = core.task
        staff = task.data.tables["staff"]["rows"]
        to = next(r[2] for r in staff if r[3] == "manager")
        cc = [r[2] for r in staff if r[3] == "director"]
        sender = f"agent@{DOMAINS[task.domain].mail_domain}"
        subject = "Monthly figures"
        body = "Hello,\n\nthe total for March is 12345.67 and the count is 89.\n\nBest regards,\nthe analytics agent\n"
        args = {"to": [to], "cc": cc, "subject": subject, "body": body}
        action = format_call("smtp", args)
        _, _, _, _, info = env.step(action)
        result = info["tool_result"]
        check(result["ok"] and result["to"] == [to], f"env smtp step: {result}")

        def build_message() -> bytes:
            msg = EmailMessage(policy=email.policy.default)
            msg["From"] = sender
            msg["To"] = to
            msg["Cc"] = ", ".join(cc)
            msg["Subject"] = subject
            msg["Message-ID"] = "<msg.1@agentrl.sim>"
            msg.set_content(body)
            return msg.as_bytes()

        fns: dict[str, Callable[[], Any]] = {"EmailMessage + as_bytes()": build_message}

        def mailbox_call() -> Callable[[], Any]:
            episode = core._backend.app._episodes[core._episode_id]
            return lambda: episode.mailbox.send(episode.workspace, [to], subject, body, cc=cc)

        send = optional("Mailbox.send", mailbox_call)
        if send is not None:
            fns["(layer) Mailbox.send"] = send
        fns["env.step(smtp)"] = lambda: env.step(action)
        samples = measure(fns, n=reps, warmup=max(10, reps // 10))
    finally:
        env.close()
    rows = latency_rows(samples, "EmailMessage + as_bytes()")
    print_table("4. SMTP step on AgentRL/SMTP-v0 vs building the message directly", LATENCY_HEADER, rows)


# -- 5. oracle episodes ----------------------------------------------------------------------------


def run_oracle_episode(env: gym.Env[str, str], seed: int) -> tuple[int, bool]:
    """Play one episode with the gold plan; return (steps, success)."""
    core: Any = env.unwrapped
    env.reset(seed=seed)
    steps = 0
    while True:
        _, _, terminated, truncated, info = env.step(core.oracle_action())
        steps += 1
        if terminated or truncated:
            return steps, bool(info.get("success"))


def bench_oracle(episodes: int) -> None:
    rows = []
    for env_id in ENV_IDS:
        env = make_env(env_id)
        try:
            for s in range(episodes):  # warm up the data sets and template databases of these tasks
                env.reset(seed=s)
            for s in range(2):  # and the whole path
                run_oracle_episode(env, 10_000 + s)
            times, steps, wins = [], 0, 0
            gc.collect()
            start = time.perf_counter()
            for s in range(episodes):
                t0 = time.perf_counter()
                n, ok = run_oracle_episode(env, s)
                times.append(time.perf_counter() - t0)
                steps += n
                wins += ok
            total = time.perf_counter() - start
        finally:
            env.close()
        check(wins == episodes, f"{env_id}: oracle succeeded in {wins}/{episodes} episodes")
        rows.append(
            (
                env_id,
                str(episodes),
                f"{steps / episodes:.1f}",
                ms(p50(times)),
                ms(pct(times, 0.99)),
                f"{episodes / total:.1f}",
                f"{wins}/{episodes}",
            )
        )
    print_table(
        "5. Whole oracle episodes (reset + gold plan + finish)",
        ("env id", "episodes", "steps/ep", "ms/ep p50", "ms/ep p99", "episodes/s", "success"),
        rows,
    )


_FRESH_MAKE = """
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
import gymnasium as gym
import agentrl_envs
from agentrl_envs.testing import descendants
gym.make("AgentRL/SQL-v0").close()  # the modules an env loads at its first make, not the sandbox
t = time.perf_counter()
env = gym.make(sys.argv[1])
env.reset(seed=0)
procs = len(descendants(os.getpid()))
env.close()
print(json.dumps({"s": time.perf_counter() - t, "procs": procs}))
"""


def bench_fresh_make(reps: int) -> None:
    """make + reset + close of each env id in a fresh process: what a short script or a new worker pays."""
    rows = []
    samples: dict[str, list[dict[str, float]]] = {env_id: [] for env_id in ENV_IDS}
    for _ in range(reps):  # env ids interleaved, so each gets the same share of the machine's load
        for env_id in ENV_IDS:
            out = subprocess.run(
                [sys.executable, "-c", _FRESH_MAKE, env_id, str(_ROOT)], capture_output=True, text=True, check=False
            )
            try:
                samples[env_id].append(json.loads(out.stdout.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                _NOTES.append(f"fresh make of {env_id} failed: {out.stderr.strip()[-300:]}")
    for env_id, got in samples.items():
        if got:
            rows.append((env_id, str(len(got)), ms(p50([g["s"] for g in got])), str(max(int(g["procs"]) for g in got))))
    print_table(
        "6. make + reset + close in a fresh process (modules already imported; envs without the python tool start no sandbox)",
        ("env id", "runs", "ms p50", "child processes"),
        rows,
    )


# -- main ------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="divide the repetitions by 5")
    args = parser.parse_args(argv)
    div = 5 if args.quick else 1

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = os.cpu_count() or 0
    print("agentrl env benchmark" + (" (--quick)" if args.quick else ""))
    print(f"python {platform.python_version()} ({platform.python_implementation()}) on {platform.platform()}")
    print(
        f"cpus: {os.cpu_count()} (usable {affinity}); sqlite {sqlite3.sqlite_version}; gymnasium {gym.__version__}; "
        f"agentrl_envs {agentrl_envs.__version__}"
    )
    if hasattr(os, "getloadavg"):
        print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (other load makes p99s noisy)")
    print("latencies from time.perf_counter after warm-up, variants interleaved; 'vs base' = p50 / baseline p50")
    sys.stdout.flush()

    start = time.perf_counter()
    bench_sql_aggregate(200 // div)
    bench_sql_point(200 // div)
    bench_reset(100 // div)
    bench_python(100 // div)
    bench_smtp(200 // div)
    bench_oracle(20 // div)
    bench_fresh_make(max(1, 5 // div))
    print(f"\ntotal benchmark time: {time.perf_counter() - start:.1f} s")
    for note in _NOTES:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
