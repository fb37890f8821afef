"""Real servers for integration tests, each started on 127.0.0.1 with a free port and stopped after.

A missing server binary skips the test with the reason, except under CI
(``AGENTRL_REQUIRE_INTEGRATION=1``), where it fails.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrl_envs.testing import free_port, simulator_server, wait_http
from tests.conftest import require_integration

__all__ = [
    "PostgresCluster",
    "agentrl_leftovers",
    "free_port",
    "postgres_cluster",
    "simulator_server",
    "smtp_server",
    "unavailable",
    "wait_http",
]


def unavailable(reason: str) -> None:
    if require_integration():
        pytest.fail(f"integration server unavailable under AGENTRL_REQUIRE_INTEGRATION=1: {reason}")
    pytest.skip(reason)


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


#: The least-privilege account of docs/guide/backends.md for the PostgreSQL backend, run by the cluster's superuser.
LEAST_PRIVILEGE_SETUP = (
    "CREATE ROLE agentrl LOGIN CREATEROLE PASSWORD {password}",
    "CREATE DATABASE agentrl",
    "GRANT CREATE ON DATABASE agentrl TO agentrl",
    "REVOKE TEMPORARY ON DATABASE agentrl FROM PUBLIC",
)


@dataclass(frozen=True)
class PostgresCluster:
    """A running throwaway cluster: ``url`` is docs/guide/backends.md's least-privilege account, ``super_url`` the superuser."""

    url: str
    super_url: str


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl in a temp dir) with docs/guide/backends.md's role set up."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's postgresql package")
    run_as: list[str] = []
    owner: int | None = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            owner = pwd.getpwnam("postgres").pw_uid
        except KeyError:
            unavailable("running as root and there is no 'postgres' user to run initdb as")
        run_as = ["runuser", "-u", "postgres", "--"]
    base = tempfile.mkdtemp(prefix="agentrl-pg-")
    data, sock = Path(base, "data"), Path(base, "sock")
    pwfile = Path(base, "pw")
    password = "agentrl-test"
    pwfile.write_text(password)
    sock.mkdir()
    if owner is not None:
        for p in (base, sock, pwfile):
            os.chown(p, owner, -1)
    port = free_port()
    try:
        subprocess.run(
            [
                *run_as,
                initdb,
                "-D",
                str(data),
                "-U",
                "pgsuper",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(data), "-o", opts, "-l", str(Path(base, "log")), "-w", "-t", "60", "start"],
            check=True,
            capture_output=True,
            timeout=90,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {exc.stderr.decode(errors='replace')[-2000:]}") from None
    try:
        import psycopg

        with psycopg.connect(f"postgresql://pgsuper:{password}@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            for statement in LEAST_PRIVILEGE_SETUP:
                conn.execute(statement.format(password="'" + password + "'"))
        yield PostgresCluster(
            url=f"postgresql://agentrl:{password}@127.0.0.1:{port}/agentrl",
            super_url=f"postgresql://pgsuper:{password}@127.0.0.1:{port}/agentrl",
        )
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def agentrl_leftovers(super_url: str) -> list[str]:
    """Every ``agentrl_*`` schema and role in the cluster (docs/guide/backends.md's admin role itself aside)."""
    import psycopg

    with psycopg.connect(super_url) as conn:
        rows = conn.execute(
            "SELECT 'schema ' || nspname FROM pg_namespace WHERE nspname LIKE 'agentrl\\_%' "
            "UNION ALL SELECT 'role ' || rolname FROM pg_roles WHERE rolname LIKE 'agentrl\\_%' ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in rows]


@contextlib.contextmanager
def smtp_server() -> Iterator[tuple[str, list[Any]]]:
    """An aiosmtpd server; yields (smtp://127.0.0.1:port, list of received envelopes)."""
    try:
        from aiosmtpd.controller import Controller
    except ImportError:
        unavailable("aiosmtpd is not installed (pip install aiosmtpd)")
    received: list[Any] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            received.append(envelope)
            return "250 OK"

    # Controller(port=0) cannot report the port it bound, so pick a free one first.
    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield f"smtp://127.0.0.1:{port}", received
    finally:
        controller.stop()
