"""The hardened Python sandbox behind the :class:`~simulators.python.PythonRunner` interface.

:class:`SandboxRunner` forks each run from a warm zygote into its own pid, mount, IPC (and shared,
empty network) namespaces, with rlimits, no capabilities, Landlock, seccomp and a capped tmpfs
workspace. ``SandboxRunner.tier`` says how much of that this machine allows: ``"FULL"``,
``"REDUCED"`` (layers missing; a :class:`SandboxWarning` names them) or ``"UNSAFE"`` (rlimits
only; refused unless ``allow_unsafe=True``). See docs/reference/sandbox.md.
"""

from simulators.python.sandbox.host import (
    DEFAULT_PREIMPORT,
    FULL,
    REDUCED,
    UNSAFE,
    SandboxError,
    SandboxRunner,
    SandboxWarning,
)

__all__ = ["DEFAULT_PREIMPORT", "FULL", "REDUCED", "UNSAFE", "SandboxError", "SandboxRunner", "SandboxWarning"]
