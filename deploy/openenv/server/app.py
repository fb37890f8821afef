"""The app that ``openenv.yaml`` and the Dockerfile serve: the agentrl envs as one OpenEnv environment.

Environment variables: ``AGENTRL_ENV_ID`` (the default id, ``AgentRL/SQL-v0``; a client's reset may
pick any registered id), ``AGENTRL_ERROR_PROFILE`` (default ``none``), ``AGENTRL_MAX_SESSIONS``
(default 64) and ``AGENTRL_IDLE_S`` (default 900); for :func:`main`, ``AGENTRL_HOST`` (default
127.0.0.1) and ``AGENTRL_PORT`` (default 8000), which ``--host`` and ``--port`` override::

    python deploy/openenv/server/app.py --port 8000     # or, in deploy/openenv: uv run server
    uvicorn server.app:app --port 8000                  # in deploy/openenv: what openenv.yaml names
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence

from agentrl_envs.integrations.openenv_server import MAX_MESSAGE_BYTES, make_app

app = make_app(
    os.environ.get("AGENTRL_ENV_ID", "AgentRL/SQL-v0"),
    {"error_profile": os.environ.get("AGENTRL_ERROR_PROFILE", "none")},
    max_sessions=int(os.environ.get("AGENTRL_MAX_SESSIONS", "64")),
    idle_s=float(os.environ.get("AGENTRL_IDLE_S", "900")),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve :data:`app` under uvicorn until Ctrl-C (``[project.scripts] server``).

    ``--host`` (default ``AGENTRL_HOST`` or 127.0.0.1: loopback outside a container; the Dockerfile
    passes 0.0.0.0) and ``--port`` (default ``AGENTRL_PORT`` or 8000; 0 picks a free one). Prints
    ``http://HOST:PORT`` once it listens.
    """
    import uvicorn

    parser = argparse.ArgumentParser(prog="server", description="the agentrl envs as an OpenEnv server")
    parser.add_argument("--host", default=os.environ.get("AGENTRL_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("AGENTRL_PORT", "8000")))
    args = parser.parse_args(argv)
    try:
        sock = socket.create_server((args.host, args.port), family=socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    except OSError as exc:
        parser.exit(2, f"server: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}\n")
    env_id = os.environ.get("AGENTRL_ENV_ID", "AgentRL/SQL-v0")
    print(f"agentrl OpenEnv server for {env_id} on http://{args.host}:{sock.getsockname()[1]}; Ctrl-C stops it", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=MAX_MESSAGE_BYTES)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
