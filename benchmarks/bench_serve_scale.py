"""``agentrl-envs serve`` at scale: open episodes, a fixed request rate, p50/p99 and server memory.

Run from the repository root::

    .venv/bin/python benchmarks/bench_serve_scale.py                    # 256 / 1,024 / 4,096 episodes, 1,000 req/s, 60 s each
    .venv/bin/python benchmarks/bench_serve_scale.py --quick            # 10 s per level, 2,000 churned episodes
    .venv/bin/python benchmarks/bench_serve_scale.py --workers 1        # one server process

It starts ``agentrl-envs serve --workers N`` as a child process, uploads one template database,
and opens episodes in steps (256, then up to 1,024, then up to 4,096; earlier ones stay open).
At each step it sends SQL point lookups on random open episodes at a fixed rate, open loop: request
``i`` is due at ``start + i / rate`` and its latency runs from that moment to the last byte of the
answer, so a server that falls behind shows it in the tail instead of slowing the client down
(no coordinated omission). Each episode is routed to its server process the way the ``http``
backend routes it (:func:`agentrl_envs.backends.http.shard_of`).

The client is raw asyncio streams (uvloop when installed) over keep-alive HTTP/1.1 connections,
not httpx: an httpx client saturates before the server does. Memory is the resident set of the
server processes (``/proc``): after start-up, with every step's episodes open, after closing them,
and after opening, querying and closing ``--churn`` episodes in all (the "memory goes back" target:
within 20% of the start-up figure).

The client shares the machine's cores with the server; its own CPU time is printed too. Nothing
here asserts: the ``target`` column says whether the target of docs/design.md was met in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from agentrl_envs.backends.http import shard_of  # noqa: E402
from simulators.app import EPISODE_TOKEN_HEADER, template_fingerprint  # noqa: E402

TABLES = {
    "orders": {
        "columns": [["id", "INTEGER"], ["region", "TEXT"], ["amount", "REAL"]],
        "rows": [[i, ("north", "south", "east", "west")[i % 4], float(i % 97)] for i in range(1, 1001)],
    }
}
FP = template_fingerprint("scale", TABLES)
TOKEN_HEADER = EPISODE_TOKEN_HEADER
P99_TARGET_MS = 50.0
RSS_TARGET = 1.20


@dataclass
class Shard:
    """One server process: its address and a pool of idle keep-alive connections."""

    host: str
    port: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One request on an idle connection (a new one when none is idle); (status, body).

        A kept-alive connection the server has closed meanwhile (uvicorn closes idle ones after 5 s)
        fails before any byte of an answer: the request is sent again on another connection, as
        HTTP clients do. Any other failure is the caller's to count.
        """
        head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-length: {len(body)}\r\n"
        if body:
            head += "content-type: application/json\r\n"
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        data = head.encode() + b"\r\n" + body
        while self.idle:
            try:
                return await self._exchange(self.idle.pop(), data)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
            except ConnectionError:
                pass
        return await self._exchange(await asyncio.open_connection(self.host, self.port), data)

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> tuple[int, bytes]:
        reader, writer = conn
        try:
            writer.write(data)
            raw = await reader.readuntil(b"\r\n\r\n")
            status = int(raw[9:12])
            length = 0
            for line in raw.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            answer = await reader.readexactly(length) if length else b""
        except BaseException:
            writer.close()
            raise
        self.idle.append(conn)
        return status, answer


@dataclass
class Client:
    """Episodes open on the server and the shards they live on."""

    shards: list[Shard]
    tokens: dict[str, str] = field(default_factory=dict)

    def shard(self, episode_id: str) -> Shard:
        return self.shards[shard_of(episode_id, len(self.shards))]

    async def upload(self) -> None:
        body = json.dumps({"tables": TABLES}).encode()
        for shard in self.shards:
            status, data = await shard.request("PUT", f"/v1/databases/{FP}", body)
            if status != 204:
                raise SystemExit(f"template upload failed: HTTP {status} {data[:200]!r}")

    async def open(self, episode_id: str) -> None:
        body = json.dumps({"episode_id": episode_id, "database": FP}).encode()
        status, data = await self.shard(episode_id).request("POST", "/v1/episodes", body)
        if status != 201:
            raise SystemExit(f"could not open {episode_id}: HTTP {status} {data[:200]!r}")
        self.tokens[episode_id] = json.loads(data)["result"]["episode_token"]

    async def query(self, episode_id: str, row: int) -> int:
        body = b'{"query":"SELECT region, amount FROM orders WHERE id = %d"}' % row
        headers = {TOKEN_HEADER: self.tokens[episode_id]}
        status, _ = await self.shard(episode_id).request("POST", f"/v1/episodes/{episode_id}/sql", body, headers)
        return status

    async def close(self, episode_id: str) -> None:
        headers = {TOKEN_HEADER: self.tokens.pop(episode_id)}
        status, data = await self.shard(episode_id).request("DELETE", f"/v1/episodes/{episode_id}", b"", headers)
        if status != 204:
            raise SystemExit(f"could not close {episode_id}: HTTP {status} {data[:200]!r}")


async def in_batches(coros: list, width: int = 64) -> None:
    for i in range(0, len(coros), width):
        await asyncio.gather(*coros[i : i + width])


async def drive(client: Client, rate: float, seconds: float, seed: int) -> dict[str, float]:
    """Send ``rate`` point lookups per second for ``seconds``, open loop; latency percentiles in ms."""
    rng = random.Random(seed)
    episodes = list(client.tokens)
    total = int(rate * seconds)
    latencies: list[float] = []
    failures: collections.Counter[int] = collections.Counter()
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task] = set()

    async def one(due: float, episode_id: str, row: int) -> None:
        try:
            status = await client.query(episode_id, row)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            status = 0
        if status != 200:
            failures[status] += 1
        latencies.append(loop.time() - due)

    start = loop.time() + 0.05
    for i in range(total):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(due, rng.choice(episodes), rng.randint(1, 1000)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    elapsed = loop.time() - start
    latencies.sort()
    return {
        "sent": total,
        "rate": total / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "max_ms": 1000 * latencies[-1],
        "mean_ms": 1000 * statistics.fmean(latencies),
        "failed": sum(failures.values()),
        "failed_by_status": dict(failures),
    }


def server_pids(root: int) -> list[int]:
    """The server's supervisor and its worker processes."""
    pids = [root]
    try:
        children = Path(f"/proc/{root}/task/{root}/children").read_text().split()
    except OSError:
        children = []
    return pids + [int(c) for c in children]


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_s(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / ticks


def start_server(workers: int) -> tuple[subprocess.Popen, list[tuple[str, int]]]:
    cmd = [sys.executable, "-m", "agentrl_envs", "serve", "--port", "0", "--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=_ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    urls = re.findall(r"http://([0-9.]+):(\d+)", line.split(" on ", 1)[-1].split(" ", 1)[0])
    if not urls:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, [(h, int(p)) for h, p in urls]


async def wait_healthy(shards: list[Shard]) -> None:
    for shard in shards:
        for _ in range(600):
            try:
                status, _ = await shard.request("GET", "/health")
                if status == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.05)
        else:
            raise SystemExit(f"server on port {shard.port} never became healthy")


async def main_async(args: argparse.Namespace) -> None:
    proc, addresses = start_server(args.workers)
    try:
        shards = [Shard(h, p) for h, p in addresses]
        client = Client(shards)
        await wait_healthy(shards)
        await client.upload()
        # Warm-up: a few episodes opened, queried and closed, so the baseline holds what start-up builds.
        await in_batches([client.open(f"warm{i}") for i in range(64)])
        for i in range(64):
            await client.query(f"warm{i}", i + 1)
        await in_batches([client.close(f"warm{i}") for i in range(64)])
        await asyncio.sleep(0.5)
        pids = server_pids(proc.pid)
        base_rss = rss_mib(pids)
        print(f"load average before the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(
            f"server: {args.workers} worker process(es) on {', '.join(str(s.port) for s in shards)}; "
            f"RSS after start-up {base_rss:.0f} MiB"
        )
        print(
            f"\n{'episodes':>8} {'req/s':>7} {'sent':>7} {'failed':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
            f"{'RSS MiB':>8} {'srv cpu':>7} {'cli cpu':>7}  target (p99 <= {P99_TARGET_MS:.0f} ms, 0 failed)"
        )
        opened = 0
        for level in args.episodes:
            await in_batches([client.open(f"e{i}") for i in range(opened, level)])
            opened = max(opened, level)
            await drive(client, args.rate, min(2.0, args.seconds), seed=level + 1)  # warm the connection pool
            srv0, cli0 = cpu_s(pids), time.process_time()
            row = await drive(client, args.rate, args.seconds, seed=level)
            srv_cpu = (cpu_s(pids) - srv0) / args.seconds
            cli_cpu = (time.process_time() - cli0) / args.seconds
            met = row["p99_ms"] <= P99_TARGET_MS and row["failed"] == 0 and row["rate"] >= 0.98 * args.rate
            print(
                f"{level:>8} {row['rate']:>7.0f} {row['sent']:>7} {row['failed']:>6} {row['p50_ms']:>7.1f} "
                f"{row['p99_ms']:>7.1f} {row['max_ms']:>7.1f} {rss_mib(pids):>8.0f} {srv_cpu:>7.2f} {cli_cpu:>7.2f}  "
                f"{'met' if met else 'MISSED'}"
                + (f"; failed by HTTP status (0: no answer): {row['failed_by_status']}" if row["failed"] else "")
            )
        open_rss = rss_mib(pids)
        await in_batches([client.close(e) for e in list(client.tokens)])
        # Churn: open, query and close episodes in batches until --churn episodes have been through.
        churned = opened
        batch = 0
        while churned < args.churn:
            ids = [f"c{batch}-{i}" for i in range(min(1024, args.churn - churned))]
            await in_batches([client.open(e) for e in ids])
            await in_batches([client.query(e, 7) for e in ids])
            await in_batches([client.close(e) for e in ids])
            churned += len(ids)
            batch += 1
        await asyncio.sleep(1.0)
        after = rss_mib(pids)
        ratio = after / base_rss
        print(
            f"\nRSS: start-up {base_rss:.0f} MiB, {opened} episodes open {open_rss:.0f} MiB, "
            f"after closing all ({churned} episodes in all) {after:.0f} MiB = {ratio:.2f}x start-up "
            f"(target <= {RSS_TARGET:.2f}x: {'met' if ratio <= RSS_TARGET else 'MISSED'})"
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="server processes (default 2, one per core here)")
    p.add_argument("--episodes", default="256,1024,4096", help="open-episode levels, comma-separated")
    p.add_argument("--rate", type=float, default=1000.0, help="requests per second (default 1000)")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds per level (default 60)")
    p.add_argument("--churn", type=int, default=10_000, help="episodes opened and closed in all before the last RSS")
    p.add_argument("--quick", action="store_true", help="10 s per level, 2,000 churned episodes")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.churn = 10.0, 2000
    args.episodes = sorted(int(x) for x in args.episodes.split(","))
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]  # rows show as they are measured
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
