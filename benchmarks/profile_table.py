"""Print the table of shipped error profiles in docs/guide/faults.md (Markdown).

"faults per call" and "burst share" are long-run values of each profile, averaged over the three
tools (bursts and the latency tail past the client timeout included); "oracle solved" and
"faults / episode" come from running :class:`OracleAgent` on ``AgentRL/SQLPythonSMTP-v0``.

    .venv/bin/python benchmarks/profile_table.py [--episodes 50]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import agentrl_envs  # noqa: F401 - registers the ids
from agentrl_envs.agents import OracleAgent
from agentrl_envs.faults import load_profile
from agentrl_envs.faults.fit import fitted_rates
from agentrl_envs.tools import service_tools

PROFILES = ("none", "realistic", "flaky", "outage", "rate-limited", "auth-expiry")
ENV_ID = "AgentRL/SQLPythonSMTP-v0"


def long_run(name: str) -> tuple[float, float | None]:
    """Mean over tools of the long-run fault share, and of the share of calls in a burst (None: no bursts)."""
    profile = load_profile(name)
    tools = service_tools()
    faults = sum(sum(fitted_rates(profile, tool).values()) for tool in tools) / len(tools)
    bursts = [profile.for_tool(tool).burst for tool in tools]
    if all(b is None for b in bursts):
        return faults, None
    return faults, sum(b.stationary_share if b is not None else 0.0 for b in bursts) / len(tools)


def oracle(name: str, episodes: int) -> tuple[int, float]:
    """(episodes solved, mean faults per episode) of the oracle on seeds 0..episodes-1."""
    env = gym.make(ENV_ID, error_profile=name)
    agent = OracleAgent(env)
    solved = faults = 0
    for seed in range(episodes):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
            done = terminated or truncated
        solved += bool(info["success"])
        faults += int(info["fault_stats"]["faults"])
    env.close()
    return solved, faults / episodes


def percent(x: float) -> str:
    return "0" if x == 0 else f"{100 * x:.3g}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50, help="oracle episodes per profile (default 50)")
    args = parser.parse_args()
    start = time.perf_counter()
    print("| profile | what it models | faults per call | burst share | oracle solved | faults / episode |")
    print("|---|---|---|---|---|---|")
    for name in PROFILES:
        profile = load_profile(name)
        faults, share = long_run(name)
        solved, per_episode = oracle(name, args.episodes)
        label = f"`{name}`" + (" (default)" if name == "none" else "")
        burst = "-" if share is None else percent(share)
        print(f"| {label} | {profile.description} | {percent(faults)} | {burst} | {solved}/{args.episodes} | {per_episode:.2f} |")
    print(f"\n({args.episodes} episodes per profile, {time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
