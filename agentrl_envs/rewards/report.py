"""Deprecated alias of :mod:`agentrl_envs.analysis.report` (kept for one release, then removed).

The check-rewards code drives envs with agents, so it sits above the env core rather than in
``rewards``. Import ``agentrl_envs.analysis.report`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentrl_envs.analysis import report as _moved
from agentrl_envs.analysis.report import *  # noqa: F403  (the alias re-exports the public names)
from agentrl_envs.analysis.report import __all__ as __all__

warnings.warn(
    "agentrl_envs.rewards.report moved to agentrl_envs.analysis.report; import it from there "
    "(the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
