"""``agentrl-envs serve``, ``mcp``, ``openenv`` and ``pg-sweep``: the commands that serve or clean up services."""

from __future__ import annotations

import argparse
import sys

import agentrl_envs
from agentrl_envs.cli.argtypes import (
    MAX_UPLOAD_MB,
    check_id,
    host_type,
    int_in,
    make_kwargs,
    parse_splits,
    port_type,
    seconds_type,
)
from agentrl_envs.core.options import MAX_SERVICE_S


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``agentrl-envs serve``."""
    from agentrl_envs.server.processes import MAX_WORKERS

    p.add_argument(
        "--host",
        type=host_type,
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    p.add_argument("--port", type=port_type, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--profile", default="none", help="fault profile injected server-side (a name or a YAML path)")
    p.add_argument("--sql-deadline-s", type=float, default=2.0, help="deadline of one SQL query in seconds (default 2.0)")
    p.add_argument("--python-timeout-s", type=float, default=5.0, help="wall limit of one Python run in seconds (default 5.0)")
    p.add_argument(
        "--token",
        default=None,
        help="bearer token clients must send (default $AGENTRL_SERVE_TOKEN); required unless --host is a loopback address",
    )
    p.add_argument("--python-workers", type=int_in(1, 4096), default=4, help="threads running Python calls, 1-4096 (default 4)")
    p.add_argument(
        "--per-client",
        type=int_in(1, 4096),
        default=1024,
        help="calls one client address may have in flight, 1-4096 (every loopback client shares one); 429 past it (default 1024)",
    )
    p.add_argument(
        "--workers",
        type=int_in(1, MAX_WORKERS),
        default=1,
        help=f"server processes, 1-{MAX_WORKERS}, one port each from --port on (default 1); give clients all the URLs it prints",
    )
    p.add_argument(
        "--max-episodes",
        type=int_in(1, 1 << 24),
        default=8192,
        help="episodes one server process holds open at once; opening one more answers 503 (default 8192)",
    )
    p.add_argument(
        "--episode-idle-s",
        type=seconds_type,
        default=900.0,
        help="close an episode without a call for this many seconds (default 900, 15 minutes)",
    )
    p.add_argument(
        "--max-upload-mb",
        type=int_in(1, MAX_UPLOAD_MB),
        default=1024,
        help=f"largest template database upload in MiB of JSON, 1-{MAX_UPLOAD_MB} (default 1024)",
    )


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


def cmd_mcp(args: argparse.Namespace) -> int:
    from agentrl_envs.integrations.mcp_server import MCPLimits, serve_mcp

    check_id(args.env_id)
    kwargs = {**make_kwargs(args, parse_splits(args.split)[0]), "backend": args.backend}
    limits = MCPLimits(max_sessions=args.max_sessions, idle_s=args.idle_s)
    return serve_mcp(args.env_id, kwargs, transport=args.transport, host=args.host, port=args.port, seed=args.seed, limits=limits)


def cmd_openenv(args: argparse.Namespace) -> int:
    from agentrl_envs.integrations.openenv_server import serve_openenv

    check_id(args.env_id)
    kwargs = {**make_kwargs(args, parse_splits(args.split)[0]), "backend": args.backend}
    return serve_openenv(
        args.env_id, kwargs, host=args.host, port=args.port, seed=args.seed, max_sessions=args.max_sessions, idle_s=args.idle_s
    )


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
