"""Deprecated alias of :mod:`agentrl_envs.core` (kept for one release, then removed).

The module holds the env core (:class:`ToolUseEnv`), and ``env`` next to ``envs`` said neither which was
which. Import ``agentrl_envs.core`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl_envs import core as _moved
from agentrl_envs.core import *  # noqa: F403  (the alias re-exports the public names)
from agentrl_envs.core import __all__ as __all__

warnings.warn(
    "agentrl_envs.env moved to agentrl_envs.core; import it from there (the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
