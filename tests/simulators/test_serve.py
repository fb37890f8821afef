"""``agentrl-envs serve`` over real HTTP on loopback: bearer token, bind rules, ownership, admission limits.

The server runs in this process (uvicorn in a thread, on a socket bound to 127.0.0.1:0). Slow Python
calls are a runner that blocks until the test opens a gate, so every assertion is about counts and
order (what has started, what has finished), never about how long something took.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import uvicorn

from agentrl_envs.backends.base import DatabaseSpec, EpisodeSetup, ToolRequest
from agentrl_envs.backends.http import TOKEN_ENV, HTTPBackend
from agentrl_envs.cli import main as cli
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import load_profile
from agentrl_envs.server.processes import serve
from agentrl_envs.server.simulator import ServeLimits, SimulatorServer, check_bind
from agentrl_envs.tasks.domains.base import fingerprint
from simulators import SimulatorApp
from simulators.app import EPISODE_TOKEN_HEADER, template_fingerprint
from simulators.python.subprocess_runner import PythonResult

TOKEN = "s3cret-token-for-tests-0123456789"
TABLES: dict[str, Any] = {"t": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": [[1, "a"], [2, "b"], [3, "c"]]}}
FP = template_fingerprint("t", TABLES)
WAIT_STEPS = 6000  # polls of 10 ms: a hang detector, not a speed limit


def wait_for(what: str, predicate: Callable[[], bool]) -> None:
    for _ in range(WAIT_STEPS):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


class GatedRunner:
    """A Python service whose runs block until ``gate`` opens; counts runs started and finished."""

    tier = "BASIC"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = 0
        self.finished = 0
        self._lock = threading.Lock()

    def run(self, code: str, workspace: str, limits: object = None) -> PythonResult:
        with self._lock:
            self.started += 1
        self.gate.wait(timeout=WAIT_STEPS * 0.01)
        with self._lock:
            self.finished += 1
        return PythonResult(0, f"ran {code}\n", "", False, False, 0.0)

    def close(self) -> None:
        self.gate.set()


@contextlib.contextmanager
def running(server: SimulatorServer) -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(server, log_level="warning", access_log=False, lifespan="on"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for("the server to start", lambda: uv.started)
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=60)
        sock.close()


def gated_server(**kwargs: Any) -> tuple[SimulatorServer, GatedRunner]:
    app = SimulatorApp(python_sandbox=False)
    app.runner.close()
    runner = GatedRunner()
    app.runner = runner  # type: ignore[assignment]
    return SimulatorServer(app=app, **kwargs), runner


def open_episode(client: httpx.Client, episode_id: str, database: str | None = None) -> str:
    if database is not None:
        assert client.put(f"/v1/databases/{database}", json={"tables": TABLES}).status_code == 204
    r = client.post("/v1/episodes", json={"episode_id": episode_id, "database": database})
    assert r.status_code == 201, r.text
    return str(r.json()["result"]["episode_token"])


# -- item: one client's slow calls do not stall the others ----------------------------------------


def test_slow_python_calls_do_not_block_health_or_sql_of_another_client() -> None:
    server, runner = gated_server(limits=ServeLimits(python_workers=4, queue_per_worker=1))
    with (
        running(server) as url,
        httpx.Client(base_url=url, timeout=120) as slow,
        httpx.Client(base_url=url, timeout=120) as other,
    ):
        tokens = [open_episode(slow, f"slow-{i}") for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            calls = [
                pool.submit(
                    slow.post, f"/v1/episodes/slow-{i}/python", json={"code": f"#{i}"}, headers={EPISODE_TOKEN_HEADER: tokens[i]}
                )
                for i in range(8)
            ]
            wait_for("4 runs started and 4 waiting", lambda: runner.started == 4 and server.in_flight()["python"] == 8)
            # The other client is served while all 8 slow calls are still in flight.
            assert other.get("/health").status_code == 200
            token = open_episode(other, "quick", FP)
            r = other.post(
                "/v1/episodes/quick/sql", json={"query": "SELECT count(*) FROM t"}, headers={EPISODE_TOKEN_HEADER: token}
            )
            assert r.status_code == 200 and r.json()["result"]["rows"] == [[3]]
            assert other.get("/openapi.json").status_code == 200
            # The Python lane is full (4 running + 4 waiting): a ninth call is told to come back.
            busy = other.post("/v1/episodes/quick/python", json={"code": "9"}, headers={EPISODE_TOKEN_HEADER: token})
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["type"] == "server_busy"
            assert runner.finished == 0 and not any(c.done() for c in calls)
            runner.gate.set()
            answers = [c.result() for c in calls]
        assert [a.status_code for a in answers] == [200] * 8
        assert sorted(a.json()["result"]["stdout"] for a in answers) == sorted(f"ran #{i}\n" for i in range(8))
        assert runner.finished == 8 and server.in_flight() == {"python": 0, "sql": 0, "control": 0}


def test_one_client_is_held_to_its_own_limit_but_health_is_not() -> None:
    server, runner = gated_server(limits=ServeLimits(per_client=2))
    with running(server) as url, httpx.Client(base_url=url, timeout=120) as client:
        tokens = [open_episode(client, f"e{i}", FP if i == 0 else None) for i in range(2)]
        with ThreadPoolExecutor(2) as pool:
            calls = [
                pool.submit(
                    client.post, f"/v1/episodes/e{i}/python", json={"code": "x"}, headers={EPISODE_TOKEN_HEADER: tokens[i]}
                )
                for i in range(2)
            ]
            wait_for("2 runs started", lambda: runner.started == 2)
            r = client.post("/v1/episodes/e0/sql", json={"query": "SELECT 1"}, headers={EPISODE_TOKEN_HEADER: tokens[0]})
            assert r.status_code == 429 and "client" in r.json()["error"]["message"]
            assert client.get("/health").status_code == 200
            runner.gate.set()
            assert [c.result().status_code for c in calls] == [200, 200]
        r = client.post("/v1/episodes/e0/sql", json={"query": "SELECT 1"}, headers={EPISODE_TOKEN_HEADER: tokens[0]})
        assert r.status_code == 200
        assert server.busy_answers == 1


def test_the_http_backend_waits_out_a_busy_server() -> None:
    server, runner = gated_server(limits=ServeLimits(python_workers=1, queue_per_worker=0))
    with running(server) as url, httpx.Client(base_url=url, timeout=120) as raw:
        token = open_episode(raw, "hog")
        backend = HTTPBackend(url)
        try:
            backend.open_episode(EpisodeSetup("polite", None))
            with ThreadPoolExecutor(2) as pool:
                hog = pool.submit(raw.post, "/v1/episodes/hog/python", json={"code": "h"}, headers={EPISODE_TOKEN_HEADER: token})
                wait_for("the hog to run", lambda: runner.started == 1)
                polite = pool.submit(backend.handle, ToolRequest("polite", "python", {"code": "p"}))
                wait_for("a busy answer", lambda: server.busy_answers >= 1)
                assert not polite.done()
                runner.gate.set()
                response = polite.result()
                assert hog.result().status_code == 200
            assert response.ok and response.result["stdout"] == "ran p\n"
        finally:
            backend.close()


@pytest.mark.parametrize(
    "field, value", [("python_workers", 0), ("per_client", -1), ("workers", 1.5), ("queue_per_worker", -1), ("sql_workers", True)]
)
def test_bad_limits_are_config_errors(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        ServeLimits(**{field: value})


# -- bearer token -----------------------------------------------------------------------------------


@pytest.fixture
def secured() -> Iterator[str]:
    server = SimulatorServer(token=TOKEN, app=SimulatorApp(python_sandbox=False))
    with running(server) as url:
        yield url


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer  x", f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Bearer {TOKEN.upper()}"],
    ids=["missing", "empty", "no-token", "other", "basic", "short", "long", "case"],
)
def test_missing_or_wrong_token_is_401_on_every_route(secured: str, authorization: str | None) -> None:
    headers = {"authorization": authorization} if authorization is not None else {}
    with httpx.Client(base_url=secured, headers=headers) as client:
        for method, path, body in (
            ("POST", "/v1/episodes", {"episode_id": "e"}),
            ("PUT", f"/v1/databases/{FP}", {"tables": TABLES}),
            ("POST", "/v1/episodes/e/python", {"code": "1"}),
            ("DELETE", "/v1/episodes/e", None),
            ("GET", "/openapi.json", None),
        ):
            r = client.request(method, path, json=body)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["type"] == "unauthorized" and TOKEN_ENV in r.json()["error"]["message"]
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert client.get("/health").status_code == 200  # liveness probes need no token


def test_head_is_answered_as_get_without_the_body(secured: str) -> None:
    # HEAD /health and HEAD /openapi.json were 404 (and every HEAD 401 without a token, /health's too)
    auth = {"authorization": f"Bearer {TOKEN}"}

    def same(client: httpx.Client, path: str, headers: dict[str, str]) -> int:
        got, head = client.get(path, headers=headers), client.head(path, headers=headers)
        assert head.status_code == got.status_code and head.content == b"", (path, head.status_code, got.text)
        for name in ("content-type", "content-length", "www-authenticate", "retry-after"):
            assert head.headers.get(name) == got.headers.get(name), (path, name)
        return got.status_code

    with httpx.Client(base_url=secured) as client, httpx.Client(base_url=secured, headers=auth) as authed:
        assert same(client, "/health", {}) == 200  # liveness probes need no token, by HEAD too
        assert same(client, "/openapi.json", {}) == 401
        assert same(client, "/openapi.json", auth) == 200
        assert same(client, "/nowhere", auth) == 404
        token = open_episode(authed, "ep-head")
        owner = {**auth, EPISODE_TOKEN_HEADER: token}
        assert client.put("/v1/episodes/ep-head/files/a.txt", json={"text": "hello"}, headers=owner).status_code < 300
        assert same(client, "/v1/episodes/ep-head/files/a.txt", owner) == 200
        assert same(client, "/v1/episodes/ep-head/files/b.txt", owner) == 404
        assert same(client, "/v1/episodes/ep-head/files/a.txt", auth) == 403  # not the episode's owner


def test_the_http_backend_sends_the_token(secured: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    setup = EpisodeSetup("ep-tok", DatabaseSpec(FP, TABLES))
    without = HTTPBackend(secured)
    with pytest.raises(ConfigError, match=TOKEN_ENV):
        without.open_episode(setup)
    without.close()
    for backend in (HTTPBackend(secured, token=TOKEN), _from_env(secured, monkeypatch)):
        try:
            backend.open_episode(setup)
            response = backend.handle(ToolRequest("ep-tok", "sql", {"query": "SELECT v FROM t ORDER BY id"}))
            assert response.ok and response.result["rows"] == [["a"], ["b"], ["c"]]
            assert backend.sandbox_tier == "BASIC"
            backend.close_episode("ep-tok")
        finally:
            backend.close()


def _from_env(url: str, monkeypatch: pytest.MonkeyPatch) -> HTTPBackend:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return HTTPBackend(url)


def test_clients_sharing_the_bearer_token_still_cannot_hijack_episodes(secured: str) -> None:
    victim, thief = HTTPBackend(secured, token=TOKEN), HTTPBackend(secured, token=TOKEN)
    try:
        victim.open_episode(EpisodeSetup("victim", DatabaseSpec(FP, TABLES)))
        response = thief.handle(ToolRequest("victim", "sql", {"query": "SELECT 1"}))
        assert response.status == 403 and response.error_type == "forbidden"
        with httpx.Client(base_url=secured, headers={"authorization": f"Bearer {TOKEN}"}) as raw:
            assert raw.post("/v1/episodes", json={"episode_id": "victim"}).status_code == 403
            assert raw.delete("/v1/episodes/victim").status_code == 403
            poison = {"t": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": [[1, "poison"]]}}
            assert raw.put(f"/v1/databases/{FP}", json={"tables": poison}).status_code == 422
        response = victim.handle(ToolRequest("victim", "sql", {"query": "SELECT v FROM t ORDER BY id"}))
        assert response.ok and response.result["rows"] == [["a"], ["b"], ["c"]]
    finally:
        victim.close()
        thief.close()


def test_ownership_holds_with_a_server_side_fault_profile() -> None:
    server = SimulatorServer(load_profile("flaky"), app=SimulatorApp(python_sandbox=False))
    with running(server) as url, httpx.Client(base_url=url) as owner, httpx.Client(base_url=url) as thief:
        token = open_episode(owner, "ep-f", FP)
        for _ in range(5):  # the profile injects faults only into calls that pass the owner check
            r = thief.post("/v1/episodes/ep-f/sql", json={"query": "SELECT 1"})
            assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
        assert thief.delete("/v1/episodes/ep-f").status_code == 403
        r = owner.post("/v1/episodes/ep-f/sql", json={"query": "SELECT 1"}, headers={EPISODE_TOKEN_HEADER: token})
        assert r.status_code != 403


# -- binding ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_needs_no_token(host: str) -> None:
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.com", ""])
def test_a_non_loopback_bind_without_a_token_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=TOKEN_ENV):
        check_bind(host, None)
    check_bind(host, TOKEN)


@pytest.mark.parametrize("token", ["short", "", "has a space in it 0123456789", "tab\there-0123456789", "é" * 20])
def test_weak_or_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        check_bind("0.0.0.0", token)
    with pytest.raises(ConfigError):
        SimulatorServer(token=token, app=SimulatorApp(python_sandbox=False))


def test_cli_refuses_a_public_bind_without_a_token(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve on '0.0.0.0' without a bearer token" in err and TOKEN_ENV in err
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0", "--token", "short"]) == 2


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "1e300", "86401"])
@pytest.mark.parametrize("flag", ["--python-timeout-s", "--sql-deadline-s"])
def test_cli_refuses_a_service_limit_no_run_can_have(
    flag: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"serve was reached with {flag} {value}")

    monkeypatch.setattr("agentrl_envs.server.processes.serve", never)  # never serve forever
    assert cli.main(["serve", "--host", "127.0.0.1", "--port", "0", flag, value]) == 2
    assert f"{flag} {float(value)}: use a finite number of seconds above 0" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serve_itself_refuses_before_binding(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match="without a bearer token"):
        serve(host, 0)
    monkeypatch.setenv(TOKEN_ENV, "tiny")  # the variable is checked like --token
    with pytest.raises(ConfigError, match="at least 16"):
        serve(host, 0)


def test_task_fingerprints_are_what_the_server_accepts() -> None:
    app = SimulatorApp(python_sandbox=False)
    try:
        status, reply = app.put_database(fingerprint("sales", 7, TABLES), {"tables": TABLES})
        assert status == 204, reply
    finally:
        app.close()


# -- the virtual clock header -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e309", "1e300", "-1", "abc", "", "0x10", "1" * 400])
def test_a_virtual_time_that_is_no_finite_time_is_400_and_poisons_nothing(value: str) -> None:
    server = SimulatorServer(load_profile("rate-limited"), app=SimulatorApp(python_sandbox=False))
    with running(server) as url, httpx.Client(base_url=url) as client:
        token = open_episode(client, "ep-at", FP)
        owner = {EPISODE_TOKEN_HEADER: token}
        for _ in range(20):  # enough calls that the profile would have drawn a 429 and kept its window
            r = client.post("/v1/episodes/ep-at/sql", json={"query": "SELECT 1"}, headers={**owner, "X-AgentRL-At": value})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "bad_request" and "X-AgentRL-At" in error["message"] and "0 to 1e+09" in error["message"]
        for step in range(40):  # the clock is untouched: calls at sane times get sane answers
            r = client.post(
                "/v1/episodes/ep-at/sql", json={"query": "SELECT 1"}, headers={**owner, "X-AgentRL-At": str(10.0 * step)}
            )
            assert r.status_code in (200, 429), r.text
            assert float(r.json()["error"]["retry_after_s"] if r.status_code == 429 else 0) <= 10
        r = client.post("/v1/episodes/ep-at/sql", json={"query": "SELECT 1"}, headers=owner)  # absent: time 0
        assert r.status_code in (200, 429), r.text


# -- closing an episode while a call on it is in flight ----------------------------------------------


class CountingLock:
    """A lock that counts the threads waiting to acquire it (so a test can wait for them by count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = threading.Lock()
        self.waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._counter:
            self.waiting += 1
        try:
            return self._lock.acquire(blocking, timeout)
        finally:
            with self._counter:
                self.waiting -= 1

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.mark.parametrize(
    "late_call",
    [
        ("tool", ("ep-c", "python", {"code": "late"})),
        ("put_file", ("ep-c", "notes.txt", {"text": "late"})),
        ("get_file", ("ep-c", "notes.txt")),
    ],
    ids=["python", "put_file", "get_file"],
)
def test_a_close_racing_calls_in_flight_waits_for_them_and_leaks_no_workspace(tmp_path: Any, late_call: Any) -> None:
    app = SimulatorApp(python_sandbox=False, workspace_root=str(tmp_path))
    app.runner.close()
    runner = GatedRunner()
    app.runner = runner  # type: ignore[assignment]
    answers: dict[str, Any] = {}
    try:
        assert app.open_episode({"episode_id": "ep-c", "files": {"notes.txt": "hi"}})[0] == 201
        lock = CountingLock()
        app._episodes["ep-c"].lock = lock  # type: ignore[assignment]

        def call(name: str, method: str, args: tuple[Any, ...]) -> None:
            answers[name] = getattr(app, method)(*args)

        first = threading.Thread(target=call, args=("first", "tool", ("ep-c", "python", {"code": "first"})))
        first.start()
        wait_for("the first call to run", lambda: runner.started == 1)  # it holds the episode, its workspace made
        late = threading.Thread(target=call, args=("late", *late_call))
        late.start()
        wait_for("the late call to wait for the episode", lambda: lock.waiting == 1)
        closer = threading.Thread(target=call, args=("close", "close_episode", ("ep-c",)))
        closer.start()
        wait_for("the close to wait for the episode (or return)", lambda: lock.waiting == 2 or not closer.is_alive())
        closed_early = not closer.is_alive()
        runner.gate.set()
        for thread in (first, late, closer):
            thread.join(timeout=WAIT_STEPS * 0.01)
            assert not thread.is_alive()
        assert answers["first"][0] == 200
        assert answers["late"][0] in (200, 204, 409), answers["late"]
        if answers["late"][0] == 409:
            assert answers["late"][1]["error"]["type"] == "episode_closed"
        assert "ep-c" not in app._episodes
        assert os.listdir(tmp_path) == [], "the episode's workspace outlived its close"
        assert not closed_early, "close_episode returned while a call on the episode was in flight"
    finally:
        runner.gate.set()
        app.close()
