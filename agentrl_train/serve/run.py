"""Start ``agentrl-train serve``: build the engine (or point at an upstream) and run uvicorn."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["listen", "parse_pairs", "serve", "uvicorn_config"]

TOKEN_ENV = "AGENTRL_SERVE_TOKEN"
ADMIN_TOKEN_ENV = "AGENTRL_SERVE_ADMIN_TOKEN"


def parse_pairs(values: list[str] | None, flag: str, default_name: str | None = None) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict; a bare VALUE takes ``default_name`` when one is given."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, where = value.partition("=")
        if not sep:
            if default_name is None:
                raise ConfigError(f"{flag} {value!r}: use NAME=DIR, e.g. {flag} policy=runs/ppo/final")
            name, where = default_name, value
        if not name or not where:
            raise ConfigError(f"{flag} {value!r}: use NAME=DIR, e.g. {flag} policy=runs/ppo/final")
        if name in out:
            raise ConfigError(f"{flag}: {name!r} is given twice; use one {flag} per name")
        out[name] = where
    return out


def build_app(
    model: str | None,
    adapters: dict[str, str],
    *,
    upstream: str | None = None,
    device: str = "cpu",
    threads: int = 1,
    rope_scaling: dict[str, Any] | None = None,
    token: str | None = None,
    admin_token: str | None = None,
    adapters_root: str | None = None,
    limits: Any = None,
    rules: Any = None,
    max_new_tokens: int = 256,
    watch: dict[str, str] | None = None,
    watch_interval_s: float = 2.0,
    tiny_spec: Any = None,
    log: Callable[[str], None] = print,
) -> Any:
    """The :class:`~agentrl_train.serve.app.ServeApp` for these options (loads the model)."""
    from agentrl_train.serve.app import ServeApp

    for name in watch or {}:
        if name not in adapters:
            raise ConfigError(f"--watch {name}=DIR: {name!r} is not served; add --adapter {name}=DIR (its first version)")
    if upstream is not None:
        if model is not None:
            raise ConfigError("--upstream proxies another server: drop --model (the upstream holds the model)")
        if watch:
            raise ConfigError("--watch needs a local model; with --upstream, load adapters on the upstream")
        if not upstream.startswith(("http://", "https://")):
            raise ConfigError(f"--upstream {upstream!r}: use the server root, e.g. http://127.0.0.1:8001")
        if adapters_root is not None:
            raise ConfigError("--adapters-root is for a local model; with --upstream, the upstream loads adapters")
        if rope_scaling:
            raise ConfigError("--rope-scaling is for a local model; with --upstream, set it on the upstream")
        return ServeApp(
            upstream=upstream.rstrip("/").removesuffix("/v1"),
            adapters=adapters,
            rules=rules,
            token=token,
            admin_token=admin_token,
            limits=limits,
            log=log,
        )
    if model is None:
        raise ConfigError("agentrl-train serve needs --model (tiny or a local model folder) or --upstream URL")
    from agentrl_train.serve.engine import Engine

    engine = Engine(model, device, threads=threads, tiny_spec=tiny_spec, rope_scaling=rope_scaling, log=log)
    return ServeApp(
        engine,
        adapters=adapters,
        rules=rules,
        token=token,
        admin_token=admin_token,
        adapters_root=adapters_root,
        limits=limits,
        max_new_tokens=max_new_tokens,
        watch=watch,
        watch_interval_s=watch_interval_s,
        log=log,
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (a free port for 0: ``getsockname()[1]`` says which).

    Raises:
        ConfigError: the address cannot be bound (in use, not this machine's, not an address).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn picks it
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:  # gaierror included
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); "
            "use another --port (0 for a free one) or an address of this machine"
        ) from None


def uvicorn_config(app: Any, **kwargs: Any) -> Any:
    """uvicorn's config for ``app`` with its :class:`~agentrl_train.serve.limits.ServeLimits` applied:
    the guarded HTTP protocol (head deadline, connection cap), the keep-alive time, h11's head size."""
    import uvicorn

    from agentrl_train.serve.limits import guarded_protocol

    limits = app.limits
    return uvicorn.Config(
        app,
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_head_bytes,
        log_level="warning",
        **kwargs,
    )


def raise_open_files(needed: int, log: Callable[[str], None] = print) -> None:
    """Raise the soft limit of open files to ``needed`` (up to the hard one): 1,024 is the common soft
    default, and a server at its connection cap must still open model files and accept one more."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        new = soft
    if new < needed:
        log(f"serve: open files are limited to {new}; lower --max-connections below {max(new - 64, 1)}")


def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    *,
    sock: socket.socket | None = None,
) -> None:
    """Run ``app`` under uvicorn until interrupted; refuses a non-loopback bind without a token.

    Args:
        sock: a socket from :func:`listen` (to print the port bound for port 0 first); by default one on ``host:port``.
    """
    import uvicorn

    from agentrl_envs.server.simulator import check_bind

    check_bind(host, token)
    if getattr(app, "admin_token", None) is not None:
        check_bind("0.0.0.0", app.admin_token)  # the same strength rule as --token
    raise_open_files(app.limits.max_connections + 256)
    if sock is None:
        sock = listen(host, port)
    server = uvicorn.Server(uvicorn_config(app, lifespan="on"))
    with sock:
        server.run(sockets=[sock])
    if not server.started:  # the app's start-up failed (uvicorn logged why); uvicorn.run exits 3 then too
        sys.exit(3)


def token_from(value: str | None, env: str = TOKEN_ENV) -> str | None:
    return value if value is not None else os.environ.get(env) or None
