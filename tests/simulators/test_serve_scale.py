"""Serving at scale, correctness only: episodes stay on their process, closed episodes free their
state, template uploads past the old 8 MiB cap, the upload limit's error. Speed and memory at
4,096 episodes live in ``benchmarks/bench_serve_scale.py``; nothing here depends on time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from typing import Any

import httpx
import pytest

from agentrl_envs.backends import make_backend
from agentrl_envs.backends.base import DatabaseSpec, EpisodeSetup, ToolRequest
from agentrl_envs.backends.http import HTTPBackend, shard_of, split_urls
from agentrl_envs.errors import ConfigError, PermanentError
from agentrl_envs.server.processes import bind
from agentrl_envs.server.simulator import ServeLimits, SimulatorServer
from simulators import SimulatorApp
from simulators.app import MAX_REQUEST_BYTES, template_fingerprint
from simulators.memory import CloseCounter, release_memory
from tests.procs import alive, descendants, parent_of
from tests.simulators.test_serve import running

TABLES: dict[str, Any] = {"t": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": [[i, f"v{i}"] for i in range(1, 51)]}}
FP = template_fingerprint("t", TABLES)
START_LINES = 200  # lines of server output read while waiting for its address: a hang detector
START_WAIT_S = 120.0  # a hang detector for a worker's start-up on a busy machine, not a speed limit
DEATH_POLLS = 600  # polls 0.1 s apart for the workers to exit after their supervisor died: a hang detector


def _setup(episode_id: str, tables: dict[str, Any] = TABLES, label: str = "t") -> EpisodeSetup:
    return EpisodeSetup(episode_id=episode_id, database=DatabaseSpec(template_fingerprint(label, tables), tables), files={})


def _sql(backend: Any, episode_id: str, query: str) -> Any:
    return backend.handle(ToolRequest(episode_id, "sql", {"query": query}))


# -- routing ---------------------------------------------------------------------------------


def test_shard_of_is_stable_in_range_and_spreads() -> None:
    ids = [f"ep-{i}" for i in range(64)]
    assert [shard_of(e, 1) for e in ids] == [0] * 64
    shards = [shard_of(e, 3) for e in ids]
    assert set(shards) == {0, 1, 2}
    assert shards == [shard_of(e, 3) for e in ids]  # same answer every time (no per-process hash seed)
    # Pinned: every client (other languages, older versions) must route an id the same way.
    assert [shard_of(f"ep-{i}", 2) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_split_urls_accepts_lists_and_commas_and_refuses_garbage() -> None:
    assert split_urls("http://a:1, http://a:2/") == ["http://a:1", "http://a:2"]
    assert split_urls(["http://a:1", "https://b:2"]) == ["http://a:1", "https://b:2"]
    for bad in ("", ",", "http://a:1,,http://a:2", "ftp://a:1", "http://a:1,http://a:1", "http://a:99999", ["http://a:1", 3]):
        with pytest.raises(ConfigError):
            split_urls(bad)  # type: ignore[arg-type]
    backend = make_backend(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    try:
        assert isinstance(backend, HTTPBackend) and backend.urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    finally:
        backend.close()


def test_two_servers_each_hold_their_own_episodes() -> None:
    """In one process, two servers behind one backend: each episode lives on exactly one of them."""
    apps = [SimulatorApp(python_sandbox=False), SimulatorApp(python_sandbox=False)]
    servers = [SimulatorServer(app=a) for a in apps]
    with running(servers[0]) as url0, running(servers[1]) as url1:
        backend = HTTPBackend([url0, url1])
        ids = [f"route-{i}" for i in range(12)]
        try:
            for e in ids:
                backend.open_episode(_setup(e))
            for i, e in enumerate(ids):
                response = _sql(backend, e, f"SELECT v FROM t WHERE id = {i + 1}")
                assert response.ok and response.result["rows"] == [[f"v{i + 1}"]]
            for k, app in enumerate(apps):
                assert sorted(app._episodes) == sorted(e for e in ids if shard_of(e, 2) == k)
            # Asked of the other server, an episode is unknown there: never served from wrong state.
            stray = next(e for e in ids if shard_of(e, 2) == 0)
            other = httpx.post(f"{url1}/v1/episodes/{stray}/sql", json={"query": "SELECT 1"})
            assert other.status_code == 404 and other.json()["error"]["type"] == "unknown_episode"
            for e in ids:
                backend.close_episode(e)
            assert [len(a._episodes) for a in apps] == [0, 0]
        finally:
            backend.close()


@pytest.mark.integration
def test_serve_workers_keep_each_episode_on_its_process() -> None:
    """``agentrl-envs serve --workers 2``: two processes, two ports; the backend routes by episode id."""
    proc = _serve_workers("--port", "0", "--workers", "2")
    try:
        line, urls = _addresses(proc)
        assert len(urls) == 2 and all(re.fullmatch(r"http://127\.0\.0\.1:\d+", u) for u in urls), line
        for u in urls:  # the ports listen at once; each worker answers once it has started
            assert httpx.get(f"{u}/health", timeout=START_WAIT_S).status_code == 200
        backend = HTTPBackend(urls)
        ids = [f"w-{i}" for i in range(8)]
        try:
            for e in ids:
                backend.open_episode(_setup(e))
            for e in ids:
                assert _sql(backend, e, "SELECT count(*) FROM t").result["rows"] == [[50]]
            counts = [httpx.get(f"{u}/health").json()["result"]["episodes"] for u in urls]
            assert counts == [sum(1 for e in ids if shard_of(e, 2) == k) for k in range(2)]
            assert min(counts) > 0  # both processes hold episodes
            for e in ids:
                backend.close_episode(e)
            assert [httpx.get(f"{u}/health").json()["result"]["episodes"] for u in urls] == [0, 0]
        finally:
            backend.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_serve_workers_exit_when_the_supervisor_is_killed() -> None:
    """A SIGKILLed ``serve --workers 2`` leaves no worker (nor a worker's sandbox) behind."""
    proc = _serve_workers("--host", "127.0.0.1", "--port", "0", "--workers", "2")
    left: list[int] = []
    try:
        line, urls = _addresses(proc)
        assert len(urls) == 2, line
        for u in urls:  # a worker that answers has set its parent-death signal long before
            assert httpx.get(f"{u}/health", timeout=START_WAIT_S).status_code == 200
        workers = descendants(proc.pid)
        assert len([p for p in workers if parent_of(p) == proc.pid]) == 2, workers
        proc.kill()
        proc.wait()
        for _ in range(DEATH_POLLS):  # 60 s in all: stopping uvicorn and the sandbox, on a busy machine
            left = [p for p in workers if alive(p)]
            if not left:
                break
            time.sleep(0.1)
        assert left == [], f"still running after the supervisor died: {left}"
    finally:
        for pid in left:  # the old behaviour: orphans, stopped here so that they outlive no test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_worker_whose_supervisor_died_before_it_asked_exits_at_once() -> None:
    code = "import os, sys; from agentrl_envs.server.processes import _die_with; _die_with(os.getppid() + 1)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "the supervisor" in done.stderr and "is gone" in done.stderr, done.stderr


def _serve_workers(*flags: str) -> subprocess.Popen[str]:
    """``agentrl-envs serve FLAGS`` without a token, its output on a pipe."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("AGENTRL_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "agentrl_envs", "serve", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _addresses(proc: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The line where ``serve`` prints its addresses (read for at most START_LINES lines), and the URLs in it."""
    assert proc.stdout is not None
    line = ""
    for _ in range(START_LINES):
        line = proc.stdout.readline()
        if "agentrl simulator on" in line or not line:
            break
    return line, line.split(" on ", 1)[-1].split(" ", 1)[0].split(",")


def test_bind_refuses_bad_worker_counts_and_taken_ports() -> None:
    for bad in (0, -1, 65, True):
        with pytest.raises(ConfigError, match="workers"):
            bind("127.0.0.1", 0, bad)
    sockets = bind("127.0.0.1", 0, 2)
    try:
        taken = sockets[0].getsockname()[1]
        with pytest.raises(ConfigError, match="cannot listen"):
            bind("127.0.0.1", taken, 1)
    finally:
        for s in sockets:
            s.close()
    with pytest.raises(ConfigError, match="65535"):
        bind("127.0.0.1", 65535, 2)


# -- memory ----------------------------------------------------------------------------------


def _open(app: SimulatorApp, episode_id: str) -> str:
    status, data, _ = app.handle_bytes("POST", "/v1/episodes", json.dumps({"episode_id": episode_id, "database": FP}).encode())
    assert status == 201, data
    return json.loads(data)["result"]["episode_token"]


def test_an_episode_costs_few_tracked_objects_and_closing_frees_it_without_the_collector() -> None:
    app = SimulatorApp(python_sandbox=False)
    try:
        assert app.put_database(FP, {"tables": TABLES})[0] == 204
        warm = _open(app, "warm")  # with a query: the SQL watchdog thread and helpers start here, not below
        assert app.handle_bytes("POST", "/v1/episodes/warm/sql", b'{"query": "SELECT 1"}', warm)[0] == 200
        app.close_episode("warm")
        gc.collect()
        gc.disable()  # what closing frees must go by reference counting alone
        try:
            before = len(gc.get_objects())
            tokens = {f"m{i}": _open(app, f"m{i}") for i in range(200)}
            for e, token in tokens.items():
                for q in range(6):  # the statement cache is bounded: queries add no tracked objects past it
                    status, _, _ = app.handle_bytes("POST", f"/v1/episodes/{e}/sql", b'{"query": "SELECT %d"}' % q, token)
                    assert status == 200
            per_episode = (len(gc.get_objects()) - before) / 200
            # 106 with a SQLAlchemy engine per episode; 24 measured without one.
            assert per_episode <= 40, per_episode
            refs = [weakref.ref(app._episodes[e].database) for e in tokens]  # type: ignore[arg-type]
            for e in tokens:
                app.close_episode(e)
            assert all(r() is None for r in refs)
            del refs
            assert len(gc.get_objects()) - before <= 20  # nothing left for a collection to find
        finally:
            gc.enable()
    finally:
        app.close()


def test_close_counter_asks_for_a_trim_every_n_closes_and_when_idle() -> None:
    counter = CloseCounter(every=4, idle=2)
    assert [counter.closed(still_open=10) for _ in range(8)] == [False, False, False, True] * 2
    assert counter.closed(still_open=0) is False  # one close since the last trim: not yet
    assert counter.closed(still_open=0) is True
    assert counter.trims == 3


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or not release_memory(), reason="needs glibc malloc_trim on Linux")
def test_memory_goes_back_after_episodes_close() -> None:
    """256 episodes of a ~250 kB template grow the heap by ~100 MiB; closing them gives most of it back."""
    tables = {"big": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": [[i, "x" * 120] for i in range(2000)]}}
    fp = template_fingerprint("big", tables)
    app = SimulatorApp(python_sandbox=False)
    try:
        assert app.put_database(fp, {"tables": tables})[0] == 204
        gc.collect()
        release_memory()
        base = _rss_kib()
        for i in range(256):
            app.open_episode({"episode_id": f"r{i}", "database": fp})
            app.tool(f"r{i}", "sql", {"query": "SELECT * FROM big WHERE id < 100"})
        grown = _rss_kib() - base
        assert grown > 50 << 10, grown  # the test means something only if the episodes took memory
        for i in range(256):
            app.close_episode(f"r{i}")  # the last close trims (the simulator does it, not this test)
        assert app._closes.trims >= 1
        left = _rss_kib() - base
        assert left <= 0.2 * grown, (grown, left)
    finally:
        app.close()


# -- template uploads ------------------------------------------------------------------------


def test_upload_limit_is_a_setting_with_a_clear_error() -> None:
    app = SimulatorApp(python_sandbox=False, max_upload_bytes=2000)
    try:
        big = {"t": {"columns": [["id", "INTEGER"]], "rows": [[i] for i in range(1000)]}}
        body = json.dumps({"tables": big}).encode()
        status, data, _ = app.handle_bytes("PUT", f"/v1/databases/{template_fingerprint('t', big)}", body)
        error = json.loads(data)["error"]
        assert status == 413 and error["limit_bytes"] == 2000 and "--max-upload-mb" in error["message"]
        # Other requests keep their own, smaller limit.
        assert app.body_limit("POST", "/v1/episodes") == MAX_REQUEST_BYTES
    finally:
        app.close()
    for bad in (0, -5, 1.5, True, "1"):
        with pytest.raises((ValueError, ConfigError)):
            SimulatorApp(python_sandbox=False, max_upload_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="max_upload_bytes"):
            ServeLimits(max_upload_bytes=bad)  # type: ignore[arg-type]


def test_an_upload_over_the_limit_fails_the_episode_with_the_setting_named() -> None:
    server = SimulatorServer(app=SimulatorApp(python_sandbox=False, max_upload_bytes=1000))
    with running(server) as url:
        backend = HTTPBackend(url)
        try:
            tables = {"t": {"columns": [["id", "INTEGER"]], "rows": [[i] for i in range(500)]}}
            with pytest.raises(PermanentError, match="max-upload-mb"):
                backend.open_episode(_setup("too-big", tables))
        finally:
            backend.close()


def test_a_template_over_the_old_8_mib_cap_uploads_and_serves() -> None:
    rows = [[i, f"row-{i:07d}-" + "y" * 16] for i in range(260_000)]
    tables = {"wide": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": rows}}
    assert len(json.dumps({"tables": tables})) > MAX_REQUEST_BYTES  # larger than any other request may be
    server = SimulatorServer(app=SimulatorApp(python_sandbox=False))
    with running(server) as url:
        backend = HTTPBackend(url)
        try:
            backend.open_episode(_setup("big", tables, label="wide"))
            response = _sql(backend, "big", "SELECT count(*), max(id) FROM wide")
            assert response.ok and response.result["rows"] == [[260_000, 259_999]]
        finally:
            backend.close()


def test_pending_query_results_take_a_few_allocations_per_episode_not_a_few_per_query() -> None:
    """Results wait in one buffer per episode: small-object blocks do not grow with the queries.

    As a bytes object per result in a dict (2+ blocks per query), thousands of episodes with
    hundreds of results each filled allocator arenas that stayed after the episodes closed.
    """
    app = SimulatorApp(python_sandbox=False)
    try:
        assert app.put_database(FP, {"tables": TABLES})[0] == 204
        token = _open(app, "p")
        query = b'{"query": "SELECT v FROM t WHERE id = %d"}'
        for i in range(50):  # warm: the statement cache, free lists, the buffer past its small sizes
            assert app.handle_bytes("POST", "/v1/episodes/p/sql", query % (i % 50 + 1), token)[0] == 200
        gc.collect()
        before = sys.getallocatedblocks()
        for i in range(400):
            assert app.handle_bytes("POST", "/v1/episodes/p/sql", query % (i % 50 + 1), token)[0] == 200
        gc.collect()  # empties the free lists (tuples of rows sit there, counted as allocated)
        grown = sys.getallocatedblocks() - before
        assert grown < 50, grown  # 800+ with a bytes object and a key per result
        episode = app._episodes["p"]
        assert len(episode.pending) == 450 and episode.pending_bytes == sum(len(f"v\nv{i % 50 + 1}\n") for i in range(450))
        files = episode.pending.take()
        assert list(files)[:2] == ["results/q1.csv", "results/q2.csv"] and len(files) == 450
        assert files["results/q450.csv"] == b"v\nv50\n"
        assert len(episode.pending) == 0 and episode.pending_bytes == 0
        # Written out when the workspace is made, and the buffer starts again empty.
        assert app.handle_bytes("POST", "/v1/episodes/p/sql", query % 7, token)[0] == 200
        workspace = app.workspace_of("p")
        assert workspace is not None
        with open(os.path.join(workspace, "results", "q451.csv"), "rb") as f:
            assert f.read() == b"v\nv7\n"
        assert episode.pending_bytes == 0
    finally:
        app.close()


def test_an_open_episode_takes_few_small_object_blocks() -> None:
    """Blocks of CPython's small-object allocator per open episode (each query done): what the
    arenas that may stay after closing hold at the peak. 49 with a ``replace`` closure and a refusal
    callback per connection; 37 with the SQL functions shared and the database record slotted."""
    app = SimulatorApp(python_sandbox=False)
    try:
        assert app.put_database(FP, {"tables": TABLES})[0] == 204
        query = b'{"query": "SELECT v FROM t WHERE id = 3"}'
        for i in range(20):  # warm: free lists, the statement and function caches
            assert app.handle_bytes("POST", f"/v1/episodes/w{i}/sql", query, _open(app, f"w{i}"))[0] == 200
        gc.collect()
        before = sys.getallocatedblocks()
        for i in range(200):
            assert app.handle_bytes("POST", f"/v1/episodes/b{i}/sql", query, _open(app, f"b{i}"))[0] == 200
        gc.collect()
        per_episode = (sys.getallocatedblocks() - before) / 200
        assert per_episode <= 42, per_episode
    finally:
        app.close()
