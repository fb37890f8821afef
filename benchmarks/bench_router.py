"""The simulator's hand-written router against a Starlette ``Router``: same routes, same handlers, one run.

Run from the repository root (Starlette is in the ``dev`` extra)::

    .venv/bin/python benchmarks/bench_router.py              # in-process ASGI calls, then over uvicorn
    .venv/bin/python benchmarks/bench_router.py --quick      # fewer requests
    .venv/bin/python benchmarks/bench_router.py --no-uvicorn # in-process only

The question (issue #15, item 5): should ``simulators/app.py`` route with Starlette instead of
splitting paths by hand? Both apps below serve one :class:`~simulators.app.SimulatorApp`:

- ``hand-written``: the ASGI callable ``agentrl-envs serve`` uses, less its auth and thread-pool
  lanes (which a Starlette port would keep as they are): read the body, call
  :meth:`SimulatorApp.handle_bytes` (JSON decode, :func:`~simulators.app.match_route`, dispatch,
  JSON encode), send.
- ``starlette``: a :class:`starlette.routing.Router` with one declared ``Route`` per path and method
  (path parameters by Starlette's converters, ``{path:path}`` for files), endpoints that take a
  ``Request``, do the same episode and owner checks and call the same :class:`SimulatorApp`
  operations, and answer a ``Response``. It skips ``match_route``, so it does no more work than
  the hand-written side beyond what Starlette itself costs.
- ``starlette routes, ASGI endpoints``: the same declared routes, with raw ASGI endpoints instead
  of functions (Starlette then builds no ``Request``/``Response``): the cost of its route matching
  alone.

The request mix is the serve hot path: SQL point lookups (the serve-scale target's request), with
``GET /health``, a workspace file read and an unknown path between them. Every answer of the two
apps is compared byte for byte on the first round (a mismatch stops the run). In-process, requests
go straight to the ASGI callable (no socket), sequentially, in rounds that alternate the two apps so
both see the same machine load; over uvicorn (uvloop and httptools when installed), each app runs
in its own server process (all started before the first request) and a raw asyncio client keeps
``--connections`` requests in flight (closed loop), in slices that rotate the apps' order. Printed per app: CPU time per request (the calling thread's in process; the server process's over
uvicorn) and its inverse, requests/s per core, which do not depend on how busy the machine is; the
wall-clock p50/p99 (and over uvicorn the requests/s the client saw), which do; and the ratio of
capacity to the hand-written router's. Nothing here asserts.

The yardstick is the serve target of docs/design.md (4,096 open episodes at 1,000 req/s, p99 <= 50 ms on 2
cores): the router's cost per request, times 1,000 req/s, is the share of a core it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench_serve_scale import TABLES  # noqa: E402  (the same 1,000-row orders table as the serve-scale run)

from agentrl_envs.server.processes import tune_gc  # noqa: E402
from agentrl_envs.testing import free_port, wait_http  # noqa: E402
from agentrl_envs.text.table import format_table  # noqa: E402
from simulators.app import EPISODE_TOKEN_HEADER, SimulatorApp, template_fingerprint  # noqa: E402
from simulators.routes import Reply, err, ok  # noqa: E402

FP = template_fingerprint("router", TABLES)
EPISODES = 64
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def make_simulator() -> SimulatorApp:
    """A simulator with the template stored (episodes are opened through each app)."""
    app = SimulatorApp(python_sandbox=False)
    status, reply = app.put_database(FP, {"tables": TABLES})
    if status != 204:
        raise SystemExit(f"template upload failed: {status} {reply}")
    return app


# -- the two apps ---------------------------------------------------------------------------------


def hand_written(sim: SimulatorApp) -> ASGIApp:
    """The ASGI callable of ``agentrl-envs serve`` without auth and lanes: the routing is ``handle_bytes``."""
    token_header = EPISODE_TOKEN_HEADER.lower().encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        token = None
        for key, value in scope.get("headers", []):
            if key == token_header:
                token = value.decode("latin-1")
        status, data, headers = sim.handle_bytes(scope["method"], scope["path"], body, token)
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        raw.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": data})

    return app


def starlette_router(sim: SimulatorApp) -> ASGIApp:
    """The same API as declared Starlette routes calling the same :class:`SimulatorApp` operations."""
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route, Router

    def answer(reply: Reply) -> Response:
        status, body = reply
        if body is None:
            return Response(status_code=status)
        return Response(json.dumps(body, separators=(",", ":")).encode(), status_code=status, media_type="application/json")

    async def payload_of(request: Request) -> dict[str, Any] | Response:
        body = await request.body()
        try:
            payload = json.loads(body) if body else {}
        except (ValueError, RecursionError) as exc:
            return answer(err(400, "bad_request", f"malformed JSON body: {type(exc).__name__}"))
        if not isinstance(payload, dict):
            return answer(err(400, "bad_request", "the request body must be a JSON object"))
        return payload

    def denied(request: Request, closing: bool = False) -> Response | None:
        """The hand-written ``_route``'s episode checks: open, and owned by the caller."""
        episode_id = request.path_params["episode_id"]
        if episode_id not in sim._episodes:
            return answer((204, None) if closing else err(404, "unknown_episode", f"no open episode {episode_id[:64]!r}"))
        refused = sim.check_owner(episode_id, request.headers.get(EPISODE_TOKEN_HEADER))
        return answer(refused) if refused is not None else None

    async def health(request: Request) -> Response:
        return answer(ok({"episodes": len(sim._episodes), "sandbox_tier": sim.sandbox_tier, "numpy": sim.numpy_available}))

    async def open_episode(request: Request) -> Response:
        payload = await payload_of(request)
        if isinstance(payload, Response):
            return payload
        return answer(sim.open_episode(payload, request.headers.get(EPISODE_TOKEN_HEADER)))

    async def close_episode(request: Request) -> Response:
        refused = denied(request, closing=True)
        if refused is not None:
            return refused
        sim.close_episode(request.path_params["episode_id"])
        return answer((204, None))

    async def get_file(request: Request) -> Response:
        refused = denied(request)
        return refused or answer(sim.get_file(request.path_params["episode_id"], request.path_params["path"]))

    async def tool(request: Request) -> Response:
        refused = denied(request)
        if refused is not None:
            return refused
        payload = await payload_of(request)
        if isinstance(payload, Response):
            return payload
        return answer(sim.tool(request.path_params["episode_id"], request.path_params["tool"], payload))

    async def not_found(scope: dict[str, Any], receive: Any, send: Any) -> None:
        response = answer(err(404, "not_found", f"no route {scope['method']} {scope['path'][:100]}"))
        await response(scope, receive, send)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/episodes", open_episode, methods=["POST"]),
        Route("/v1/episodes/{episode_id}", close_episode, methods=["DELETE"]),
        Route("/v1/episodes/{episode_id}/files/{path:path}", get_file, methods=["GET"]),
        Route("/v1/episodes/{episode_id}/{tool}", tool, methods=["POST"]),
    ]
    return Router(routes, default=not_found)


class _Endpoint:
    """A raw ASGI endpoint: Starlette passes an object that is not a function straight through, with
    no ``Request`` or ``Response`` around it, so only its route matching is measured."""

    def __init__(self, sim: SimulatorApp, operation: Callable[[dict[str, Any], dict[str, Any], str | None], Reply]) -> None:
        self.sim, self.operation = sim, operation
        self.token_header = EPISODE_TOKEN_HEADER.lower().encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = bytearray()
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        token = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == self.token_header), None)
        params = scope["path_params"]
        reply = None
        if ("episode_id" in params and scope["method"] != "POST") or "tool" in params:
            reply = _episode_check(self.sim, params["episode_id"], token, closing=scope["method"] == "DELETE")
        if reply is None:
            try:
                payload = json.loads(body) if body else {}
            except (ValueError, RecursionError) as exc:
                payload, reply = None, err(400, "bad_request", f"malformed JSON body: {type(exc).__name__}")
            if reply is None and not isinstance(payload, dict):
                reply = err(400, "bad_request", "the request body must be a JSON object")
            if reply is None:
                assert isinstance(payload, dict)
                reply = self.operation(params, payload, token)
        await _send(send, reply)


def _episode_check(sim: SimulatorApp, episode_id: str, token: str | None, closing: bool) -> Reply | None:
    if episode_id not in sim._episodes:
        return (204, None) if closing else err(404, "unknown_episode", f"no open episode {episode_id[:64]!r}")
    return sim.check_owner(episode_id, token)


async def _send(send: Any, reply: Reply) -> None:
    status, body = reply
    data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    headers = [] if body is None else [(b"content-type", b"application/json")]
    headers.append((b"content-length", str(len(data)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def starlette_matching(sim: SimulatorApp) -> ASGIApp:
    """Starlette's declared routes with raw ASGI endpoints: the routing library, without its request objects."""
    from starlette.routing import Route, Router

    def close(params: dict[str, Any], payload: dict[str, Any], token: str | None) -> Reply:
        sim.close_episode(params["episode_id"])
        return 204, None

    def health(params: dict[str, Any], payload: dict[str, Any], token: str | None) -> Reply:
        return ok({"episodes": len(sim._episodes), "sandbox_tier": sim.sandbox_tier, "numpy": sim.numpy_available})

    async def not_found(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await _send(send, err(404, "not_found", f"no route {scope['method']} {scope['path'][:100]}"))

    routes = [
        Route("/health", _Endpoint(sim, health), methods=["GET"]),
        Route("/v1/episodes", _Endpoint(sim, lambda p, body, token: sim.open_episode(body, token)), methods=["POST"]),
        Route("/v1/episodes/{episode_id}", _Endpoint(sim, close), methods=["DELETE"]),
        Route(
            "/v1/episodes/{episode_id}/files/{path:path}",
            _Endpoint(sim, lambda p, body, token: sim.get_file(p["episode_id"], p["path"])),
            methods=["GET"],
        ),
        Route(
            "/v1/episodes/{episode_id}/{tool}",
            _Endpoint(sim, lambda p, body, token: sim.tool(p["episode_id"], p["tool"], body)),
            methods=["POST"],
        ),
    ]
    return Router(routes, default=not_found)


APPS: dict[str, Callable[[SimulatorApp], ASGIApp]] = {
    "hand-written": hand_written,
    "starlette": starlette_router,
    "starlette routes, ASGI endpoints": starlette_matching,
}

# -- the request mix ------------------------------------------------------------------------------

Request_ = tuple[str, str, bytes, dict[str, str]]


def opening(i: int) -> Request_:
    body = json.dumps({"episode_id": f"ep{i}", "database": FP, "files": {"notes/readme.txt": "hello"}}).encode()
    return "POST", "/v1/episodes", body, {}


def mix(n: int, tokens: dict[str, str]) -> list[Request_]:
    """``n`` requests: 7 of 10 SQL point lookups, then health, a file read and an unknown path (:data:`KINDS`)."""
    out: list[Request_] = []
    for i in range(n):
        episode = f"ep{i % EPISODES}"
        headers = {EPISODE_TOKEN_HEADER: tokens[episode]}
        kind = i % 10
        if kind < 7:
            query = f"SELECT region, amount FROM orders WHERE id = {1 + (i * 37) % 1000}"
            out.append(("POST", f"/v1/episodes/{episode}/sql", json.dumps({"query": query}).encode(), headers))
        elif kind == 7:
            out.append(("GET", "/health", b"", {}))
        elif kind == 8:
            out.append(("GET", f"/v1/episodes/{episode}/files/notes/readme.txt", b"", headers))
        else:
            out.append(("GET", f"/v1/nothing/{i}", b"", {}))
    return out


# -- in process -----------------------------------------------------------------------------------


async def asgi_call(app: ASGIApp, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request straight into an ASGI callable; (status, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # a disconnect never comes while the app answers
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def open_all(call: Callable[[Request_], Awaitable[tuple[int, bytes]]]) -> dict[str, str]:
    tokens = {}
    for i in range(EPISODES):
        status, data = await call(opening(i))
        if status != 201:
            raise SystemExit(f"opening an episode failed: HTTP {status} {data[:200]!r}")
        tokens[f"ep{i}"] = json.loads(data)["result"]["episode_token"]
    return tokens


KINDS = ("sql", "sql", "sql", "sql", "sql", "sql", "sql", "health", "file", "not found")


async def in_process(n: int, rounds: int) -> dict[str, list[tuple[str, float, float]]]:
    """Per app, per request: (kind, wall seconds, CPU seconds). Request by request, the apps take
    turns in a rotating order, so a change in the machine's load reaches all of them alike."""
    apps = {name: make(make_simulator()) for name, make in APPS.items()}
    tokens = {}
    for name, app in apps.items():
        tokens[name] = await open_all(lambda r, app=app: asgi_call(app, *r))
    samples: dict[str, list[tuple[str, float, float]]] = {name: [] for name in apps}
    names = list(apps)
    for r in range(rounds):
        requests = {name: mix(n, tokens[name]) for name in names}
        answers: dict[str, list[tuple[int, bytes]]] = {name: [] for name in names}
        for i in range(n):
            k = (i + r) % len(names)
            for name in names[k:] + names[:k]:
                t0, c0 = time.perf_counter(), time.thread_time()
                answer = await asgi_call(apps[name], *requests[name][i])
                cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
                samples[name].append((KINDS[i % 10], wall, cpu))
                if r == 0:
                    answers[name].append(answer)
        if r == 0:
            check_same(answers)
    return samples


def check_same(answers: dict[str, list[tuple[int, bytes]]]) -> None:
    """Every app must answer every request of the mix as the hand-written one does (status and body)."""
    a = answers["hand-written"]
    for b_name, b in answers.items():
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                raise SystemExit(f"request {i}: hand-written answered {x[0]} {x[1][:200]!r}, {b_name} {y[0]} {y[1][:200]!r}")


# -- over uvicorn ---------------------------------------------------------------------------------


def serve_child(name: str, port: int) -> None:
    """A server process: one of the two apps under uvicorn on 127.0.0.1:port, GC tuned as serve does."""
    import uvicorn

    config = uvicorn.Config(
        APPS[name](make_simulator()), host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    config.load()
    tune_gc()
    uvicorn.Server(config).run()


async def over_uvicorn(
    ports: dict[str, int], pids: dict[str, int], n: int, rounds: int, connections: int
) -> dict[str, tuple[list[float], float, float]]:
    """Per app: (latencies, wall seconds, server CPU seconds) of ``n`` requests of the mix sent with
    ``connections`` in flight (closed loop), in ``rounds`` slices that rotate the apps' order."""
    from bench_serve_scale import Shard

    shards = {name: Shard("127.0.0.1", port) for name, port in ports.items()}
    tokens = {}
    for name, shard in shards.items():
        tokens[name] = await open_all(lambda r, shard=shard: shard.request(*r))
    out: dict[str, tuple[list[float], float, float]] = {name: ([], 0.0, 0.0) for name in shards}
    names = list(shards)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            shard = shards[name]
            cursor = iter(mix(n // rounds, tokens[name]))
            latencies = out[name][0]

            async def worker(shard: Any = shard, cursor: Any = cursor, latencies: list[float] = latencies) -> None:
                for req in cursor:
                    t0 = time.perf_counter()
                    await shard.request(*req)
                    latencies.append(time.perf_counter() - t0)

            t0, c0 = time.perf_counter(), cpu_seconds(pids[name])
            await asyncio.gather(*(worker() for _ in range(connections)))
            lat, wall, cpu = out[name]
            out[name] = (lat, wall + time.perf_counter() - t0, cpu + cpu_seconds(pids[name]) - c0)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_uvicorn(n: int, rounds: int, connections: int) -> dict[str, tuple[list[float], float, float]]:
    """Every app in its own uvicorn process, all started before the first request."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    ports = {name: free_port() for name in APPS}
    procs = {
        name: subprocess.Popen([sys.executable, __file__, "--serve", name, "--port", str(port)], env=env)
        for name, port in ports.items()
    }
    try:
        for name, port in ports.items():
            wait_http(f"http://127.0.0.1:{port}", timeout=60, proc=procs[name])
        return asyncio.run(over_uvicorn(ports, {name: p.pid for name, p in procs.items()}, n, rounds, connections))
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)


# -- report ---------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per app and round in process (default 20,000)")
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds in process and slices over uvicorn, rotating the apps (default 4)"
    )
    parser.add_argument("--uvicorn-requests", type=int, default=20_000, help="requests per app over uvicorn (default 20,000)")
    parser.add_argument("--connections", type=int, default=16, help="requests in flight over uvicorn (default 16)")
    parser.add_argument("--no-uvicorn", action="store_true", help="in-process calls only")
    parser.add_argument("--quick", action="store_true", help="2,000 requests x 2 rounds, 4,000 over uvicorn")
    parser.add_argument("--serve", choices=sorted(APPS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_child(args.serve, args.port)
        return
    try:
        import starlette
    except ImportError:
        raise SystemExit("Starlette is not installed: pip install -e '.[dev]' (or pip install starlette)") from None
    if args.quick:
        args.requests, args.rounds, args.uvicorn_requests = 2_000, 2, 4_000
    print(f"starlette {starlette.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")

    # CPU time per request is what the router adds and does not depend on how busy the machine is;
    # requests/s per core is its inverse. Wall-clock p50/p99 are printed too, and do depend on it.
    rows = []
    cpu_us: dict[str, float] = {}
    by_kind: dict[str, dict[str, float]] = {}
    for name, samples in asyncio.run(in_process(args.requests, args.rounds)).items():
        wall = [w for _, w, _ in samples]
        cpu_us[name] = statistics.fmean(c for _, _, c in samples) * 1e6
        by_kind[name] = {k: statistics.median(c for kind, _, c in samples if kind == k) * 1e6 for k in dict.fromkeys(KINDS)}
        rows.append(
            [
                "in process",
                name,
                f"{cpu_us[name]:.1f}",
                f"{1e6 / cpu_us[name]:,.0f}",
                "",
                f"{percentile(wall, 0.5) * 1e3:.3f}",
                f"{percentile(wall, 0.99) * 1e3:.3f}",
                f"{cpu_us['hand-written'] / cpu_us[name]:.2f}x",
            ]
        )
    added = {name: us - cpu_us["hand-written"] for name, us in cpu_us.items() if name != "hand-written"}
    if not args.no_uvicorn:
        server_us: dict[str, float] = {}
        for name, (wall, wall_s, cpu_s) in run_uvicorn(args.uvicorn_requests, args.rounds, args.connections).items():
            server_us[name] = cpu_s / len(wall) * 1e6
            rows.append(
                [
                    f"uvicorn, {args.connections} in flight",
                    name,
                    f"{server_us[name]:.0f}",
                    f"{1e6 / server_us[name]:,.0f}",
                    f"{len(wall) / wall_s:,.0f}",
                    f"{percentile(wall, 0.5) * 1e3:.2f}",
                    f"{percentile(wall, 0.99) * 1e3:.2f}",
                    f"{server_us['hand-written'] / server_us[name]:.2f}x",
                ]
            )
    header = ["path", "router", "CPU us/request", "req/s per core", "req/s seen", "p50 ms", "p99 ms", "vs hand-written"]
    print(format_table(header, rows))
    kinds = list(dict.fromkeys(KINDS))
    print()
    print(
        format_table(
            ["in process, median CPU us", *kinds],
            [[name, *(f"{by_kind[name][k]:.1f}" for k in kinds)] for name in by_kind],
        )
    )
    for name, us in added.items():
        print(f"In process, {name} adds {us:+.1f} us of CPU a request: {us * 1e-3:.1%} of a core at 1,000 req/s.")
    print(
        "1,000 req/s is the serve target (docs/design.md). Over uvicorn, CPU is the server process's (user + system, /proc) "
        "over the whole run; req/s seen and the latencies are the client's and depend on the machine's load."
    )


if __name__ == "__main__":
    main()
