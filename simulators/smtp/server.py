"""Deprecated alias of :mod:`simulators.smtp.mailbox` (kept for one release, then removed).

The module holds a mailbox that validates like a strict mail server, not a server: the name said
otherwise. Import ``simulators.smtp.mailbox`` (or ``simulators.smtp``) instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from simulators.smtp import mailbox as _moved
from simulators.smtp.mailbox import *  # noqa: F403  (the alias re-exports the public names)

warnings.warn(
    "simulators.smtp.server moved to simulators.smtp.mailbox; import it from there (the old path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Forward every other name (constants, private helpers) for one release."""
    return getattr(_moved, name)
