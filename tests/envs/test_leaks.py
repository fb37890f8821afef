"""Resource leaks over 1,000 oracle episodes in one process: child processes, file descriptors,
memory and temporary directories.

The warm-up first resets each env until it has drawn every data set of its split once (the
per-data-set caches of the sampler, the gold runner and the simulator are bounded, and filling them
costs ~15 MB of RSS, which is not a leak), then plays 20 oracle episodes. The baselines are taken
after it.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.tasks.sampler import DATA_VARIANTS, domains_for
from tests.procs import alive

pytestmark = pytest.mark.slow

# Workplace-v1 runs the services of SQLPythonSMTP-v1 and HTTP-v0, both here; 250 of its 9-call
# episodes would add about a minute to CI for no code the others do not run.
ENV_IDS = tuple(e for e in agentrl_envs.ENV_IDS if e != "AgentRL/Workplace-v1")
EPISODES_PER_ENV = 250
WARMUP_EPISODES_PER_ENV = 5
MAX_FD_GROWTH = 3
MAX_RSS_GROWTH = 0.10
TEMP_PREFIXES = ("agentrl-ws-", "agentrl-py-", "agentrl-gold-")


def _children() -> set[int]:
    """Pids of this process's children (zombies included), read from /proc."""
    me = os.getpid()
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == me:  # fields: state, ppid, ...
            out.add(int(name))
    return out


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def _temp_entries() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(TEMP_PREFIXES)}


def _play(env: gym.Env[str, str], seed: int) -> dict[str, Any]:
    agent = OracleAgent(env)
    obs, info = env.reset(seed=seed)
    for _ in range(100):
        obs, _reward, terminated, truncated, info = env.step(agent.act(obs, info))
        if terminated or truncated:
            return info
    raise AssertionError(f"seed {seed}: the oracle did not finish within 100 steps")


def _fill_caches(env: gym.Env[str, str], first_seed: int) -> None:
    """Reset until every data set of the split has been drawn once."""
    wanted = len(domains_for("train")) * DATA_VARIANTS
    seen: set[str] = set()
    for seed in range(first_seed, first_seed + 2000):
        env.reset(seed=seed)
        task = env.unwrapped.task  # type: ignore[attr-defined]
        seen.add(task.data.fingerprint)
        if len(seen) == wanted:
            return
    raise AssertionError(f"only {len(seen)} of {wanted} data sets drawn in 2000 resets")


def test_no_leaks_over_1000_oracle_episodes(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A private temp dir, so that other processes using the shared one cannot disturb the count.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    temp_before = _temp_entries()
    children_before = _children()
    start = time.perf_counter()

    envs = {env_id: gym.make(env_id) for env_id in ENV_IDS}
    failures: list[str] = []
    try:
        for k, env in enumerate(envs.values()):
            _fill_caches(env, first_seed=1_000_000 + 10_000 * k)
        for i in range(WARMUP_EPISODES_PER_ENV):
            for k, env in enumerate(envs.values()):
                _play(env, seed=2_000_000 + len(ENV_IDS) * i + k)
        gc.collect()
        fds_warm, rss_warm = _open_fds(), _rss_kib()
        warm_s = time.perf_counter() - start

        for i in range(EPISODES_PER_ENV):
            for k, (env_id, env) in enumerate(envs.items()):
                seed = len(ENV_IDS) * i + k
                info = _play(env, seed)
                if not info.get("success"):
                    failures.append(f"{env_id} seed {seed}: {info.get('task_components')}")

        gc.collect()
        fds_end, rss_end = _open_fds(), _rss_kib()
    finally:
        for env in envs.values():
            env.close()
    # Each env's sandbox keeps a zygote process while it is open; once closed, nothing remains.
    time.sleep(0.2)
    leftover_children = {p for p in _children() - children_before if alive(p)}
    elapsed = time.perf_counter() - start
    leftover_temp = _temp_entries() - temp_before

    print(
        f"\n{len(ENV_IDS) * EPISODES_PER_ENV} episodes in {elapsed:.1f} s (warm-up {warm_s:.1f} s); "
        f"fds {fds_warm} -> {fds_end}; RSS {rss_warm} -> {rss_end} KiB ({(rss_end - rss_warm) / rss_warm:+.1%})"
    )
    assert not failures, f"{len(failures)} oracle episodes failed, e.g. {failures[:3]}"
    assert not leftover_children, f"child processes left: {sorted(leftover_children)}"
    assert fds_end <= fds_warm + MAX_FD_GROWTH, f"open fds grew from {fds_warm} to {fds_end}"
    assert rss_end < rss_warm * (1 + MAX_RSS_GROWTH), f"RSS grew from {rss_warm} to {rss_end} KiB"
    assert not leftover_temp, f"temporary directories left after close(): {sorted(leftover_temp)}"
