"""One sandbox service per process, shared by every simulator (and so every env) in it.

A :class:`SandboxRunner` is a zygote and its warm slots, ~6 processes and ~30 MiB: one per
:class:`~simulators.app.SimulatorApp` would make 64 envs in one process cost 64 of them. A
:class:`SharedSandbox` is a lease on the process's one service for its settings (``allow_unsafe``,
numpy, the workspace caps): the first lease starts it, every lease runs through it with its own
limits, and the last lease to close shuts it down. Runs of different leases never share anything
but the zygote, which holds no run's data: each run still gets its own pid, mount and IPC
namespaces, Landlock domain (its own workspace only) and seccomp filter.

With ``scope="machine"`` a lease goes one step further: it runs through this user's one service
on the machine (:mod:`~simulators.python.sandbox.service`), so the workers of an async vector env
(forked, forkserver or spawned) and any other process of the user share one zygote too. The
default, ``"auto"``, is ``"machine"`` in a multiprocessing child (a vector env's worker) and
``"process"`` elsewhere, where the in-process service is as shared and skips the socket hop;
``AGENTRL_SANDBOX_SCOPE`` sets it for every lease of a process and its children.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import weakref
from typing import Any

from simulators.python.sandbox.host import SandboxError, SandboxRunner
from simulators.python.sandbox.service import SCOPE_ENV, ServiceLease, service_slots
from simulators.python.subprocess_runner import PythonResult, RunLimits

__all__ = ["SCOPES", "SharedSandbox", "live_services", "resolve_scope", "service_slots"]

#: where a lease's service lives: this user's one per machine, this process's own, or ``auto``
#: (the machine's in a multiprocessing child, such as an async vector env's worker; else the process's)
SCOPES = ("auto", "machine", "process")


def resolve_scope(scope: str | None = None) -> str:
    """``"machine"`` or ``"process"`` for ``scope`` (None: ``$AGENTRL_SANDBOX_SCOPE``, else ``"auto"``)."""
    chosen = scope or os.environ.get(SCOPE_ENV) or "auto"
    if chosen not in SCOPES:
        raise ValueError(f"sandbox scope {chosen!r} (argument or {SCOPE_ENV}): use 'auto', 'machine' or 'process'")
    if chosen == "auto":
        return "machine" if multiprocessing.parent_process() is not None else "process"
    return chosen


class _Service:
    def __init__(self, key: tuple[Any, ...], runner: SandboxRunner) -> None:
        self.key = key
        self.runner = runner
        self.leases = 0


_lock = threading.Lock()
_services: dict[tuple[Any, ...], _Service] = {}


def _after_fork_in_child() -> None:
    """A forked child starts with no service of its parent's (each runner adopts itself on first use,
    and the parent's lease counts are not the child's)."""
    global _lock
    _lock = threading.Lock()
    _services.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _release(service: _Service) -> None:
    with _lock:
        service.leases -= 1
        last = service.leases <= 0 and _services.get(service.key) is service
        if last:
            del _services[service.key]
    if last:
        service.runner.close()


def live_services() -> int:
    """How many shared services this process holds (for tests and benchmarks)."""
    with _lock:
        return len(_services)


class SharedSandbox:
    """A lease on a shared sandbox service; the :class:`PythonRunner` interface.

    Args:
        limits: this lease's default limits (other leases keep theirs).
        allow_unsafe: accept tier UNSAFE (a separate service from the safe one).
        numpy, workspace_bytes, workspace_files: as for :class:`SandboxRunner` (leases with
            different values get different services).
        scope: ``"machine"``: this user's one service on the machine, reached over a Unix socket
            (a :class:`ServiceLease`); ``"process"``: this process's own, in process; ``"auto"``:
            the machine's in a multiprocessing child, else the process's. None: the
            ``AGENTRL_SANDBOX_SCOPE`` environment variable, else ``"auto"``.
    """

    def __init__(
        self,
        limits: RunLimits | None = None,
        allow_unsafe: bool = False,
        *,
        numpy: bool = True,
        workspace_bytes: int | None = 64 << 20,
        workspace_files: int = 4096,
        scope: str | None = None,
    ) -> None:
        self.limits = limits or RunLimits()
        self.scope = resolve_scope(scope)
        self._service: _Service | None = None
        self._remote: ServiceLease | None = None
        if self.scope == "machine":
            self._remote = ServiceLease(
                self.limits, allow_unsafe, numpy=numpy, workspace_bytes=workspace_bytes, workspace_files=workspace_files
            )
            self.tier, self.missing = self._remote.tier, list(self._remote.missing)
            self.layers, self.notes = dict(self._remote.layers), list(self._remote.notes)
            self.numpy_available = self._remote.numpy_available
            return
        key = (bool(allow_unsafe), bool(numpy), workspace_bytes, int(workspace_files))
        with _lock:
            service = _services.get(key)
            if service is None:
                runner = SandboxRunner(
                    self.limits,
                    allow_unsafe=allow_unsafe,
                    numpy=numpy,
                    workspace_bytes=workspace_bytes,
                    workspace_files=workspace_files,
                    warm_slots=service_slots(),
                )
                service = _services[key] = _Service(key, runner)
            service.leases += 1
        self._service = service
        self._finalizer = weakref.finalize(self, _release, service)  # a lease dropped unclosed still gives back
        runner = service.runner
        self.tier, self.missing = runner.tier, list(runner.missing)
        self.layers, self.notes = dict(runner.layers), list(runner.notes)
        self.numpy_available = runner.numpy_available

    @property
    def runner(self) -> SandboxRunner:
        """The shared runner behind a ``scope="process"`` lease."""
        if self._remote is not None:
            raise SandboxError("this lease runs through the machine's sandbox service (scope='machine'): it has no runner here")
        if self._service is None:
            raise SandboxError("this SharedSandbox lease is closed")
        return self._service.runner

    @property
    def remote(self) -> ServiceLease | None:
        """The machine service lease behind a ``scope="machine"`` lease (None for ``"process"``)."""
        return self._remote

    def info(self) -> dict[str, Any]:
        """The tier and layers, as :meth:`SandboxRunner.info`."""
        return self._remote.info() if self._remote is not None else self.runner.info()

    def run(self, code: str, workspace: str, limits: RunLimits | None = None) -> PythonResult:
        """Run ``code`` in ``workspace`` through the shared service, with this lease's limits by default."""
        if self._remote is not None:
            return self._remote.run(code, workspace, limits or self.limits)
        return self.runner.run(code, workspace, limits or self.limits)

    def close(self) -> None:
        """Give the lease back; the last one shuts the service down. Idempotent."""
        if self._remote is not None:
            self._remote.close()
            return
        self._service = None
        self._finalizer()

    def __enter__(self) -> SharedSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
