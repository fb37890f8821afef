"""Backends side by side: the same oracle episodes through the direct in-process call, the
``httpx.MockTransport`` path (``sim``) and HTTP on loopback (``agentrl-envs serve``), as ratios
measured in one run; plus raw tool-request throughput of the HTTP server.

Run: ``python benchmarks/bench_backends.py [--quick]``. Prints; never asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym
import httpx

import agentrl_envs  # noqa: F401
from agentrl_envs.agents import OracleAgent
from agentrl_envs.testing import simulator_server


def episodes_per_s(env_id: str, backend: object, n: int) -> tuple[float, float]:
    env = gym.make(env_id, backend=backend)
    agent = OracleAgent(env)
    for seed in range(n):  # warm up: every template database and connection the timed loop needs
        env.reset(seed=seed)
    steps = 0
    start = time.perf_counter()
    for seed in range(n):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
            steps += 1
            done = terminated or truncated
    elapsed = time.perf_counter() - start
    env.close()
    return n / elapsed, steps / elapsed


def http_throughput(url: str, seconds: float, threads: int) -> tuple[float, float]:
    """Tool requests per second against one server from ``threads`` client threads, each with its
    own episode (as N envs would be), each a point lookup."""
    envs = [gym.make("AgentRL/SQL-v0", backend=url) for _ in range(threads)]
    episodes, tokens = [], []
    for i, env in enumerate(envs):
        env.reset(seed=i)
        episodes.append(env.unwrapped._episode_id)
        tokens.append(env.unwrapped._backend._tokens[episodes[-1]])  # the owner's token (others get 403)
    count = [0] * threads
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        with httpx.Client(base_url=url, timeout=10, headers={"X-AgentRL-Episode-Token": tokens[i]}) as client:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = client.post(f"/v1/episodes/{episodes[i]}/sql", json={"query": "SELECT name FROM staff WHERE staff_id = 3"})
                if i == 0:
                    latencies.append(time.perf_counter() - t)
                if r.status_code == 200:
                    count[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - start
    for env in envs:
        env.close()
    return sum(count) / elapsed, statistics.median(latencies) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 10 if args.quick else 40
    print(f"agentrl backend benchmark: python {platform.python_version()}, {os.cpu_count()} cpus, {n} episodes per cell")
    with simulator_server() as (url, _proc):
        print(f"\n{'env id':<26} {'backend':<8} {'episodes/s':>11} {'steps/s':>9} {'vs direct':>10}")
        for env_id in ("AgentRL/SQL-v0", "AgentRL/SMTP-v0", "AgentRL/SQLPythonSMTP-v0"):
            base = None
            for name, backend in (("direct", "direct"), ("sim", "sim"), ("http", url)):
                eps, sps = episodes_per_s(env_id, backend, n)
                base = base or sps
                print(f"{env_id:<26} {name:<8} {eps:>11.1f} {sps:>9.1f} {sps / base:>9.2f}x")
        seconds = 2.0 if args.quick else 5.0
        for threads in (1, 4):
            rps, p50 = http_throughput(url, seconds, threads)
            print(
                f"\nHTTP on loopback, {threads} client thread(s): {rps:,.0f} tool requests/s (p50 {p50:.2f} ms); target >= 1,500/s"
            )
        print("(client and server share the same 2 cores; a 40 ms p50 would mean Nagle's delay is on)")


if __name__ == "__main__":
    main()
