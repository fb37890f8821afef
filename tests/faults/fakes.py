"""Test helpers: a tiny fake backend, and a log generator that simulates calls through
:class:`FaultInjectingBackend` and writes them as JSON lines or combined access-log lines.

``python -m tests.faults.fakes PROFILE CALLS_PER_TOOL [--format jsonl|nginx|apache] [--seed S]``
prints such a log (docs/guide/faults.md uses it to measure fit-profile).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.faults import ErrorProfile, load_profile
from agentrl_envs.faults.injector import FaultInjectingBackend

TOOLS = ("sql", "python", "smtp")
EPOCH = 1_700_000_000.0  # 2023-11-14T22:13:20Z
_STATUS_WORD = {"timeout": "timeout", "connection_reset": "reset"}


class FakeBackend:
    """The four-method Backend protocol, answering every call ok; sql answers carry ``vm_steps``."""

    def __init__(self, vm_steps: int = 1000, latency_s: float = 0.0) -> None:
        self.vm_steps = vm_steps
        self.latency_s = latency_s
        self.calls: list[ToolRequest] = []
        self.opened: list[str] = []
        self.closed = False

    def open_episode(self, setup: EpisodeSetup) -> None:
        self.opened.append(setup.episode_id)

    def handle(self, request: ToolRequest) -> ToolResponse:
        self.calls.append(request)
        result: dict[str, Any] = {"echo": request.tool}
        if request.tool == "sql":
            result["vm_steps"] = self.vm_steps
        return ToolResponse(ok=True, status=200, result=result, latency_s=self.latency_s)

    def close_episode(self, episode_id: str) -> None:
        if episode_id in self.opened:
            self.opened.remove(episode_id)

    def close(self) -> None:
        self.closed = True


def injecting(profile: ErrorProfile | str, seed: int = 0, **fake: Any) -> tuple[FaultInjectingBackend, FakeBackend]:
    """A FaultInjectingBackend over a FakeBackend, with episode ``"ep"`` open under ``seed``."""
    inner = FakeBackend(**fake)
    backend = FaultInjectingBackend(inner, load_profile(profile))
    backend.open_episode(EpisodeSetup("ep", None, seed=seed))
    return backend, inner


@dataclass(frozen=True)
class LoggedCall:
    """One simulated call: what a log line records."""

    ts: float
    tool: str
    status: int | str
    latency_s: float
    retry_after_s: float | None


def simulate(
    profile: ErrorProfile | str, calls_per_tool: int, seed: int = 0, spacing_s: float = 1.0, tools: Sequence[str] = TOOLS
) -> Iterator[LoggedCall]:
    """Calls made round-robin over ``tools``, one every ``spacing_s`` virtual seconds."""
    backend, _ = injecting(profile, seed)
    for i in range(calls_per_tool * len(tools)):
        at = i * spacing_s
        tool = tools[i % len(tools)]
        response = backend.handle(ToolRequest("ep", tool, {}, at_s=at))
        status: int | str = response.status
        if response.fault is not None and response.fault["type"] in _STATUS_WORD:
            status = _STATUS_WORD[response.fault["type"]]
        retry = response.fault.get("retry_after_s") if response.fault else None
        yield LoggedCall(EPOCH + at, tool, status, response.latency_s, retry)


def jsonl(call: LoggedCall, iso: bool = False) -> str:
    record: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(call.ts)) + f".{int(call.ts % 1 * 1e6):06d}Z" if iso else call.ts,
        "tool": call.tool,
        "status": call.status,
        "latency_ms": call.latency_s * 1000.0,
    }
    if call.retry_after_s is not None:
        record["retry_after"] = call.retry_after_s
    return json.dumps(record)


_PATHS = {"sql": "/v1/db/query", "python": "/v1/code/exec", "smtp": "/v1/mail/send"}


def combined(call: LoggedCall, apache: bool = False) -> str:
    """A combined access-log line with nginx ``$request_time`` (or Apache ``%D``) appended."""
    status = {"timeout": 504, "reset": 599}.get(call.status, call.status) if isinstance(call.status, str) else call.status
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(call.ts))
    took = f"{round(call.latency_s * 1e6)}" if apache else f"{call.latency_s:.3f}"
    return f'10.0.0.7 - - [{stamp}] "POST {_PATHS[call.tool]} HTTP/1.1" {status} 512 "-" "agent/1.0" {took}'


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.fakes", description="Print a simulated API log.")
    parser.add_argument("profile")
    parser.add_argument("calls_per_tool", type=int)
    parser.add_argument("--format", choices=("jsonl", "nginx", "apache"), default="jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for call in simulate(args.profile, args.calls_per_tool, args.seed):
        line = jsonl(call) if args.format == "jsonl" else combined(call, apache=args.format == "apache")
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
