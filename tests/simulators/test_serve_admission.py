"""What the server's admission bounds admit (issue #16): a burst the lanes can drain within the
``Retry-After`` is queued, not refused; a lane of slow calls, a full lane and too many queued body
bytes are refused with 429. Calls go straight into the ASGI callable on one event loop and the
lanes' workers are held by a gate, so what is admitted depends on counts only, never on time.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from agentrl_envs.server.simulator import ServeLimits, SimulatorServer
from simulators import SimulatorApp
from simulators.app import EPISODE_TOKEN_HEADER, template_fingerprint

TABLES: dict[str, Any] = {"t": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": [[i, f"v{i}"] for i in range(1, 11)]}}
FP = template_fingerprint("t", TABLES)
SETTLE_STEPS = 1000  # event-loop turns allowed for the calls to be admitted: a hang detector


async def _call(server: SimulatorServer, method: str, path: str, body: bytes = b"", token: str | None = None) -> tuple[int, Any]:
    headers = [(EPISODE_TOKEN_HEADER.lower().encode(), token.encode())] if token else []
    scope = {"type": "http", "method": method, "path": path, "headers": headers, "client": ("127.0.0.1", 40000)}
    answer: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        answer[message["type"]] = message

    await server(scope, receive, send)
    data = answer["http.response.body"]["body"]
    return answer["http.response.start"]["status"], json.loads(data) if data else None


def _server(**limits: Any) -> tuple[SimulatorServer, dict[str, str]]:
    app = SimulatorApp(python_sandbox=False)
    assert app.put_database(FP, {"tables": TABLES})[0] == 204
    tokens = {}
    for i in range(8):
        status, reply = app.open_episode({"episode_id": f"e{i}", "database": FP})
        assert status == 201
        assert isinstance(reply, dict)
        tokens[f"e{i}"] = reply["result"]["episode_token"]
    return SimulatorServer(app=app, limits=ServeLimits(**limits)), tokens


def _hold(server: SimulatorServer, lane: str) -> threading.Event:
    """Keep every worker of ``lane`` busy until the returned gate is set (a stalled server)."""
    gate = threading.Event()
    pool = server._lanes[lane]
    for _ in range(pool.workers):
        pool.executor.submit(gate.wait, 60)
    return gate


async def _settle(server: SimulatorServer, lane: str, count: int) -> None:
    for _ in range(SETTLE_STEPS):
        if server.in_flight()[lane] + server.busy_answers >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"calls were neither admitted nor refused: {server.in_flight()}, {server.busy_answers} busy")


def test_a_burst_behind_stalled_workers_is_queued_not_refused() -> None:
    """300 point lookups arrive while the SQL workers are stalled: all wait and all are served.

    With the old fixed bound (4 workers x (1 + 8) = 36 calls) 264 of them were answered 429.
    """
    server, tokens = _server()

    async def main() -> list[int]:
        gate = _hold(server, "sql")
        ids = list(tokens)
        calls = [
            asyncio.ensure_future(
                _call(
                    server,
                    "POST",
                    f"/v1/episodes/{ids[i % 8]}/sql",
                    b'{"query": "SELECT v FROM t WHERE id = 3"}',
                    tokens[ids[i % 8]],
                )
            )
            for i in range(300)
        ]
        await _settle(server, "sql", 300)
        assert server.in_flight()["sql"] == 300 and server.busy_answers == 0
        gate.set()
        answers = await asyncio.gather(*calls)
        assert all(reply["result"]["rows"] == [["v3"]] for _, reply in answers)
        return [status for status, _ in answers]

    try:
        assert asyncio.run(main()) == [200] * 300
        assert server.in_flight() == {"python": 0, "sql": 0, "control": 0}
        assert server._lanes["sql"].service_s > 0  # the served calls were timed
    finally:
        server.close()


def test_a_full_lane_is_refused_and_names_its_bound() -> None:
    server, tokens = _server(sql_workers=2, queue_per_worker=3)  # at most 2 x (1 + 3) = 8 calls

    async def main() -> list[int]:
        gate = _hold(server, "sql")
        calls = [
            asyncio.ensure_future(_call(server, "POST", "/v1/episodes/e0/sql", b'{"query": "SELECT 1"}', tokens["e0"]))
            for _ in range(10)
        ]
        await _settle(server, "sql", 10)
        assert server.in_flight()["sql"] == 8 and server.busy_answers == 2
        gate.set()
        answers = await asyncio.gather(*calls)
        refused = [reply for status, reply in answers if status == 429]
        assert [r["error"]["type"] for r in refused] == ["server_busy"] * 2
        assert "sql lane's limit of 8 calls" in refused[0]["error"]["message"]
        return sorted(status for status, _ in answers)

    try:
        assert asyncio.run(main()) == [200] * 8 + [429] * 2
    finally:
        server.close()


def test_a_lane_of_slow_calls_admits_only_what_it_can_start_within_retry_after() -> None:
    """With calls known to hold a worker 2 s, 4 workers start ~2 calls/s: past ~1 s of queue, 429."""
    server, tokens = _server()
    lane = server._lanes["sql"]
    for _ in range(200):
        lane.served(2.0)  # as if 200 calls of 2 s each had just finished
    assert abs(lane.service_s - 2.0) < 1e-4

    async def main() -> list[tuple[int, Any]]:
        gate = _hold(server, "sql")
        calls = [
            asyncio.ensure_future(_call(server, "POST", "/v1/episodes/e1/sql", b'{"query": "SELECT 1"}', tokens["e1"]))
            for _ in range(12)
        ]
        await _settle(server, "sql", 12)
        # 4 run at once, and a queue of k waits k x 2 s / 4: k = 2 is 1 s, the Retry-After.
        assert server.in_flight()["sql"] == 6 and server.busy_answers == 6
        gate.set()
        return list(await asyncio.gather(*calls))

    try:
        answers = asyncio.run(main())
        assert sorted(status for status, _ in answers) == [200] * 6 + [429] * 6
        message = next(reply["error"]["message"] for status, reply in answers if status == 429)
        assert "would wait ~1.5 s for a worker" in message
    finally:
        server.close()
    # A fast lane's wait stays under a second far past the old bound: its cap decides.
    fast, _ = _server()
    try:
        pool = fast._lanes["sql"]
        for _ in range(200):
            pool.served(0.002)
        pool.admitted = pool.limit - 1
        assert pool.limit == 4 * 251 and pool.expected_wait_s() < 1.0
    finally:
        fast.close()


def test_queued_body_bytes_are_bounded_but_one_call_always_goes_in() -> None:
    server, tokens = _server(max_queued_bytes=300)
    big = json.dumps({"query": "SELECT 1 -- " + "x" * 400}).encode()  # 400+ bytes: over the bound alone
    small = json.dumps({"query": "SELECT 2 -- " + "y" * 100}).encode()

    async def main() -> list[int]:
        gate = _hold(server, "sql")
        first = asyncio.ensure_future(_call(server, "POST", "/v1/episodes/e2/sql", big, tokens["e2"]))
        await _settle(server, "sql", 1)
        second = asyncio.ensure_future(_call(server, "POST", "/v1/episodes/e3/sql", small, tokens["e3"]))
        await _settle(server, "sql", 2)
        assert server.in_flight()["sql"] == 1 and server.busy_answers == 1
        status, reply = await second
        assert status == 429 and "300 request body bytes" in reply["error"]["message"]
        gate.set()
        return [(await first)[0], (await _call(server, "POST", "/v1/episodes/e3/sql", small, tokens["e3"]))[0]]

    try:
        assert asyncio.run(main()) == [200, 200]
    finally:
        server.close()
