"""Backends: where tool calls go. ``make_backend(spec)`` turns a ``backend=`` value into one."""

from __future__ import annotations

from typing import Any

from agentrl_envs.backends.base import Backend, DatabaseSpec, EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError

__all__ = ["Backend", "DatabaseSpec", "EpisodeSetup", "ToolRequest", "ToolResponse", "make_backend"]


def make_backend(spec: Any = "sim", **options: Any) -> Backend:
    """Build a backend from a ``backend=`` value.

    Args:
        spec: ``"sim"`` (default: in process, over the JSON wire), ``"direct"`` (in process, no
            wire), ``"http://host:port"`` (the simulator API over HTTP; several servers as a list
            of URLs or one string of them separated by commas, episodes spread over them), a dict of per-tool
            backends (see :func:`~agentrl_envs.backends.mounts.make_mounted`), or an object that
            already implements :class:`Backend`.
        options: passed to the backends (``sql_deadline_s``, ``python_timeout_s``).
    """
    if isinstance(spec, dict):
        from agentrl_envs.backends.mounts import make_mounted

        return make_mounted(spec, **options)
    if isinstance(spec, str):
        return _single(spec, **options)
    if isinstance(spec, Backend):
        return spec
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(u, str) for u in spec):
        return _single(",".join(spec), **options)
    raise ConfigError(f"backend={spec!r}: use 'sim', 'direct', 'http://host:port', a dict of per-tool backends, or a Backend")


def _single(spec: str, **options: Any) -> Backend:
    if spec == "sim":
        from agentrl_envs.backends.sim import SimBackend

        return SimBackend(**options)
    if spec == "direct":
        from agentrl_envs.backends.direct import DirectBackend

        return DirectBackend(**options)
    if spec.startswith(("http://", "https://")):
        options = {k: v for k, v in options.items() if k not in ("python_sandbox", "allow_unsafe_sandbox")}
        from agentrl_envs.backends.http import HTTPBackend

        return HTTPBackend(spec, python_timeout_s=options.get("python_timeout_s", 5.0))
    raise ConfigError(
        f"backend={spec[:200]!r}: use 'sim', 'direct' or 'http://host:port' for all tools, or a dict such as "
        "{'default': 'sim', 'sql': 'postgresql://user@host:port/db', 'smtp': 'smtp://host:port'}"
    )
