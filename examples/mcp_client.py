"""Play an agentrl env over MCP with the ``mcp`` SDK's own client, the oracle's calls checked against ``gym.make``.

::

    python examples/mcp_client.py --env-id AgentRL/Workplace-v1 --transport http --error-profile flaky --episodes 3

It starts ``agentrl-envs mcp`` itself (stdio: as the client's subprocess; http: on 127.0.0.1, a free
port), lists the tools, and for each episode calls ``reset(seed)`` and then the calls of an
:class:`~agentrl_envs.agents.OracleAgent` that plays the same seed in process, printing each step's
reward over MCP next to ``gym.make``'s. It exits 1 if a reward or an observation differs or an
episode is not solved. Needs the mcp extra: ``pip install -e ".[mcp]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import gymnasium as gym
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import parse_action


async def play(client: Client, env_id: str, seed: int, error_profile: str) -> tuple[list[float], list[float], bool]:
    """One episode over MCP and the same episode in process: (rewards over MCP, rewards in process, solved)."""
    local = gym.make(env_id, error_profile=error_profile)
    try:
        reset = await client.call_tool("reset", {"seed": seed})
        observation, info = local.reset(seed=seed)
        assert reset.content[0].text == observation, "the task over MCP differs from gym.make's"  # type: ignore[union-attr]
        oracle, remote_rewards, local_rewards, done = OracleAgent(local), [], [], False
        while not done:
            action = oracle.act(observation, info)
            call = parse_action(action, local.unwrapped.tools)  # type: ignore[attr-defined]
            observation, reward, terminated, truncated, info = local.step(action)
            done = terminated or truncated
            result: Any = (await client.call_tool(call.name, call.arguments)).structured_content
            assert result["observation"] == observation and result["done"] == done, "the step over MCP differs"
            remote_rewards.append(result["reward"])
            local_rewards.append(float(reward))
        return remote_rewards, local_rewards, bool(info["success"])
    finally:
        local.close()


@contextlib.contextmanager
def http_server(command: list[str]) -> Iterator[str]:
    """Start ``agentrl-envs mcp --transport http --port 0`` and yield its URL."""
    proc = subprocess.Popen([*command, "--transport", "http", "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"(http://\S+/mcp)", line)
        if found is None:
            raise RuntimeError(f"the server did not start: {line}{proc.stderr.read()[-2000:]}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def run(args: argparse.Namespace, target: Any) -> int:
    failures = 0
    async with Client(target) as client:
        tools = await client.list_tools()
        print(f"{args.env_id} over MCP ({args.transport}): tools {', '.join(t.name for t in tools.tools)}")
        for seed in range(args.seed, args.seed + args.episodes):
            remote, local, solved = await play(client, args.env_id, seed, args.error_profile)
            same = remote == local
            failures += not (same and solved)
            print(
                f"  seed {seed}: rewards {remote} (gym.make {'same' if same else local}), {'solved' if solved else 'NOT solved'}"
            )
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="AgentRL/SQL-v0")
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--error-profile", default="none", help="a shipped fault profile, e.g. flaky")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="first seed; episode i uses seed + i")
    args = parser.parse_args()
    command = [sys.executable, "-m", "agentrl_envs", "mcp", args.env_id, "--error-profile", args.error_profile]
    if args.transport == "stdio":
        target = stdio_client(StdioServerParameters(command=command[0], args=command[1:]))
        return anyio.run(run, args, target)
    with http_server(command) as url:
        return anyio.run(run, args, url)


if __name__ == "__main__":
    sys.exit(main())
