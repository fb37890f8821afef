"""Deprecated alias of :mod:`agentrl_envs.registered_envs` (kept for one release, then removed).

The module holds the registered env classes and their env cards; ``envs`` next to ``env`` said neither
which was which. Import ``agentrl_envs.registered_envs`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl_envs import registered_envs as _moved
from agentrl_envs.registered_envs import *  # noqa: F403  (the alias re-exports the public names)
from agentrl_envs.registered_envs import __all__ as __all__

warnings.warn(
    "agentrl_envs.envs moved to agentrl_envs.registered_envs; import it from there (the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
