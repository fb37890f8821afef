"""The ``agentrl-envs`` command: list, play and evaluate the environments.

::

    agentrl-envs list
    agentrl-envs play AgentRL/SQL-v0 [--seed N] [--candidates K]
    agentrl-envs eval AgentRL/SQLPythonSMTP-v0 --agent oracle --episodes 50
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
import contextlib
import json
import math
import sys
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import gymnasium as gym

import agentrl_envs
from agentrl_envs.cli.args import parse_args
from agentrl_envs.core.actions import format_call
from agentrl_envs.core.options import MAX_CANDIDATES, MAX_SERVICE_S
from agentrl_envs.errors import AgentRLError
from agentrl_envs.tasks.sampler import SPLITS
from agentrl_envs.text.table import format_table

__all__ = ["main"]

#: ``--seed`` at most (seeds are stored as int64, e.g. in export-sft's Parquet)
MAX_SEED = (1 << 63) - 1
#: ``serve --max-upload-mb`` at most: 1 TiB, ``ServeLimits.max_upload_bytes``'s limit
MAX_UPLOAD_MB = 1 << 20

#: one line of ``play``'s help per tool: its shorthand and what it does
PLAY_SHORTHANDS = {
    "sql": "  sql SELECT ...                 run a query",
    "python": "  python print(1)                run code (\\n for newlines)",
    "smtp": '  smtp {"to": ..., ...}          send mail (JSON arguments)',
    "http": '  http GET /v1/tickets?limit=5   a REST call (POST and PATCH take a JSON body: http POST /v1/x {"a": 1})',
    "finish": "  finish 42                      end with an answer",
}


def play_help(tool_names: Sequence[str]) -> str:
    """What ``play`` prints at the start and on ``:help``: the shorthands of this env's tools only."""
    lines = ["Type one tool call per line:"]
    lines += [PLAY_SHORTHANDS[name] for name in tool_names if name in PLAY_SHORTHANDS]
    lines += [
        "  <tool_call>{...}</tool_call> or a bare JSON call also work; a number picks a candidate.",
        "  :help shows this, :render shows the transcript, :quit leaves.",
    ]
    return "\n".join(lines)


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
    _env_args(p)
    p.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="reset seed, 0 to 2**63-1 (default 0)")
    p.set_defaults(func=cmd_play)

    p = sub.add_parser("eval", help="run an agent for N episodes and print a summary table")
    _env_args(p, split_default="train,test,heldout")
    p.add_argument("--agent", choices=("oracle", "random", "openai"), default="oracle", help="which agent plays (default oracle)")
    p.add_argument("--episodes", type=_positive, default=20, help="episodes per split (default 20)")
    p.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="first seed, 0 to 2**63-1; episode i uses seed+i")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _openai_args(p)
    p.set_defaults(func=cmd_eval)

    from agentrl_envs.server.processes import MAX_WORKERS

    p = sub.add_parser("serve", help="serve the simulator API over HTTP (see GET /openapi.json)")
    p.add_argument(
        "--host", type=_host, default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"
    )
    p.add_argument("--port", type=_port, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--profile", default="none", help="fault profile injected server-side (a name or a YAML path)")
    p.add_argument("--sql-deadline-s", type=float, default=2.0, help="deadline of one SQL query in seconds (default 2.0)")
    p.add_argument("--python-timeout-s", type=float, default=5.0, help="wall limit of one Python run in seconds (default 5.0)")
    p.add_argument(
        "--token",
        default=None,
        help="bearer token clients must send (default $AGENTRL_SERVE_TOKEN); required unless --host is a loopback address",
    )
    p.add_argument("--python-workers", type=_int_in(1, 4096), default=4, help="threads running Python calls, 1-4096 (default 4)")
    p.add_argument(
        "--per-client",
        type=_int_in(1, 4096),
        default=1024,
        help="calls one client address may have in flight, 1-4096 (every loopback client shares one); 429 past it (default 1024)",
    )
    p.add_argument(
        "--workers",
        type=_int_in(1, MAX_WORKERS),
        default=1,
        help=f"server processes, 1-{MAX_WORKERS}, one port each from --port on (default 1); give clients all the URLs it prints",
    )
    p.add_argument(
        "--max-episodes",
        type=_int_in(1, 1 << 24),
        default=8192,
        help="episodes one server process holds open at once; opening one more answers 503 (default 8192)",
    )
    p.add_argument(
        "--episode-idle-s",
        type=_seconds,
        default=900.0,
        help="close an episode without a call for this many seconds (default 900, 15 minutes)",
    )
    p.add_argument(
        "--max-upload-mb",
        type=_int_in(1, MAX_UPLOAD_MB),
        default=1024,
        help=f"largest template database upload in MiB of JSON, 1-{MAX_UPLOAD_MB} (default 1024)",
    )
    p.set_defaults(func=cmd_serve)

    for name, port, what in (
        ("mcp", 8766, "serve an env's tools over MCP (stdio, or streamable HTTP at /mcp)"),
        ("openenv", 8000, "serve an env as an OpenEnv environment (HTTP and WebSocket; see GET /schema)"),
    ):
        p = sub.add_parser(name, help=what)
        _env_args(p)
        _episode_server_args(p, port)
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
    p.add_argument("--episodes", type=_positive, default=100, help="episodes to write (default 100)")
    p.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="first seed, 0 to 2**63-1; episode i uses seed+i")
    p.add_argument("--split", default="train", choices=SPLITS, help="task split (default train)")
    p.add_argument("-o", "--output", required=True, help="Parquet file to write")
    p.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    p.set_defaults(func=cmd_export_sft)
    return parser


def cmd_export_sft(args: argparse.Namespace) -> int:
    from agentrl_envs._output import check_output
    from agentrl_envs.integrations.chat import export_sft

    _check_id(args.env_id)
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


def _env_args(p: argparse.ArgumentParser, split_default: str = "train") -> None:
    p.add_argument("env_id", metavar="ID", help="environment id, e.g. AgentRL/SQL-v0 (see 'agentrl-envs list')")
    p.add_argument("--split", default=split_default, help=f"split, or a comma-separated list ({', '.join(SPLITS)})")
    p.add_argument("--domain", default=None, help="restrict to one domain of the split")
    p.add_argument(
        "--candidates", type=_int_in(0, MAX_CANDIDATES), default=0, help=f"show K candidate actions each step, 0-{MAX_CANDIDATES}"
    )
    p.add_argument("--long-horizon", action="store_true", help="chained sub-tasks (SQLPythonSMTP only)")
    p.add_argument("--max-steps", type=_positive, default=None, help="step limit (default: 3 x the gold plan's calls + 4)")
    p.add_argument(
        "--error-profile",
        default="none",
        metavar="NAME|PATH",
        help="fault profile: a shipped name (realistic, flaky, outage, rate-limited, auth-expiry) or a YAML path (default none)",
    )


def _episode_server_args(p: argparse.ArgumentParser, port: int) -> None:
    """The options ``mcp`` and ``openenv`` share (besides the env's, from :func:`_env_args`)."""
    p.add_argument("--backend", default="sim", help="where tool calls go: sim (default), direct, or http://host:port")
    p.add_argument(
        "--seed",
        type=_int_in(0, MAX_SEED),
        default=None,
        help="seed of a session's first episode when the client gives none (default: a fresh one per session)",
    )
    p.add_argument("--host", type=_host, default="127.0.0.1", help="address to listen on over HTTP (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=port, help=f"port over HTTP (default {port}; 0 picks a free one)")
    p.add_argument("--max-sessions", type=_int_in(1, 1 << 16), default=64, help="sessions open at once, 1-65536 (default 64)")
    p.add_argument(
        "--idle-s", type=_seconds, default=900.0, help="close a session without a request for this many seconds (default 900)"
    )


def _positive(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``lo`` to ``hi``."""

    def parse(text: str) -> int:
        value = _int(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {text[:40]!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 and at most ``MAX_SERVICE_S`` (a day)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SERVICE_S:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected seconds above 0 and at most {MAX_SERVICE_S:g} (a day), got {text[:40]!r}")
    return value


def _host(text: str) -> str:
    """An argparse type: a host name or IP address (at most 253 characters, no spaces or control characters)."""
    if not text or len(text) > 253 or not text.isprintable() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"expected a host name or IP address such as 127.0.0.1 (0.0.0.0 for every interface), got {text[:40]!r}"
        )
    return text


def _port(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None


def _check_id(env_id: str) -> None:
    if env_id not in agentrl_envs.ENV_IDS:
        raise agentrl_envs.ConfigError(f"unknown environment {env_id[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")


def _make(args: argparse.Namespace, split: str, **extra: Any) -> gym.Env[str, str]:
    _check_id(args.env_id)
    return gym.make(args.env_id, **_make_kwargs(args, split), **extra)


def _make_kwargs(args: argparse.Namespace, split: str) -> dict[str, Any]:
    """The ``gym.make`` keywords of :func:`_env_args`' options."""
    kwargs: dict[str, Any] = {
        "split": split,
        "domain": args.domain,
        "candidates": args.candidates,
        "error_profile": args.error_profile,
    }
    if args.long_horizon:
        kwargs["long_horizon"] = True
    if args.max_steps:
        kwargs["max_steps"] = args.max_steps
    return kwargs


def _splits(text: str) -> list[str]:
    splits = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if not splits or bad:
        raise agentrl_envs.ConfigError(f"--split {text[:60]!r}: use one or more of {', '.join(SPLITS)}, comma-separated")
    return splits


# ---------------------------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for env_id in agentrl_envs.ENV_IDS:
        entry = gym.spec(env_id).entry_point
        cls: Any = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        summary = (cls.__doc__ or "").strip().splitlines()[0].split(":", 1)[-1].strip()
        rows.append((env_id, ", ".join(cls.tool_names), summary))
    _table(["id", "tools", "task"], rows, sys.stdout)
    return 0


# ---------------------------------------------------------------------------------------- play


def cmd_play(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    read_line = _line_reader(stdin or sys.stdin, out)
    env = _make(args, _splits(args.split)[0], render_mode="ansi")
    try:
        observation, info = env.reset(seed=args.seed)
        print(f"== {args.env_id} | task {info['task_id']} | max {info['max_steps']} steps ==", file=out)
        print(observation, file=out)
        help_text = play_help(list(getattr(env.unwrapped, "tool_names", PLAY_SHORTHANDS)))
        print(f"\n{help_text}", file=out)
        _show_candidates(info, out)
        total = 0.0
        while True:
            line = read_line()
            if line is None:
                print("\n(end of input: episode abandoned)", file=out)
                return 0
            if not line.strip():  # an empty line costs no step: it asks again
                continue
            if line.strip() in (":quit", ":q"):
                return 0
            if line.strip() == ":help":
                print(help_text, file=out)
                continue
            if line.strip() == ":render":
                print(env.render(), file=out)
                continue
            action = _shorthand(line, info.get("candidates"))
            observation, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            parts = ", ".join(f"{k} {v:+.2f}" for k, v in info["reward_components"].items() if v)
            print(observation, file=out)
            fault = info.get("fault") or {}
            if fault:
                print(f"[fault: {fault.get('type')} (status {fault.get('status')}, {fault.get('origin')})]", file=out)
            print(
                f"[step {info['step']} | reward {reward:+.2f}{' (' + parts + ')' if parts else ''} | return {total:+.2f}]",
                file=out,
            )
            if terminated or truncated:
                verdict = "SOLVED" if info["success"] else "NOT SOLVED"
                comps = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in info["task_components"].items())
                print(f"\n== {verdict} | {comps} | return {total:+.2f} ==", file=out)
                return 0
            _show_candidates(info, out)
    finally:
        env.close()


def _line_reader(stdin: TextIO, out: TextIO) -> Callable[[], str | None]:
    """What ``play`` reads its lines with: ``None`` at the end of input.

    At a terminal it is :func:`input` with :mod:`readline` (arrow keys, history) where Python has it;
    from a pipe or file, plain lines.
    """
    if stdin is sys.stdin and out is sys.stdout and stdin.isatty():
        with contextlib.suppress(ImportError):  # no readline on Windows: input() without line editing
            import readline  # noqa: F401  (imported for its side effect on input())

        def read_terminal() -> str | None:
            print(file=out)
            try:
                return input("> ")
            except EOFError:
                return None

        return read_terminal

    def read_stream() -> str | None:
        print("\n> ", end="", file=out, flush=True)
        line = stdin.readline()
        return line.rstrip("\n") if line else None

    return read_stream


def _show_candidates(info: dict[str, Any], out: TextIO) -> None:
    for i, cand in enumerate(info.get("candidates") or [], 1):
        print(f"  [{i}] {cand[:300]}", file=out)


def _shorthand(line: str, candidates: list[str] | None) -> str:
    text = line.strip()
    if candidates and text.isdigit() and 1 <= int(text) <= len(candidates):
        return candidates[int(text) - 1]
    head, _, rest = text.partition(" ")
    if head == "sql" and rest:
        return format_call("sql", {"query": rest})
    if head == "python" and rest:
        return format_call("python", {"code": rest.replace("\\n", "\n")})
    if head == "finish":
        return format_call("finish", {"answer": rest})
    if head == "http" and rest:
        arguments = _http_shorthand(rest)
        if arguments is not None:
            return format_call("http", arguments)
    if head == "smtp" and rest.startswith("{"):
        try:
            arguments = json.loads(rest)
        except (ValueError, RecursionError):
            return line  # the env explains what is wrong with it
        if isinstance(arguments, dict):
            return format_call("smtp", arguments)
    return line


def _http_shorthand(rest: str) -> dict[str, Any] | None:
    """``METHOD /path[?k=v&...] [JSON body]`` as the http tool's arguments (None: not that shape; the
    line then goes to the env as typed, which explains what is wrong with it)."""
    method, _, tail = rest.strip().partition(" ")
    target, _, body_text = tail.strip().partition(" ")
    if not target.startswith("/"):
        return None
    path, _, query_text = target.partition("?")
    arguments: dict[str, Any] = {"method": method.upper(), "path": path}
    if query_text:
        arguments["query"] = {k: _scalar(v) for k, v in urllib.parse.parse_qsl(query_text, keep_blank_values=True)}
    if body_text.strip():
        try:
            body = json.loads(body_text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(body, dict):
            return None
        arguments["body"] = body
    return arguments


def _scalar(text: str) -> Any:
    """A query value as the JSON number or boolean it spells (``limit=5`` is 5), else the text."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, (int, float, bool)) else text


# ---------------------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import socket

    from agentrl_envs.backends.http import TOKEN_ENV
    from agentrl_envs.faults import load_profile
    from agentrl_envs.server.processes import serve
    from agentrl_envs.server.simulator import ServeLimits, check_bind

    profile = load_profile(args.profile)
    for flag, value in (("--sql-deadline-s", args.sql_deadline_s), ("--python-timeout-s", args.python_timeout_s)):
        if not 0 < value <= MAX_SERVICE_S:  # also refuses nan and inf, which argparse's float accepts
            raise agentrl_envs.ConfigError(
                f"{flag} {value}: use a finite number of seconds above 0 and at most {MAX_SERVICE_S:g} (a day), e.g. 5.0"
            )
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    check_bind(args.host, token)
    limits = ServeLimits(
        python_workers=args.python_workers,
        per_client=args.per_client,
        max_upload_bytes=args.max_upload_mb << 20,
        max_episodes=args.max_episodes,
        episode_idle_s=args.episode_idle_s,
    )
    auth = "bearer token required" if token else "no token"
    if args.workers > 1:
        from agentrl_envs.server import processes

        sockets = processes.bind(args.host, args.port, args.workers)
        urls = ",".join(f"http://{args.host}:{s.getsockname()[1]}" for s in sockets)
        print(
            f"agentrl simulator on {urls} ({args.workers} worker processes: give clients all the URLs, e.g. "
            f"backend='{urls}'; profile {profile.name}, {auth}); OpenAPI at /openapi.json; Ctrl-C stops it",
            flush=True,
        )
        config = processes.WorkerConfig(profile, args.sql_deadline_s, args.python_timeout_s, token, limits)
        return processes.supervise(sockets, config)
    port = args.port
    try:
        with socket.create_server((args.host, port)) as probe:
            port = probe.getsockname()[1]
    except OSError as exc:
        raise agentrl_envs.ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    print(
        f"agentrl simulator on http://{args.host}:{port} (profile {profile.name}, "
        f"{auth}); OpenAPI at /openapi.json; Ctrl-C stops it",
        flush=True,
    )
    return serve(
        args.host,
        port,
        profile,
        token=token,
        limits=limits,
        sql_deadline_s=args.sql_deadline_s,
        python_timeout_s=args.python_timeout_s,
    )


# ---------------------------------------------------------------------------------------- mcp, openenv


def cmd_mcp(args: argparse.Namespace) -> int:
    from agentrl_envs.integrations.mcp_server import MCPLimits, serve_mcp

    _check_id(args.env_id)
    kwargs = {**_make_kwargs(args, _splits(args.split)[0]), "backend": args.backend}
    limits = MCPLimits(max_sessions=args.max_sessions, idle_s=args.idle_s)
    return serve_mcp(args.env_id, kwargs, transport=args.transport, host=args.host, port=args.port, seed=args.seed, limits=limits)


def cmd_openenv(args: argparse.Namespace) -> int:
    from agentrl_envs.integrations.openenv_server import serve_openenv

    _check_id(args.env_id)
    kwargs = {**_make_kwargs(args, _splits(args.split)[0]), "backend": args.backend}
    return serve_openenv(
        args.env_id, kwargs, host=args.host, port=args.port, seed=args.seed, max_sessions=args.max_sessions, idle_s=args.idle_s
    )


# ---------------------------------------------------------------------------------------- pg-sweep


def cmd_pg_sweep(args: argparse.Namespace) -> int:
    from agentrl_envs.backends.postgres import sweep

    if not args.url.strip():  # libpq would take it for "the local server's defaults", then drop what it finds there
        raise agentrl_envs.ConfigError(
            "the URL is empty: give postgresql://user:password@host:port/dbname of the backends' account"
        )
    report = sweep(args.url, dry_run=args.dry_run)
    verb = "would drop" if args.dry_run else "dropped"
    for name in report.schemas:
        print(f"{verb} schema {name}")
    for name in report.roles:
        print(f"{verb} role {name}")
    for name, message in report.errors:
        print(f"agentrl-envs: error: could not drop {name}: {message}", file=sys.stderr)
    print(
        f"{len(report.schemas)} schema(s) and {len(report.roles)} role(s) {verb}; "
        f"{len(report.kept)} kept (live backends); {len(report.errors)} error(s)"
    )
    return 1 if report.errors else 0


# ---------------------------------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agentrl_envs.agents import OracleAgent, RandomAgent

    splits = _splits(args.split)
    _check_id(args.env_id)
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
        env = _make(args, split)
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
        _table(
            ["split", "domain", "episodes", "success", "mean return", "mean steps"],
            [(s, d, n, f"{sr:.1%}", f"{mr:+.3f}", f"{ms:.1f}") for s, d, n, sr, mr, ms in rows],
            sys.stdout,
        )
    return 0


def _openai_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--agent openai (any OpenAI-compatible /v1/chat/completions endpoint)")
    g.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000")
    g.add_argument("--model", default=None, help="the request's model field (an adapter name on agentrl-train serve)")
    g.add_argument(
        "--api-key-env", metavar="VAR", default=None, help="environment variable holding the API key (none sent otherwise)"
    )
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature (the server's default otherwise)")
    g.add_argument("--max-tokens", type=_positive, default=None, help="completion token limit per turn")
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


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    print(format_table(header, rows), file=out)


if __name__ == "__main__":
    sys.exit(main())
