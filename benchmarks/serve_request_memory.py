"""RSS of ``agentrl-train serve`` before and after its largest chat requests (issue #33, finding 2).

Runs the app in process on the tiny model (``--small``: the trainer tests' tiny) and prints the
process's resident memory (``VmRSS``) and its peak (``VmHWM``, reset before each request where the
kernel allows) around:

1. the review's request: ~3.8 MB of many short turns (refused with 413 now, before any tokenization);
2. the largest request the default :class:`~agentrl_train.serve.limits.ServeLimits` admit: 1,024
   messages holding 262,144 characters of words in all (old turns are dropped to fit the context);
3. ``--concurrent N`` copies of (2) at once (tokenized ``max_concurrent_encodings`` at a time).

    python benchmarks/serve_request_memory.py [--small] [--concurrent 6]
"""

from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path
from typing import Any

import httpx


def rss_mb() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def words(n_chars: int, rng: random.Random) -> str:
    vocab = ["select", "rows", "from", "orders", "where", "id", "=", "42;", "the", "table", "holds", "count"]
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(vocab)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "base", "messages": messages, "max_tokens": 1, "temperature": 0}


async def post(app: Any, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=600) as c:
        return await c.post("/v1/chat/completions", json=body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the trainer tests' tiny model (faster to build)")
    parser.add_argument("--concurrent", type=int, default=6)
    args = parser.parse_args()

    from agentrl_train.serve.app import ServeApp
    from agentrl_train.serve.engine import Engine
    from agentrl_train.serve.limits import ServeLimits
    from agentrl_train.tiny import TinySpec

    spec = TinySpec(pretrain_steps=30, corpus_episodes=8) if args.small else None
    engine = Engine("tiny", tiny_spec=spec, log=lambda *a: None)
    limits = ServeLimits()
    app = ServeApp(engine, limits=limits, max_new_tokens=8, log=lambda s: None)
    rng = random.Random(0)
    asyncio.run(post(app, chat([{"role": "user", "content": "warm up"}])))  # first-call allocations out of the way

    review = chat([{"role": "user" if i % 2 else "assistant", "content": f"turn {i} x"} for i in range(85_000)])
    per = limits.max_prompt_chars // limits.max_messages - 24  # keys and roles count too
    largest = chat(
        [{"role": "user" if i % 2 == 0 else "assistant", "content": words(per, rng)} for i in range(limits.max_messages)]
    )
    print(f"limits: {limits.max_messages} messages, {limits.max_prompt_chars} chars, {limits.max_prompt_tokens} tokens")
    for name, bodies in (
        ("review's 3.8 MB request", [review]),
        ("largest admitted request", [largest]),
        (f"{args.concurrent} largest at once", [largest] * args.concurrent),
    ):
        before, _ = rss_mb()
        reset_peak()

        async def run(bodies: list[dict[str, Any]] = bodies) -> list[httpx.Response]:
            return list(await asyncio.gather(*(post(app, b) for b in bodies)))

        answers = asyncio.run(run())
        after, peak = rss_mb()
        statuses = sorted({r.status_code for r in answers})
        size = len(httpx.Request("POST", "/", json=bodies[0]).content) / 1e6
        print(
            f"{name}: {size:.1f} MB body, status {statuses}; RSS {before:.0f} -> {after:.0f} MB "
            f"(+{after - before:.0f}), peak {peak:.0f} MB (+{peak - before:.0f})"
        )
    engine.close()


if __name__ == "__main__":
    main()
