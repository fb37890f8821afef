"""Deprecated alias of :mod:`simulators.python.subprocess_runner` (kept for one release, then removed).

The module holds :class:`PythonRunner`, one subprocess per run under rlimits; ``runner`` was also the
name of the sandbox's host side. Import ``simulators.python.subprocess_runner`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from simulators.python import subprocess_runner as _moved
from simulators.python.subprocess_runner import *  # noqa: F403  (the alias re-exports the public names)
from simulators.python.subprocess_runner import __all__ as __all__

warnings.warn(
    "simulators.python.runner moved to simulators.python.subprocess_runner; import it from there "
    "(the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
