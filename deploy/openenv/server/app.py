"""The app that ``openenv.yaml`` and the Dockerfile serve: the agentrl envs as one OpenEnv environment.

Environment variables: ``AGENTRL_ENV_ID`` (the default id, ``AgentRL/SQL-v0``; a client's reset may
pick any registered id), ``AGENTRL_ERROR_PROFILE`` (default ``none``), ``AGENTRL_MAX_SESSIONS``
(default 64) and ``AGENTRL_IDLE_S`` (default 900).
"""

from __future__ import annotations

import os

from agentrl_envs.integrations.openenv_server import make_app

app = make_app(
    os.environ.get("AGENTRL_ENV_ID", "AgentRL/SQL-v0"),
    {"error_profile": os.environ.get("AGENTRL_ERROR_PROFILE", "none")},
    max_sessions=int(os.environ.get("AGENTRL_MAX_SESSIONS", "64")),
    idle_s=float(os.environ.get("AGENTRL_IDLE_S", "900")),
)
