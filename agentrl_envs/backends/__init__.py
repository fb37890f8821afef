"""Backends: where tool calls go. ``make_backend(spec)`` turns a ``backend=`` value into one."""

from __future__ import annotations

from typing import Any

from agentrl_envs.backends.base import Backend, DatabaseSpec, EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError

__all__ = ["Backend", "DatabaseSpec", "EpisodeSetup", "ToolRequest", "ToolResponse", "make_backend"]


def make_backend(spec: Any = "sim", **options: Any) -> Backend:
    """Build a backend from a ``backend=`` value.

    Args:
        spec: ``"sim"`` (default), or an object that already implements :class:`Backend`.
        options: passed to the backend (``sql_deadline_s``, ``python_timeout_s``).
    """
    if isinstance(spec, str) and spec == "sim":
        from agentrl_envs.backends.sim import SimBackend

        return SimBackend(**options)
    if not isinstance(spec, str) and isinstance(spec, Backend):
        return spec
    raise ConfigError(
        f"backend={spec!r} is not available: use 'sim' or a Backend instance "
        "(HTTP, PostgreSQL and SMTP backends are added by the simulator-to-real-APIs issue #3)"
    )
