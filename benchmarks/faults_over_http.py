"""Faults the oracle meets with a profile served by ``agentrl-envs serve --profile P`` and in process.

    python benchmarks/faults_over_http.py [--profile realistic] [--episodes 30]

Runs the oracle on ``AgentRL/SQLPythonSMTP-v0`` for seeds 0..N-1 twice: against a server started
here on 127.0.0.1 (a free port) with ``--profile P`` and the env's default ``error_profile="none"``,
then in process with ``error_profile=P``; prints the faults seen, by kind (printed, not asserted).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import httpx

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.agents import OracleAgent

ENV_ID = "AgentRL/SQLPythonSMTP-v0"


def faults(episodes: int, **kwargs: Any) -> dict[str, int]:
    kinds: collections.Counter[str] = collections.Counter()
    env = gym.make(ENV_ID, **kwargs)
    agent = OracleAgent(env)
    try:
        for seed in range(episodes):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
                if info.get("fault"):
                    kinds[str(info["fault"].get("type"))] += 1
                done = terminated or truncated
    finally:
        env.close()
    return dict(sorted(kinds.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="realistic", help="fault profile, by name or YAML path (default realistic)")
    ap.add_argument("--episodes", type=int, default=30, help="oracle episodes, seeds 0..N-1 (default 30)")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "agentrl_envs", "serve", "--host", "127.0.0.1", "--port", "0", "--profile", args.profile]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in server.stdout or ():
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if found:
                url = f"http://127.0.0.1:{found.group(1)}"
                break
        if url is None:
            raise SystemExit(f"the server did not start: {' '.join(cmd)}")
        for _ in range(300):  # the banner can come a moment before the socket listens
            try:
                httpx.get(url + "/health", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        served = faults(args.episodes, backend=url)
    finally:
        server.terminate()
        server.wait()
    local = faults(args.episodes, error_profile=args.profile)
    print(f"oracle on {ENV_ID}, seeds 0-{args.episodes - 1}, faults by kind:")
    print(f"  served (serve --profile {args.profile}): {sum(served.values())} {served}")
    print(f"  in process (error_profile={args.profile!r}): {sum(local.values())} {local}")


if __name__ == "__main__":
    main()
