"""Process inspection through /proc: kept here for the tests' imports; the code is in :mod:`agentrl_envs.testing`."""

from __future__ import annotations

from agentrl_envs.testing import alive, descendants, parent_of, sandbox_zygotes, with_marker

__all__ = ["alive", "descendants", "parent_of", "sandbox_zygotes", "with_marker"]
