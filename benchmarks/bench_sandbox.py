"""The Python sandbox against a cold interpreter, measured in the same run.

For a trivial program (``print(1)``): p50/p99 latency and runs/s of :class:`SandboxRunner` at the
tier this machine allows, next to a cold ``python -I -S -c 'print(1)'`` and to the basic
:class:`PythonRunner` (a fresh interpreter under ``unshare``, no seccomp/Landlock); then
throughput with two client threads, and where a run's time goes (the monitor's timestamps); then
the sandbox processes and memory of ``--envs`` simulators in one process, each with a private
runner (as before the shared service), with leases on the process's one shared service and on the
machine's one service (and a run's p50 through each); then the same count of gym envs in one
process, and a ``--vector``-env async vector env with a service per worker and with the machine's one.

Run: ``python benchmarks/bench_sandbox.py [--n 500] [--envs 64] [--vector 16]``. Prints; never asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_envs.testing import descendants, sandbox_zygotes
from simulators.python import PythonRunner
from simulators.python.sandbox import SandboxRunner
from simulators.python.sandbox.service import DIR_ENV, SCOPE_ENV, ServiceLease
from simulators.python.sandbox.shared import SharedSandbox

PROGRAM = "print(1)"


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def timed(fn: Callable[[], object], n: int) -> tuple[list[float], float]:
    """Per-call latencies and calls/s over ``n`` sequential calls."""
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - t)
    return latencies, n / (time.perf_counter() - start)


def threaded_rate(fn: Callable[[], object], threads: int, seconds: float) -> float:
    count = [0] * threads
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        while time.perf_counter() < stop:
            fn()
            count[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(count) / (time.perf_counter() - start)


def pss_mib(pids: list[int]) -> float:
    """Proportional set size of ``pids`` (shared copy-on-write pages counted once overall)."""
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total_kb += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kb / 1024


def _service_tree(service_pid: int) -> list[int]:
    """The machine service's processes: itself, its zygote and everything under it."""
    return [service_pid, *descendants(service_pid)]


def many_envs(count: int, ws: str) -> None:
    """Sandbox processes and memory of ``count`` simulators: private runners, the process's one
    service, the machine's one service; then a run's p50 through each kind of lease."""
    print(f"{count} simulators in one process: {'':14s} {'processes':>10s} {'PSS MiB':>9s} {'start s':>8s}")
    for label, make in (
        ("private runner each (before)", lambda: SandboxRunner()),
        ("one shared service in process", lambda: SharedSandbox(scope="process")),
        ("the machine's one service", lambda: SharedSandbox(scope="machine")),
    ):
        t = time.perf_counter()
        runners = [make() for _ in range(count)]
        for r in runners:
            r.run(PROGRAM, ws)
        started = time.perf_counter() - t
        time.sleep(0.5)  # warm slots refilled
        remote = getattr(runners[0], "remote", None)
        pids = _service_tree(remote.service_pid) if remote is not None else descendants(os.getpid())
        print(f"  {label:40s} {len(pids):10d} {pss_mib(pids):9.0f} {started:8.1f}")
        for r in runners:
            r.close()
    process, machine = SharedSandbox(scope="process"), SharedSandbox(scope="machine")
    series: dict[str, list[float]] = {"process": [], "machine": []}
    for _ in range(10):  # interleaved slices: load from elsewhere hits both alike
        for name, lease in (("process", process), ("machine", machine)):
            series[name] += timed(lambda lease=lease: lease.run(PROGRAM, ws), 20)[0]  # type: ignore[misc]
    p50 = {name: percentiles(values)[0] for name, values in series.items()}
    print(
        f"  print(1) p50: in-process lease {1e3 * p50['process']:.2f} ms, machine service lease {1e3 * p50['machine']:.2f} ms "
        f"({p50['machine'] / p50['process']:.2f}x; the Unix socket hop)"
    )
    process.close()
    machine.close()


def _sandbox_tree(pid: int) -> list[int]:
    """The sandbox processes below ``pid``: its zygotes and everything under them."""
    zygotes = sandbox_zygotes(pid)
    return sorted({*zygotes, *(kid for z in zygotes for kid in descendants(z))})


def gym_envs(count: int, vector: int) -> None:
    """``count`` gym envs in this process (one step of Python each), then a ``vector``-env async
    vector env, with a service per worker process and with the machine's one service."""
    import gymnasium as gym

    import agentrl_envs  # noqa: F401 - registers the env ids
    from agentrl_envs.core.actions import format_call

    action = format_call("python", {"code": PROGRAM})
    print(f"gym envs (AgentRL/Python-v0, one Python step each): {'':3s} {'sandbox processes':>18s} {'PSS MiB':>9s}")
    envs = [gym.make("AgentRL/Python-v0") for _ in range(count)]
    for i, env in enumerate(envs):
        env.reset(seed=i % 4)
        env.step(action)
    time.sleep(0.5)
    tree = _sandbox_tree(os.getpid())  # scope "auto" in a main process: the process's own service
    print(f"  {count} envs in this process (one shared service)      {len(tree):8d} {pss_mib(tree):9.0f}")
    for env in envs:
        env.close()
    for scope in ("process", "auto", "process", "auto"):  # "auto", the default: the machine's service in the workers
        os.environ[SCOPE_ENV] = scope  # the workers inherit it
        vec = gym.make_vec("AgentRL/Python-v0", num_envs=vector, vectorization_mode="async", sql_deadline_s=60.0)
        vec.reset(seed=0)
        vec.step([action] * vector)
        time.sleep(0.5)
        workers = [proc.pid for proc in vec.unwrapped.processes]  # type: ignore[attr-defined]
        if scope == "process":
            tree, label = [p for w in workers for p in _sandbox_tree(w)], "one service per worker (before)"
        else:
            with ServiceLease() as probe:
                tree, label = _service_tree(probe.service_pid), "one machine service"
        count, pss, workers_pss = len(tree), pss_mib(tree), pss_mib(workers)
        t = time.perf_counter()
        for _ in range(10):  # every worker's env runs print(1) at once: 16 runs at a time in one service
            vec.step([action] * vector)
        step_ms = 1e3 * (time.perf_counter() - t) / 10
        print(f"  {vector}-env async vector env, {label:32s} {count:6d} {pss:9.0f}")
        print(
            f"    + its {len(workers)} worker processes: {workers_pss:.0f} MiB PSS; a vector step of print(1): {step_ms:.0f} ms"
        )
        vec.close()
    del os.environ[SCOPE_ENV]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=500, help="runs per measurement")
    parser.add_argument("--envs", type=int, default=64, help="simulators in one process for the service comparison (0: skip)")
    parser.add_argument("--vector", type=int, default=16, help="envs of the async vector env row (0: skip the gym rows)")
    args = parser.parse_args()
    n = args.n
    ws = tempfile.mkdtemp(prefix="bench-sandbox-")
    own_dir = DIR_ENV not in os.environ
    if own_dir:
        os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="sbxsvc-")  # this run's machine services only

    print(f"# bench_sandbox: {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}, n={n}")
    print(f"# load average before: {os.getloadavg()[0]:.2f}")
    t = time.perf_counter()
    sandbox = SandboxRunner()
    print(
        f"sandbox tier {sandbox.tier}, missing {sandbox.missing or 'nothing'}; zygote start {1e3 * (time.perf_counter() - t):.0f} ms"
    )
    basic = PythonRunner()

    def cold() -> None:
        subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM], stdout=subprocess.DEVNULL, check=True)

    def run_sandbox() -> None:
        res = sandbox.run(PROGRAM, ws)
        if res.stdout != "1\n":
            raise RuntimeError(res)

    def run_basic() -> None:
        basic.run(PROGRAM, ws)

    for fn in (cold, run_sandbox, run_basic):  # warm caches
        for _ in range(20):
            fn()

    rows = []
    phases: dict[str, list[float]] = {}
    prepared: list[tuple[float, float]] = []  # (program ready for its request, request written), from run()

    def note_phases(timings: dict[str, float]) -> None:
        for key, value in timings.items():
            phases.setdefault(key, []).append(value)
        if "prepared" in timings and "go" in timings:
            prepared.append((timings["prepared"], timings["go"]))

    # interleave the measurements in slices so that load from elsewhere hits all of them alike
    series: dict[str, list[float]] = {"cold": [], "sandbox": [], "basic": []}
    rates: dict[str, list[float]] = {"cold": [], "sandbox": [], "basic": []}
    for _ in range(5):
        for name, fn in (("cold", cold), ("sandbox", run_sandbox), ("basic", run_basic)):
            lat, rate = timed(fn, n // 5)
            series[name] += lat
            rates[name].append(rate)
            if name == "sandbox":
                note_phases(sandbox.last_timings)
    for _ in range(200):
        run_sandbox()
        note_phases(sandbox.last_timings)

    cold_p50, _ = percentiles(series["cold"])
    for name, label in (
        ("cold", "cold python -I -S -c"),
        ("basic", "PythonRunner (basic)"),
        ("sandbox", f"SandboxRunner ({sandbox.tier})"),
    ):
        p50, p99 = percentiles(series[name])
        rate = statistics.median(rates[name])
        rows.append((label, p50, p99, rate, p50 / cold_p50))
    print(f"{'':26s} {'p50 ms':>8s} {'p99 ms':>8s} {'runs/s':>8s} {'p50 / cold':>11s}")
    for label, p50, p99, rate, ratio in rows:
        print(f"{label:26s} {1e3 * p50:8.2f} {1e3 * p99:8.2f} {rate:8.0f} {ratio:10.2f}x")

    paused = []
    for _ in range(min(n, 200)):
        time.sleep(0.02)  # an agent thinking between tool calls: the warm supervisor is ready, the cores idle
        t = time.perf_counter()
        run_sandbox()
        paused.append(time.perf_counter() - t)
    p50, p99 = percentiles(paused)
    print(f"{'SandboxRunner, 20 ms apart':26s} {1e3 * p50:8.2f} {1e3 * p99:8.2f} {'':>8s} {p50 / cold_p50:10.2f}x")
    two = threaded_rate(run_sandbox, 2, 5.0)
    two_cold = threaded_rate(cold, 2, 5.0)
    print(f"two client threads, 5 s:   sandbox {two:.0f} runs/s, cold interpreter {two_cold:.0f} runs/s ({two / two_cold:.2f}x)")

    print("where a sandboxed run's time goes (median ms since run() was called):")
    for key, values in sorted(phases.items(), key=lambda kv: statistics.median(kv[1])):
        if key != "prepared" and statistics.median(values) >= 0:
            print(f"  {key:14s} {1e3 * statistics.median(values):6.2f}")
    if prepared:  # the warm slot's program readied itself ahead of the run, or was still at it when the request came
        late = sum(p > g for p, g in prepared)
        print(
            f"  the run's program was ready for its request {1e3 * statistics.median(p for p, _ in prepared):.2f} ms "
            f"from run() (median; negative: before the call); still preparing when the request was written: "
            f"{late} of {len(prepared)} runs"
        )
    sandbox.close()
    basic.close()
    if args.envs:
        many_envs(args.envs, ws)
    if args.envs and args.vector:
        gym_envs(args.envs, args.vector)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    shutil.rmtree(ws, ignore_errors=True)
    if own_dir:
        time.sleep(6)  # the last service stops AGENTRL_SANDBOX_IDLE_S (5 s by default) after its last lease
        shutil.rmtree(os.environ[DIR_ENV], ignore_errors=True)


if __name__ == "__main__":
    main()
