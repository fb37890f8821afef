"""``FaultInjectingBackend``: wraps any backend and makes its tools fail the way real APIs do.

Per call and tool, in this order, always consuming the same number of draws from the episode's
generator (so the same seed replays the same faults whatever the agent does):

1. still inside a 429's Retry-After window: 429 again (no draw, no call);
2. step the tool's two-state burst chain (one draw);
3. draw a fault from the current state's rates (one draw) and a latency (one draw), plus the
   Retry-After of a would-be 429 (one draw);
4. no fault: call the inner backend, add the work-derived latency (SQLite VM steps), and turn the
   call into a timeout when the total passes the tool's ``timeout_s`` (origin ``agent`` when the
   agent's own work alone passed it);
5. a fault: answer it without calling the inner backend. A timeout takes ``timeout_s``.

Latencies are virtual: nothing sleeps here. The env adds them to its clock. Every tool of the
registry (:func:`agentrl_envs.tools.service_tools`) gets faults; a call of any other tool is
answered 404 ``unknown_tool`` without reaching the inner backend (never a silent pass-through).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agentrl_envs.backends.base import Backend, EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults.profile import FAULT_STATUS, ErrorProfile, ToolFaults
from agentrl_envs.tools import TOOLS, service_tools

__all__ = ["REFUSAL_S", "FaultInjectingBackend"]

#: Virtual seconds a 429 answered inside an earlier Retry-After window takes.
REFUSAL_S = 0.25

_MESSAGES = {
    "http_500": "Internal Server Error: the service failed while handling the call",
    "http_502": "Bad Gateway: an upstream service did not answer properly",
    "http_503": "Service Unavailable: the service is temporarily unavailable",
    "http_401": "Unauthorized: the credentials were rejected or have expired",
    "http_403": "Forbidden: the credentials do not allow this call",
    "http_429": "Too Many Requests: rate limited",
    "timeout": "Timeout: no answer within the client timeout",
    "connection_reset": "Connection reset by peer",
}


@dataclass
class _EpisodeFaults:
    rng: np.random.Generator
    in_burst: dict[str, bool] = field(default_factory=dict)
    retry_until: dict[str, float] = field(default_factory=dict)


class FaultInjectingBackend:
    """Injects a profile's faults and latencies in front of ``inner``.

    Args:
        inner: the backend that really carries out calls (simulated or real).
        profile: the error profile.
    """

    def __init__(self, inner: Backend, profile: ErrorProfile) -> None:
        self.inner = inner
        self.profile = profile
        self._tools: dict[str, ToolFaults] = {}  # per tool of the registry, filled on first use
        self._episodes: dict[str, _EpisodeFaults] = {}

    def open_episode(self, setup: EpisodeSetup) -> None:
        self.inner.open_episode(setup)
        self.start(setup.episode_id, setup.seed)

    def start(self, episode_id: str, seed: int) -> None:
        """Begin injecting into an episode the inner backend already opened.

        Raises:
            ConfigError: ``seed`` is not an integer >= 0.
        """
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seed={seed!r}: fault injection needs an integer seed >= 0")
        self._episodes[episode_id] = _EpisodeFaults(np.random.default_rng([seed, 0xFA17]))

    def forget(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)

    def close_episode(self, episode_id: str) -> None:
        self.forget(episode_id)
        self.inner.close_episode(episode_id)

    def close(self) -> None:
        self._episodes.clear()
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Optional capabilities of the inner backend (workspace files, ...) pass through. Read
        # "inner" from __dict__: during copy/unpickling it is not set yet, and self.inner would recurse.
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def handle(self, request: ToolRequest) -> ToolResponse:
        state = self._episodes.get(request.episode_id)
        cfg = self._faults_of(request.tool)
        if cfg is None:
            # Never a silent pass-through: a tool the registry does not know gets no call.
            return ToolResponse(
                ok=False,
                status=404,
                error_type="unknown_tool",
                error=f"no tool {request.tool[:64]!r}; the tools are {', '.join(service_tools())}",
            )
        if state is None:
            return self.inner.handle(request)
        tool = request.tool
        until = state.retry_until.get(tool, float("-inf"))
        if request.at_s < until:
            wait = until - request.at_s
            # The refusal itself takes a round trip, so even an agent with no think time moves
            # the clock towards the end of the window.
            return _fault(
                tool, "http_429", "injected", min(wait, REFUSAL_S), retry_after_s=wait, detail=f"retry after {wait:.1f} s"
            )

        burst = self._step_burst(state, tool, cfg)
        rates = cfg.burst.rates if (burst and cfg.burst is not None) else cfg.rates
        u = float(state.rng.random())
        latency = cfg.latency.sample_s(state.rng)
        retry_after = float(state.rng.uniform(*cfg.retry_after_s))
        kind = _pick(rates, u)

        if kind is None:
            response = self.inner.handle(request)
            work = TOOLS[tool].work_latency_s(response, cfg)
            total = latency + work + response.latency_s
            if total > cfg.timeout_s:
                origin = "agent" if work > cfg.timeout_s else "injected"
                detail = f"the call needed {total:.1f} s; the client timeout is {cfg.timeout_s:g} s"
                return _fault(tool, "timeout", origin, cfg.timeout_s, detail=detail)
            return replace(response, latency_s=total)
        if kind == "timeout":
            return _fault(tool, kind, "injected", cfg.timeout_s)
        if kind == "http_429":
            state.retry_until[tool] = request.at_s + latency + retry_after
            return _fault(tool, kind, "injected", latency, retry_after_s=retry_after)
        return _fault(tool, kind, "injected", latency)

    def _faults_of(self, tool: str) -> ToolFaults | None:
        cfg = self._tools.get(tool)
        if cfg is None and tool in service_tools():
            cfg = self._tools[tool] = self.profile.for_tool(tool)
        return cfg

    def _step_burst(self, state: _EpisodeFaults, tool: str, cfg: ToolFaults) -> bool:
        u = float(state.rng.random())
        now = state.in_burst.get(tool, False)
        if cfg.burst is not None:
            now = (u >= cfg.burst.exit_p) if now else (u < cfg.burst.enter_p)
            state.in_burst[tool] = now
        return now


def _pick(rates: dict[str, float], u: float) -> str | None:
    acc = 0.0
    for kind, p in rates.items():
        acc += p
        if u < acc:
            return kind
    return None


def _fault(
    tool: str, kind: str, origin: str, latency: float, retry_after_s: float | None = None, detail: str = ""
) -> ToolResponse:
    status = FAULT_STATUS[kind]
    message = _MESSAGES[kind] + (f" ({detail})" if detail else "")
    fault: dict[str, Any] = {"type": kind, "status": status, "origin": origin}
    result: dict[str, Any] = {}
    if retry_after_s is not None:
        fault["retry_after_s"] = round(retry_after_s, 3)
        result["retry_after_s"] = round(retry_after_s, 3)
        message += f"; Retry-After: {retry_after_s:.1f} s"
    return ToolResponse(ok=False, status=status, result=result, error_type=kind, error=message, latency_s=latency, fault=fault)
