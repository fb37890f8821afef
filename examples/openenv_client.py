"""Play the agentrl envs through OpenEnv's own client, the oracle's calls checked against ``gym.make``.

::

    python examples/openenv_client.py --episodes 2 --error-profile flaky
    python examples/openenv_client.py --mcp          # the calls as OpenEnv MCP tool calls (MCPToolClient)

It starts ``agentrl-envs openenv`` on 127.0.0.1 (a free port) and, for every registered id, opens
an OpenEnv session (``GenericEnvClient``, WebSocket ``/ws``) whose ``reset`` picks the id, the seed
and the fault profile, then sends the calls of an :class:`~agentrl_envs.agents.OracleAgent` that plays
the same seed in process, printing the rewards over OpenEnv next to ``gym.make``'s. With ``--mcp`` the
session is OpenEnv's ``MCPToolClient``: it lists the env's tools and sends each call as a
``CallToolAction``. It exits 1 if a reward or an observation differs or an episode is not solved.
Needs the openenv extra: ``pip install -e ".[openenv]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator

import gymnasium as gym
from openenv.core import GenericEnvClient
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

import agentrl_envs
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import parse_action


def play(url: str, env_id: str, seed: int, error_profile: str) -> tuple[list[float], list[float], bool]:
    """One episode over OpenEnv and the same episode in process: (rewards over OpenEnv, in process, solved)."""
    local = gym.make(env_id, error_profile=error_profile)
    try:
        with GenericEnvClient(base_url=url).sync() as remote:
            result = remote.reset(seed=seed, env_id=env_id, error_profile=error_profile)
            observation, info = local.reset(seed=seed)
            assert result.observation["text"] == observation, "the task over OpenEnv differs from gym.make's"
            oracle, remote_rewards, local_rewards, done = OracleAgent(local), [], [], False
            while not done:
                action = oracle.act(observation, info)
                call = parse_action(action, local.unwrapped.tools)  # type: ignore[attr-defined]
                observation, reward, terminated, truncated, info = local.step(action)
                done = terminated or truncated
                result = remote.step({"tool": call.name, "arguments": call.arguments})
                assert result.observation["text"] == observation and result.done == done, "the step over OpenEnv differs"
                remote_rewards.append(float(result.reward or 0.0))
                local_rewards.append(float(reward))
        return remote_rewards, local_rewards, bool(info["success"])
    finally:
        local.close()


def play_mcp(url: str, env_id: str, seed: int, error_profile: str) -> tuple[list[float], list[float], bool]:
    """:func:`play` with OpenEnv's MCP client: the env's tools listed, each call a ``CallToolAction``."""
    local = gym.make(env_id, error_profile=error_profile)
    try:
        with MCPToolClient(base_url=url).sync() as remote:
            remote.reset(seed=seed, env_id=env_id, error_profile=error_profile)
            tools = remote.list_tools(use_cache=False)  # names, descriptions, JSON schemas
            assert [t.name for t in tools] == list(local.unwrapped.tools), "the tools over OpenEnv differ"  # type: ignore[attr-defined]
            observation, info = local.reset(seed=seed)
            oracle, remote_rewards, local_rewards, done = OracleAgent(local), [], [], False
            while not done:
                action = oracle.act(observation, info)
                call = parse_action(action, local.unwrapped.tools)  # type: ignore[attr-defined]
                observation, reward, terminated, truncated, info = local.step(action)
                done = terminated or truncated
                result = remote.step(CallToolAction(tool_name=call.name, arguments=call.arguments))
                step = result.observation.result["structured_content"]  # also set when the call is an error
                assert step["observation"] == observation and result.done == done, "the step over OpenEnv differs"
                remote_rewards.append(float(result.reward or 0.0))
                local_rewards.append(float(reward))
        return remote_rewards, local_rewards, bool(info["success"])
    finally:
        local.close()


@contextlib.contextmanager
def openenv_server(env_id: str) -> Iterator[str]:
    """Start ``agentrl-envs openenv ENV_ID --port 0`` and yield its URL."""
    command = [sys.executable, "-m", "agentrl_envs", "openenv", env_id, "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"(http://\S+) ", line)
        if found is None:
            raise RuntimeError(f"the server did not start: {line!r}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--error-profile", default="none", help="a shipped fault profile, e.g. flaky")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per id")
    parser.add_argument("--seed", type=int, default=0, help="first seed; episode i uses seed + i")
    parser.add_argument("--mcp", action="store_true", help="play through OpenEnv's MCP client (MCPToolClient)")
    args = parser.parse_args()
    episode = play_mcp if args.mcp else play
    failures = 0
    with openenv_server("AgentRL/SQL-v0") as url:
        print(f"OpenEnv server on {url}")
        for env_id in agentrl_envs.ENV_IDS:
            for seed in range(args.seed, args.seed + args.episodes):
                remote, local, solved = episode(url, env_id, seed, args.error_profile)
                same = remote == local
                failures += not (same and solved)
                print(
                    f"  {env_id} seed {seed}: rewards {remote} (gym.make {'same' if same else local}), "
                    f"{'solved' if solved else 'NOT solved'}"
                )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
