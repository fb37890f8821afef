"""The ``agentrl-envs`` command: list, play and evaluate the environments.

::

    agentrl-envs list
    agentrl-envs play AgentRL/SQL-v0 [--seed N] [--candidates K]
    agentrl-envs eval AgentRL/SQLPythonSMTP-v1 --agent oracle --episodes 50
    agentrl-envs eval AgentRL/SQL-v0 --agent openai --base-url http://127.0.0.1:8000 --model NAME
    agentrl-envs serve --host 127.0.0.1 --port 8765 [--profile realistic]
    agentrl-envs mcp AgentRL/SQL-v0 [--transport stdio|http] [--error-profile flaky]
    agentrl-envs openenv AgentRL/SQL-v0 --port 8000 [--max-sessions 64]
    agentrl-envs fit-profile access.log api.jsonl -o profile.yaml
    agentrl-envs pg-sweep postgresql://agentrl:...@db:5432/agentrl [--dry-run]
    agentrl-envs export-sft AgentRL/SQL-v0 --agent oracle --episodes 100 -o sft.parquet

``agentrl-envs COMMAND --help`` describes every option.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

import agentrl_envs
from agentrl_envs.cli.args import parse_args
from agentrl_envs.cli.argtypes import MAX_SEED, check_id, env_args, episode_server_args, int_in, positive_int
from agentrl_envs.cli.evaluate import cmd_eval, openai_args, print_table
from agentrl_envs.cli.play import cmd_play
from agentrl_envs.cli.serve import add_serve_arguments, cmd_mcp, cmd_openenv, cmd_pg_sweep, cmd_serve
from agentrl_envs.errors import AgentRLError
from agentrl_envs.tasks.sampler import SPLITS

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    try:
        return int(args.func(args) or 0)
    except AgentRLError as exc:
        print(f"agentrl-envs: error: {exc}", file=sys.stderr)
        return 2
    except gym.error.Error as exc:
        print(f"agentrl-envs: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl-envs", description="Gymnasium environments for tool-using LLM agents.")
    parser.add_argument("--version", action="version", version=f"agentrl {agentrl_envs.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list the registered environments")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("play", help="play an episode by typing tool calls")
    env_args(p)
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0, help="reset seed, 0 to 2**63-1 (default 0)")
    p.set_defaults(func=cmd_play)

    p = sub.add_parser("eval", help="run an agent for N episodes and print a summary table")
    env_args(p, split_default="train,test,heldout")
    p.add_argument("--agent", choices=("oracle", "random", "openai"), default="oracle", help="which agent plays (default oracle)")
    p.add_argument("--episodes", type=positive_int, default=20, help="episodes per split (default 20)")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0, help="first seed, 0 to 2**63-1; episode i uses seed+i")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    openai_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("serve", help="serve the simulator API over HTTP (see GET /openapi.json)")
    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)

    for name, port, what in (
        ("mcp", 8766, "serve an env's tools over MCP (stdio, or streamable HTTP at /mcp)"),
        ("openenv", 8000, "serve an env as an OpenEnv environment (HTTP and WebSocket; see GET /schema)"),
    ):
        p = sub.add_parser(name, help=what)
        env_args(p)
        episode_server_args(p, port)
        if name == "mcp":
            p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="stdio (default) or http")
        p.set_defaults(func=cmd_mcp if name == "mcp" else cmd_openenv)

    from agentrl_envs.analysis import counterfactual, report
    from agentrl_envs.faults import fit

    p = sub.add_parser("fit-profile", help="fit an error profile to real API logs (JSON lines or combined access logs)")
    fit.add_arguments(p)
    p.set_defaults(func=fit.cmd_fit_profile)

    p = sub.add_parser("check-rewards", help="reward validation report (Markdown + PNG plots); non-zero exit when a check fails")
    report.add_arguments(p)
    p.set_defaults(func=report.cmd_check_rewards)

    p = sub.add_parser("make-rm-data", help="counterfactual reward-model data: gold calls and perturbations as Parquet")
    counterfactual.add_arguments(p)
    p.set_defaults(func=counterfactual.cmd_make_rm_data)

    p = sub.add_parser("pg-sweep", help="drop agentrl_* schemas and roles that killed processes left in PostgreSQL")
    p.add_argument("url", metavar="URL", help="postgresql://user:password@host:port/dbname of the account the backends use")
    p.add_argument("--dry-run", action="store_true", help="list what would be dropped, drop nothing")
    p.set_defaults(func=cmd_pg_sweep)

    p = sub.add_parser("export-sft", help="run an agent and write its episodes as chat messages (SFT Parquet for datasets/TRL)")
    p.add_argument("env_id", metavar="ID", help="environment id, e.g. AgentRL/SQL-v0 (see 'agentrl-envs list')")
    p.add_argument("--agent", choices=("oracle", "random"), default="oracle", help="which agent plays (default oracle)")
    p.add_argument("--episodes", type=positive_int, default=100, help="episodes to write (default 100)")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0, help="first seed, 0 to 2**63-1; episode i uses seed+i")
    p.add_argument("--split", default="train", choices=SPLITS, help="task split (default train)")
    p.add_argument("-o", "--output", required=True, help="Parquet file to write")
    p.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    p.set_defaults(func=cmd_export_sft)
    return parser


def cmd_export_sft(args: argparse.Namespace) -> int:
    from agentrl_envs._output import check_output
    from agentrl_envs.integrations.chat import export_sft

    check_id(args.env_id)
    if args.seed + args.episodes - 1 > MAX_SEED:
        raise agentrl_envs.ConfigError(
            f"--seed {args.seed} with --episodes {args.episodes}: the last episode's seed would pass 2**63-1; use a smaller --seed"
        )
    output = check_output(args.output, force=args.force, example="sft.parquet")  # before the episodes, not after
    summary = export_sft(args.env_id, output, episodes=args.episodes, agent=args.agent, seed=args.seed, split=args.split)
    print(
        f"wrote {summary['episodes']} episodes ({summary['solved']} solved, {summary['messages']} messages) to {summary['path']}"
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for env_id in agentrl_envs.ENV_IDS:
        entry = gym.spec(env_id).entry_point
        cls: Any = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        summary = (cls.__doc__ or "").strip().splitlines()[0].split(":", 1)[-1].strip()
        rows.append((env_id, ", ".join(cls.tool_names), summary))
    print_table(["id", "tools", "task"], rows, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
