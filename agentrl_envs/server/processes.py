"""``agentrl-envs serve --workers N``: several server processes, and the process-level tuning of each.

One Python process serves on one core at a time (the GIL), so N processes serve N cores. Episodes
live in the process that opened them, so the processes share nothing: each listens on its own port
(``port .. port + N - 1``, or free ones for port 0), and a client spreads episodes over them by id,
as the ``http`` backend does when given all the URLs (``backend="http://h:p1,http://h:p2"``,
:func:`agentrl_envs.backends.http.shard_of`). A call sent to another process than its episode's is
answered 404 ``unknown_episode``, never served from the wrong state.

The supervisor (the ``serve`` process) binds every socket itself, so no port can be taken between
the printout and the start, and hands each worker its socket; the workers are fresh interpreters
(``python -m agentrl_envs.server.processes``) that read their settings, token included, from a pipe,
never from the command line. Ctrl-C or SIGTERM stops them all; a worker that dies stops the others
and the supervisor exits with status 1, since the episodes it held are gone. A supervisor that dies
without stopping them (SIGKILL, the OOM killer) takes them along: each worker asks the kernel for a
SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and, in case it died before that, checks its
parent is still the supervisor.

Each process, once started (:func:`run`): everything start-up allocated (modules, the app, uvicorn)
is moved out of the cycle collector's reach (``gc.freeze``) and the collection thresholds are raised
(``GC_THRESHOLDS``), so a collection scans the episodes' few objects, not the whole heap.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from agentrl_envs.backends.http import TOKEN_ENV
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import ErrorProfile
from agentrl_envs.server.simulator import ServeLimits, SimulatorServer, check_bind

__all__ = ["GC_THRESHOLDS", "WorkerConfig", "bind", "run", "serve", "supervise", "tune_gc"]

#: ``gc.set_threshold`` of a server process: young collections every 10,000 net allocations
#: instead of 700 (each request allocates and frees hundreds of objects), older ones rarer too.
GC_THRESHOLDS = (10_000, 20, 20)
MAX_WORKERS = 64
#: seconds between checks that every worker is still alive
POLL_S = 0.2
STOP_WAIT_S = 10.0
_WORKER = (sys.executable, "-m", "agentrl_envs.server.processes")


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker process is started with (sent to it as JSON, through a pipe: never a pickle)."""

    profile: ErrorProfile | None
    sql_deadline_s: float
    python_timeout_s: float
    token: str | None
    limits: ServeLimits | None

    def to_json(self) -> bytes:
        """The config as JSON: the profile as its YAML text, the limits as their fields."""
        return json.dumps(
            {
                "profile": None if self.profile is None else self.profile.to_yaml(),
                "sql_deadline_s": self.sql_deadline_s,
                "python_timeout_s": self.python_timeout_s,
                "token": self.token,
                "limits": None if self.limits is None else dataclasses.asdict(self.limits),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkerConfig:
        """The config :meth:`to_json` wrote; the profile and the limits are validated again."""
        from agentrl_envs.faults.profile import parse_profile

        raw = json.loads(data)
        profile = None if raw["profile"] is None else parse_profile(raw["profile"], "<worker config>")
        limits = None if raw["limits"] is None else ServeLimits(**raw["limits"])
        return cls(profile, raw["sql_deadline_s"], raw["python_timeout_s"], raw["token"], limits)


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    profile: ErrorProfile | None = None,
    *,
    token: str | None = None,
    limits: ServeLimits | None = None,
    sql_deadline_s: float = 2.0,
    python_timeout_s: float = 5.0,
    workers: int = 1,
) -> int:
    """Run the server until interrupted; answer the exit status (0 after Ctrl-C or SIGTERM).

    Args:
        host, port: where to listen (with ``workers`` > 1, ports ``port`` .. ``port + workers - 1``,
            or free ones for port 0).
        profile: a server-side fault profile.
        token: the bearer token (default ``$AGENTRL_SERVE_TOKEN``); required unless ``host`` is loopback.
        limits: worker pools and admission bounds.
        sql_deadline_s, python_timeout_s: service limits.
        workers: server processes (see the module's docstring).
    """
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    check_bind(host, token)
    if workers > 1:
        sockets = bind(host, port, workers)
        config = WorkerConfig(profile, sql_deadline_s, python_timeout_s, token, limits)
        return supervise(sockets, config)
    app = SimulatorServer(profile, sql_deadline_s, python_timeout_s, token=token, limits=limits)
    run(app, host=host, port=port)
    return 0


def tune_gc() -> None:
    """Freeze what is allocated so far out of the cycle collector's scans and raise its thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(app: Any, *, host: str | None = None, port: int | None = None, sock: socket.socket | None = None) -> None:
    """Serve ``app`` with uvicorn on ``host:port`` or on a bound ``sock`` until stopped, GC tuned."""
    import uvicorn

    if sock is not None:
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    else:
        config = uvicorn.Config(
            app, host=host or "127.0.0.1", port=port or 0, log_level="warning", access_log=False, lifespan="on"
        )
    config.load()  # imports the loop and protocol modules, so the freeze below covers them
    server = uvicorn.Server(config)
    tune_gc()
    server.run(sockets=[sock] if sock is not None else None)


def bind(host: str, port: int, workers: int) -> list[socket.socket]:
    """Listening sockets for ``workers`` processes: ports ``port + i`` (free ones if ``port`` is 0).

    Raises:
        ConfigError: ``workers`` is out of range or a port cannot be bound.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers={workers!r}: use a whole number from 1 to {MAX_WORKERS} (one per core is a good start)")
    if port and port + workers - 1 > 65535:
        raise ConfigError(f"ports {port}..{port + workers - 1} run past 65535: use a lower --port or fewer --workers")
    sockets: list[socket.socket] = []
    try:
        for i in range(workers):
            want = port + i if port else 0
            try:
                sockets.append(socket.create_server((host, want)))
            except OSError as exc:
                raise ConfigError(f"cannot listen on {host}:{want} (worker {i}): {exc.strerror or exc}") from None
    except ConfigError:
        for s in sockets:
            s.close()
        raise
    return sockets


def supervise(sockets: list[socket.socket], config: WorkerConfig) -> int:
    """Start one worker process per socket and wait; answer the exit status.

    0 when stopped by Ctrl-C or SIGTERM (the workers are stopped first), 1 when a worker died.
    """
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        payload = config.to_json()
        for index, sock in enumerate(sockets):
            proc = subprocess.Popen(
                [*_WORKER, str(sock.fileno()), str(index), str(os.getpid())],
                stdin=subprocess.PIPE,
                pass_fds=(sock.fileno(),),
            )
            assert proc.stdin is not None
            proc.stdin.write(payload)
            proc.stdin.close()
            procs.append(proc)
        for sock in sockets:
            sock.close()  # the workers hold their own copies
        while not stopping:
            dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                print(f"agentrl serve: worker {dead[0][0]} exited with status {dead[0][1]}; stopping the others", file=sys.stderr)
                return 1
            time.sleep(POLL_S)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop_all(procs)
        for sock in sockets:
            sock.close()


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with(parent: int) -> None:
    """SIGTERM this process when ``parent`` dies, by any signal; exit at once if it already has.

    The kernel sends the signal when the thread that started this process exits, the supervisor's
    only thread. The parent can die between our start and the ``prctl``; then we were reparented.
    """
    if sys.platform != "linux":
        return
    from simulators.python.sandbox import _linux

    _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(f"agentrl serve worker: the supervisor (pid {parent}) is gone; exiting")


def _worker_main(argv: list[str]) -> int:
    """A worker process: ``python -m agentrl_envs.server.processes FD INDEX PARENT`` with its config as JSON on stdin."""
    _die_with(int(argv[2]))
    fd, _index = int(argv[0]), int(argv[1])
    config = WorkerConfig.from_json(sys.stdin.buffer.read())
    sock = socket.socket(fileno=fd)
    app = SimulatorServer(
        config.profile, config.sql_deadline_s, config.python_timeout_s, token=config.token, limits=config.limits
    )
    # Ctrl-C reaches the whole process group; uvicorn handles SIGINT and SIGTERM itself.
    run(app, sock=sock)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(_worker_main(sys.argv[1:]))
