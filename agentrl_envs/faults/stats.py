"""Episode statistics of faults: how many, how often the agent retried, how often it recovered."""

from __future__ import annotations

from typing import Any

from agentrl_envs.backends.base import ToolResponse

__all__ = ["FaultStats", "classify"]

_SERVICE_FAULTS = {500: "http_500", 502: "http_502", 503: "http_503", 401: "http_401", 403: "http_403", 429: "http_429"}


def classify(response: ToolResponse) -> dict[str, Any] | None:
    """``info["fault"]`` for a response: None on success; otherwise the fault's type, status and
    origin: ``injected`` (error profile), ``service`` (a real service's 5xx/401/403/429) or
    ``agent`` (the call itself was wrong, or the agent's own work ran past the timeout)."""
    if response.ok:
        # A program the service ran but that failed is the agent's doing (the python tool).
        if response.result.get("timed_out"):
            return {"type": "timeout", "status": 504, "origin": "agent"}
        code = response.result.get("exit_code")
        if isinstance(code, int) and code != 0:
            return {"type": "exit_code", "status": response.status, "origin": "agent", "exit_code": code}
        return None
    if response.fault is not None:
        return dict(response.fault)
    kind = _SERVICE_FAULTS.get(response.status)
    if kind is not None and response.error_type in (kind, "internal", "bad_gateway", "unavailable", None):
        return {"type": kind, "status": response.status, "origin": "service"}
    if response.error_type == "timeout":
        return {"type": "timeout", "status": response.status, "origin": "agent"}
    return {"type": response.error_type, "status": response.status, "origin": "agent"}


def penalized(fault: dict[str, Any] | None) -> bool:
    """Faults the profile's penalties apply to: injected and service faults, and timeouts."""
    return fault is not None and (fault["origin"] != "agent" or fault["type"] == "timeout")


class FaultStats:
    """Counts per episode. A retry is a call of the same tool right after a faulted call of it; a
    recovery is a later success of a tool that had faulted."""

    def __init__(self) -> None:
        self.faults = 0
        self.retries = 0
        self.recoveries = 0
        self._pending: dict[str, int] = {}
        self._last_faulted: str | None = None

    def record(self, tool: str, ok: bool, fault: dict[str, Any] | None) -> None:
        if self._last_faulted == tool:
            self.retries += 1
        if penalized(fault):
            self.faults += 1
            self._pending[tool] = self._pending.get(tool, 0) + 1
            self._last_faulted = tool
            return
        self._last_faulted = None
        if ok and self._pending.get(tool):
            self.recoveries += self._pending.pop(tool)

    def summary(self) -> dict[str, Any]:
        """Counts, plus ``recovery_rate`` when there was a fault to recover from (absent otherwise,
        so vector envs can batch it as a float)."""
        out: dict[str, Any] = {"faults": self.faults, "retries": self.retries, "recoveries": self.recoveries}
        if self.faults:
            out["recovery_rate"] = self.recoveries / self.faults
        return out
