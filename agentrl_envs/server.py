"""Deprecated alias of :mod:`agentrl_envs.simulator_server` (kept for one release, then removed).

The module is the HTTP server of the simulator API (``agentrl-envs serve``); ``server`` was one of three
modules of that name. Import ``agentrl_envs.simulator_server`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl_envs import simulator_server as _moved
from agentrl_envs.simulator_server import *  # noqa: F403  (the alias re-exports the public names)
from agentrl_envs.simulator_server import __all__ as __all__

warnings.warn(
    "agentrl_envs.server moved to agentrl_envs.simulator_server; import it from there "
    "(the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
