"""What a run inherits from the zygote, and which layers it applies (stdlib only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SETUP_FAILED = 125


@dataclass
class Plan:
    """Layers a run applies. The probe run attempts each one and records whether it held."""

    pidns: bool = False
    subreaper: bool = False
    mntns: bool = False
    ipcns: bool = False
    pid_max: bool = False
    overlay: bool = False
    userns_run: bool = False
    nproc: bool = False
    caps: bool = False
    landlock: int = 0  # ABI version, 0 = off
    seccomp: bool = False


@dataclass
class Context:
    """The zygote's state that every program inherits through fork."""

    plan: Plan
    root: bool
    uid: int  # the ids a run's user namespace maps its root to
    gid: int
    rule_fds: tuple[int, ...]  # O_PATH descriptors of the Landlock rules granted to every run, sorted
    seccomp_filter: Any  # a _seccomp.Prepared, or None
    mnt: str  # mount point of a run's tmpfs (each run has its own mount namespace)
    workspace_bytes: int
    workspace_files: int
    devnull: int
    control_fd: int
    env: dict[str, str]
    #: prepared once in the zygote, so that a run's program only makes system calls with them:
    #: the packed Landlock ruleset attribute and rules (see :func:`._landlock.pack_path_rules`), and the
    #: program's stdio objects (on descriptors 0-2, built where those were a pipe and /dev/null)
    landlock_attr: Any = None
    landlock_rules: Any = None
    streams: dict[str, Any] = field(default_factory=dict)
    numpy_mt_state: int = 0  # see :func:`._program.numpy_mt_state`
    probe: bool = False
    overlaid: bool = False  # the program mounted the overlay over the workspace (the host copies back then)
    prepared: float = 0.0  # when the program had done everything that does not need its request (monotonic)
    applied: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def step(self, name: str, fn: Callable[..., object], *args: Any) -> bool:
        """Apply one layer, ``fn(*args)``. In a normal run a failure raises; in the probe run it is recorded."""
        if not self.probe:
            fn(*args)
            return True
        try:
            fn(*args)
        except (OSError, ValueError) as exc:
            self.applied[name] = False
            self.errors[name] = str(exc)
            return False
        self.applied[name] = True
        return True
