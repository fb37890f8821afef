"""How the PostgreSQL backend classifies a failed connection (no server needed; tests/integration has the real one)."""

from __future__ import annotations

import pickle

import pytest

from agentrl_envs.backends.postgres import _connect_error
from agentrl_envs.errors import PermanentError, TransientError

INFO = {"host": "127.0.0.1", "port": 5432, "user": "agentrl"}
HEAD = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    "message",
    [
        'FATAL:  password authentication failed for user "agentrl"',
        'FATAL:  Peer authentication failed for user "agentrl"',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "agentrl", database "agentrl", no encryption',
        'FATAL:  role "nobody" does not exist',
        'FATAL:  database "nosuchdb" does not exist',
        'FATAL:  role "agentrl" is not permitted to log in',
        "fe_sendauth: no password supplied",
        'FATAL:  permission denied for database "agentrl"',
    ],
)
def test_a_refused_account_is_permanent(message: str) -> None:
    # a wrong password was a TransientError: callers retried it with backoff, and it could never succeed
    err = _connect_error(INFO, Exception(HEAD + message))
    assert isinstance(err, PermanentError) and not isinstance(err, TransientError)
    assert "127.0.0.1:5432" in str(err) and "retrying will not help" in str(err) and message in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


@pytest.mark.parametrize(
    "message",
    [
        "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?",
        "timeout expired",
        "FATAL:  the database system is starting up",
        "FATAL:  sorry, too many clients already",
        "server closed the connection unexpectedly",
        "",
        "\x00\x1b[31m garbage",
    ],
)
def test_an_unreachable_or_busy_server_stays_transient(message: str) -> None:
    err = _connect_error(INFO, Exception(HEAD + message))
    assert isinstance(err, TransientError) and str(err).startswith("cannot connect to PostgreSQL at 127.0.0.1:5432")


def test_a_huge_message_is_cut() -> None:
    err = _connect_error({}, Exception("FATAL:  password authentication failed " + "x" * 1_000_000))
    assert isinstance(err, PermanentError) and "localhost:5432" in str(err) and len(str(err)) < 600
