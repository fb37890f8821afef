"""Deprecated alias of :mod:`agentrl_envs.simulator_server_processes` (kept for one release, then removed).

The module runs the simulator server as several processes; its "workers" were easy to take for the
server's thread-pool workers. Import ``agentrl_envs.simulator_server_processes`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl_envs import simulator_server_processes as _moved
from agentrl_envs.simulator_server_processes import *  # noqa: F403  (the alias re-exports the public names)
from agentrl_envs.simulator_server_processes import __all__ as __all__

warnings.warn(
    "agentrl_envs.server_workers moved to agentrl_envs.simulator_server_processes; import it from there "
    "(the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
