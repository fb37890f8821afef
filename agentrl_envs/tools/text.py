"""Deprecated alias of :mod:`agentrl_envs.observation_text` (kept for one release, then removed).

The module is a text helper shared by the env core and the tools, not a tool, so it left the tools
package. Import ``agentrl_envs.observation_text`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl_envs import observation_text as _moved
from agentrl_envs.observation_text import *  # noqa: F403  (the alias re-exports the public names)
from agentrl_envs.observation_text import __all__ as __all__

warnings.warn(
    "agentrl_envs.tools.text moved to agentrl_envs.observation_text; import it from there "
    "(the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
