"""What the two in-process backends (``sim`` and ``direct``) share: the simulator they drive."""

from __future__ import annotations

from simulators import SimulatorApp
from simulators.python import RunLimits

__all__ = ["InProcessSimulator", "make_app"]


def make_app(
    sql_deadline_s: float, python_timeout_s: float, python_sandbox: bool, allow_unsafe_sandbox: bool, lazy_python: bool
) -> SimulatorApp:
    """A simulator for one backend; a Python run gets ``python_timeout_s`` of wall time and as much CPU."""
    limits = RunLimits(wall_s=python_timeout_s, cpu_s=max(1, int(python_timeout_s + 0.999)))
    return SimulatorApp(
        sql_deadline_s=sql_deadline_s,
        python_limits=limits,
        python_sandbox=python_sandbox,
        allow_unsafe_sandbox=allow_unsafe_sandbox,
        lazy_python=lazy_python,
    )


class InProcessSimulator:
    """A backend over ``self.app``: what its Python service says of itself."""

    app: SimulatorApp

    @property
    def sandbox_tier(self) -> str:
        """The simulator's Python isolation tier (starts its runner if ``lazy_python`` left it unstarted)."""
        return self.app.sandbox_tier

    @property
    def numpy_available(self) -> bool:
        """Whether agent programs can import numpy (starts the runner, as :attr:`sandbox_tier`)."""
        return self.app.numpy_available
