"""The argparse types and option groups several ``agentrl-envs`` commands share, and the env they make."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import agentrl_envs
from agentrl_envs.core.options import MAX_CANDIDATES, MAX_SERVICE_S
from agentrl_envs.tasks.sampler import SPLITS

#: ``--seed`` at most (seeds are stored as int64, e.g. in export-sft's Parquet)
MAX_SEED = (1 << 63) - 1


#: ``serve --max-upload-mb`` at most: 1 TiB, ``ServeLimits.max_upload_bytes``'s limit
MAX_UPLOAD_MB = 1 << 20


def env_args(p: argparse.ArgumentParser, split_default: str = "train") -> None:
    p.add_argument("env_id", metavar="ID", help="environment id, e.g. AgentRL/SQL-v0 (see 'agentrl-envs list')")
    p.add_argument("--split", default=split_default, help=f"split, or a comma-separated list ({', '.join(SPLITS)})")
    p.add_argument("--domain", default=None, help="restrict to one domain of the split")
    p.add_argument(
        "--candidates", type=int_in(0, MAX_CANDIDATES), default=0, help=f"show K candidate actions each step, 0-{MAX_CANDIDATES}"
    )
    p.add_argument("--long-horizon", action="store_true", help="chained sub-tasks (SQLPythonSMTP only)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="step limit (default: 3 x the gold plan's calls + 4)")
    p.add_argument(
        "--error-profile",
        default="none",
        metavar="NAME|PATH",
        help="fault profile: a shipped name (realistic, flaky, outage, rate-limited, auth-expiry) or a YAML path (default none)",
    )


def episode_server_args(p: argparse.ArgumentParser, port: int) -> None:
    """The options ``mcp`` and ``openenv`` share (besides the env's, from :func:`env_args`)."""
    p.add_argument("--backend", default="sim", help="where tool calls go: sim (default), direct, or http://host:port")
    p.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        default=None,
        help="seed of a session's first episode when the client gives none (default: a fresh one per session)",
    )
    p.add_argument("--host", type=host_type, default="127.0.0.1", help="address to listen on over HTTP (default 127.0.0.1)")
    p.add_argument("--port", type=port_type, default=port, help=f"port over HTTP (default {port}; 0 picks a free one)")
    p.add_argument("--max-sessions", type=int_in(1, 1 << 16), default=64, help="sessions open at once, 1-65536 (default 64)")
    p.add_argument(
        "--idle-s", type=seconds_type, default=900.0, help="close a session without a request for this many seconds (default 900)"
    )


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``lo`` to ``hi``."""

    def parse(text: str) -> int:
        value = _int(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {text[:40]!r}")
        return value

    return parse


def seconds_type(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 and at most ``MAX_SERVICE_S`` (a day)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SERVICE_S:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected seconds above 0 and at most {MAX_SERVICE_S:g} (a day), got {text[:40]!r}")
    return value


def host_type(text: str) -> str:
    """An argparse type: a host name or IP address (at most 253 characters, no spaces or control characters)."""
    if not text or len(text) > 253 or not text.isprintable() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"expected a host name or IP address such as 127.0.0.1 (0.0.0.0 for every interface), got {text[:40]!r}"
        )
    return text


def port_type(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None


def check_id(env_id: str) -> None:
    if env_id not in agentrl_envs.ALL_IDS:
        raise agentrl_envs.ConfigError(f"unknown environment {env_id[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")


def make_env(args: argparse.Namespace, split: str, **extra: Any) -> gym.Env[str, str]:
    check_id(args.env_id)
    return gym.make(args.env_id, **make_kwargs(args, split), **extra)


def make_kwargs(args: argparse.Namespace, split: str) -> dict[str, Any]:
    """The ``gym.make`` keywords of :func:`env_args`' options."""
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


def parse_splits(text: str) -> list[str]:
    splits = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if not splits or bad:
        raise agentrl_envs.ConfigError(f"--split {text[:60]!r}: use one or more of {', '.join(SPLITS)}, comma-separated")
    return splits
