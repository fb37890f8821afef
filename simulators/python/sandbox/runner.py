"""Deprecated alias of :mod:`simulators.python.sandbox.host` (kept for one release, then removed).

The module is the host side of the sandbox (:class:`SandboxRunner`, the zygote's handle); ``runner`` was
also the name of the subprocess runner one folder up. Import ``simulators.python.sandbox.host`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from simulators.python.sandbox import host as _moved
from simulators.python.sandbox.host import *  # noqa: F403  (the alias re-exports the public names)
from simulators.python.sandbox.host import __all__ as __all__

warnings.warn(
    "simulators.python.sandbox.runner moved to simulators.python.sandbox.host; import it from there "
    "(the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward private names too, so code that reached into the old module keeps working for one release."""
    return getattr(_moved, name)
