"""``agentrl-envs eval``: an agent over N episodes per split, summarized as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, TextIO

import agentrl_envs
from agentrl_envs.cli.argtypes import check_id, make_env, parse_splits, positive_int
from agentrl_envs.text.table import format_table


def cmd_eval(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agentrl_envs.agents import OracleAgent, RandomAgent

    splits = parse_splits(args.split)
    check_id(args.env_id)
    chat = _openai_agent(args)
    stats: dict[tuple[str, str], list[tuple[bool, float, int]]] = defaultdict(list)
    start = time.perf_counter()
    bar = tqdm(
        total=args.episodes * len(splits),
        desc=f"{args.agent} on {args.env_id}",
        unit="ep",
        disable=args.no_progress,
        file=sys.stderr,
    )
    for split in splits:
        env = make_env(args, split)
        agent: Any = chat or (OracleAgent(env) if args.agent == "oracle" else RandomAgent(env, seed=args.seed))
        try:
            for i in range(args.episodes):
                observation, info = env.reset(seed=args.seed + i)
                ret, done = 0.0, False
                while not done:
                    observation, reward, terminated, truncated, info = env.step(agent.act(observation, info))
                    ret = ret + float(reward)
                    done = terminated or truncated
                stats[(split, info["domain"])].append((bool(info["success"]), ret, int(info["step"])))
                if chat is not None:
                    chat.report_outcome(info)
                bar.update(1)
        finally:
            env.close()
    bar.close()
    if chat is not None:
        chat.close()
        print("endpoint: " + ", ".join(f"{k} {v}" for k, v in chat.stats.as_dict().items()), file=sys.stderr)
    rows = []
    for (split, domain), eps in sorted(stats.items()):
        rows.append(_summary_row(split, domain, eps))
    for split in splits:
        eps = [e for (s, _), v in stats.items() if s == split for e in v]
        rows.append(_summary_row(split, "all", eps))
    everything = [e for v in stats.values() for e in v]
    rows.append(_summary_row("all", "all", everything))
    if args.json:
        keys = ["split", "domain", "episodes", "success_rate", "mean_return", "mean_steps"]
        print(json.dumps([dict(zip(keys, r)) for r in rows], indent=2))
    else:
        print(f"\n{args.agent} agent on {args.env_id}: {len(everything)} episodes in {time.perf_counter() - start:.1f} s")
        print_table(
            ["split", "domain", "episodes", "success", "mean return", "mean steps"],
            [(s, d, n, f"{sr:.1%}", f"{mr:+.3f}", f"{ms:.1f}") for s, d, n, sr, mr, ms in rows],
            sys.stdout,
        )
    return 0


def openai_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--agent openai (any OpenAI-compatible /v1/chat/completions endpoint)")
    g.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000")
    g.add_argument("--model", default=None, help="the request's model field (an adapter name on agentrl-train serve)")
    g.add_argument(
        "--api-key-env", metavar="VAR", default=None, help="environment variable holding the API key (none sent otherwise)"
    )
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature (the server's default otherwise)")
    g.add_argument("--max-tokens", type=positive_int, default=None, help="completion token limit per turn")
    g.add_argument("--feedback", action="store_true", help="POST each episode's outcome to {base-url}/v1/feedback")


def _openai_agent(args: argparse.Namespace) -> Any:
    """The OpenAIChatAgent for ``--agent openai`` (None for the other agents)."""
    import os

    options = ("base_url", "model", "api_key_env", "temperature", "max_tokens")
    given = [f"--{k.replace('_', '-')}" for k in options if getattr(args, k) is not None] + ["--feedback"] * args.feedback
    if args.agent != "openai":
        if given:
            raise agentrl_envs.ConfigError(f"{', '.join(given)} only apply to --agent openai")
        return None
    if args.base_url is None or args.model is None:
        raise agentrl_envs.ConfigError("--agent openai needs --base-url URL and --model NAME")
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise agentrl_envs.ConfigError(f"--api-key-env {args.api_key_env[:60]!r}: that environment variable is not set")
    from agentrl_envs.agents import OpenAIChatAgent

    return OpenAIChatAgent(
        args.base_url,
        args.model,
        api_key,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        feedback=args.feedback,
        seed=args.seed,
    )


def _summary_row(split: str, domain: str, eps: list[tuple[bool, float, int]]) -> tuple[str, str, int, float, float, float]:
    n = len(eps)
    if n == 0:
        return (split, domain, 0, 0.0, 0.0, 0.0)
    return (split, domain, n, sum(e[0] for e in eps) / n, sum(e[1] for e in eps) / n, sum(e[2] for e in eps) / n)


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    print(format_table(header, rows), file=out)
