"""What ``agentrl-train serve`` reports about itself: ``GET /v1/models``, ``GET /v1/adapters`` and ``/metrics``.

The per-version numbers are the router's (:class:`~agentrl_train.serve.canary.VersionStats`), the swap
numbers the engine's (:class:`~agentrl_train.serve.engine.SwapStats`); :class:`Counters` holds the
server's own counts. Each is kept in one place and only read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl_train.serve.canary import Router

__all__ = ["BASE_NAMES", "Counters", "adapter_list", "metrics_text", "model_list", "served_names"]

BASE_NAMES = ("base",)  #: the name of the local base model without adapters (its --model value too)


@dataclass
class Counters:
    """Counts of the server's own (the router keeps per-version numbers, the engine the swaps)."""

    refused_loads: int = 0  #: adapter loads refused before any swap
    feedback: int = 0  #: episode outcomes taken
    completions: int = 0  #: ``/v1/completions`` answered


def served_names(router: Router, local: bool) -> str:
    """The names a request may ask for, for an error message (``base`` with a ``local`` model)."""
    return ", ".join([*router.deployments, *(["base"] if local else [])]) or "none"


def adapter_list(router: Router) -> dict[str, Any]:
    """``GET /v1/adapters``: each served name, its versions and canary fraction (no paths)."""
    data = [
        {
            "name": n,
            "stable": d.stable.label,
            "stable_source": d.stable.source,
            "canary": d.canary.label if d.canary else None,
            "canary_source": d.canary.source if d.canary else None,
            "fraction": d.fraction,
        }
        for n, d in router.deployments.items()
    ]
    return {"object": "list", "data": data}


def model_list(router: Router, base_model: str | None, base_label: str) -> dict[str, Any]:
    """``GET /v1/models``: the served names, then the base's (``base_model`` is the local model; None for an upstream)."""
    parent = {"parent": base_model} if base_model is not None else {}  # vLLM names an adapter's base so
    data = [
        {"id": n, "object": "model", "owned_by": "agentrl", "version": d.stable.label, **parent}
        for n, d in router.deployments.items()
    ]
    if base_model is not None:
        for n in dict.fromkeys(("base", base_model)):
            data.append({"id": n, "object": "model", "owned_by": "agentrl", "version": base_label})
    return {"object": "list", "data": data}


def metrics_text(router: Router, counters: Counters, swaps: Any) -> str:
    """Prometheus text exposition (version 0.0.4); ``swaps`` is the engine's
    :class:`~agentrl_train.serve.engine.SwapStats` (None without a local model: no swaps)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.extend([f"# HELP agentrl_serve_{name} {help_text}", f"# TYPE agentrl_serve_{name} {kind}"])
        for labels, value in samples:
            tag = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"agentrl_serve_{name}{{{tag}}} {value}" if tag else f"agentrl_serve_{name} {value}")

    per: list[tuple[dict[str, str], Any]] = []
    for name, dep in router.deployments.items():
        for label, s in dep.stats.items():
            role = "stable" if label == dep.stable.label else "canary" if dep.canary and label == dep.canary.label else "retired"
            per.append(({"model": name, "version": label, "role": role}, s))
    metric("requests_total", "counter", "chat completions answered, by version", [(k, s.requests) for k, s in per])
    metric("request_errors_total", "counter", "chat completions that failed, by version", [(k, s.errors) for k, s in per])
    metric(
        "tool_calls_parsed_total",
        "counter",
        "replies whose tool call parsed, by version",
        [(k, s.tool_calls_parsed) for k, s in per],
    )
    metric(
        "request_latency_seconds_sum",
        "counter",
        "total chat latency, by version",
        [(k, round(s.latency_s_sum, 6)) for k, s in per],
    )
    metric("episodes_total", "counter", "episode outcomes reported, by version", [(k, s.episodes) for k, s in per])
    metric("episode_successes_total", "counter", "successful episodes reported, by version", [(k, s.successes) for k, s in per])
    metric(
        "canary_fraction",
        "gauge",
        "traffic fraction of the candidate",
        [({"model": n}, d.fraction) for n, d in router.deployments.items()],
    )
    metric(
        "decisions_total",
        "counter",
        "promotions and rollbacks",
        [
            ({"model": n, "action": a}, sum(x.action == a for x in d.decisions))
            for n, d in router.deployments.items()
            for a in ("promote", "rollback")
        ],
    )
    count, seconds_sum, seconds_last = (
        (swaps.count, swaps.seconds_sum, swaps.seconds_last) if swaps is not None else (0, 0.0, 0.0)
    )
    metric("swaps_total", "counter", "adapter weights swapped in (reloads and canaries)", [({}, count)])
    metric("swap_seconds_sum", "counter", "time spent swapping", [({}, round(seconds_sum, 6))])
    metric("swap_seconds_last", "gauge", "the last swap's time", [({}, round(seconds_last, 6))])
    c = counters
    metric("refused_loads_total", "counter", "adapter loads refused before any swap", [({}, c.refused_loads)])
    metric("completions_total", "counter", "/v1/completions answered (all models)", [({}, c.completions)])
    metric("feedback_total", "counter", "episode outcomes taken by /v1/feedback (all models)", [({}, c.feedback)])
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
