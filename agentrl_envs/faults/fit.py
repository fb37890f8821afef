"""``agentrl-envs fit-profile``: an error profile fitted from real API logs.

Input, auto-detected line by line (gzip files are read as such, ``-`` is stdin):

- JSON lines: ``{"ts", "tool" | "endpoint", "status", "latency_ms", "retry_after"?}``. ``ts`` is ISO-8601
  (no zone: UTC) or epoch seconds (values past 1e11 are taken as epoch milliseconds); ``status`` an
  int, or ``"timeout"`` / ``"reset"``; ``retry_after`` the seconds of a 429's Retry-After.
- Access logs in the nginx/Apache "combined" format with the request time as the last field. The
  unit rule: a number with a decimal point is nginx ``$request_time`` (seconds); an integer is Apache
  ``%D`` (microseconds), unless the median integer of the file is below 1000 (a median call faster
  than 1 ms is implausible), in which case that file's integers are Apache ``%T`` (seconds).

``tool`` or ``endpoint`` (the request path for access logs) maps to a tool by substring, first match
wins: ``sql``/``query``/``db`` -> sql, ``python``/``exec``/``run``/``code`` -> python,
``smtp``/``mail``/``email``/``send`` -> smtp; ``--map REGEX=TOOL`` rules are tried first. Status 2xx/3xx
is a success; 401, 403, 429, 500, 502, 503 are faults of that type, other 5xx count as http_500,
499/504/"timeout" as timeout, 599/"reset" as connection_reset; other 4xx are the caller's own errors:
calls, but not faults. Lines that are not usable are skipped and counted by reason, never fatal.

Method, per tool, on calls sorted by time:

1. A 429 that arrives inside an earlier 429's Retry-After window (``ts < ts0 + latency0 +
   retry_after0``) is an echo, not a fresh draw: the injector answers such calls without drawing, so
   echoes are left out of the rates.
2. Rates: with no bursts, the share of each fault type among the calls. Bursts: a two-state hidden
   Markov chain (normal, burst), stepped once per call, each state with its own categorical
   distribution over {ok, fault types}: exactly the injector's model, fitted by Baum-Welch (EM). The
   chain is kept only when it earns its parameters: BIC gain over the one-state model > 10, at least
   three bursts expected in the data, and the burst state at least twice as faulty as the normal one.
3. Latency of successful calls: lognormal with median ``exp(mean(log latency))`` and sigma the std of
   the log latencies (zeros, a logging resolution artefact, count as half the smallest positive value,
   and nothing counts as less than 1 us), or constant when all are equal.
4. ``timeout_s``: the 95th percentile of the latencies of timed-out calls; with no timeouts, the
   largest latency seen or the fitted latency's 99.99th percentile, whichever is larger. The timeout
   rate is then lowered by the share of slow successes the injector itself turns into timeouts.
5. ``retry_after_s``: [min, max] of the Retry-After of fresh 429s (the injector draws uniformly).

Fitted numbers past a profile's ranges (``LIMITS`` in :mod:`agentrl_envs.faults.profile`: latencies up to
one hour, ``sigma`` up to 5, timeouts and Retry-After up to one day) are clamped to them, with a note
in the report: logs with absurd latencies give a profile that still keeps the env's clock finite.

``defaults`` is the fit of all calls pooled (marginal rates, no burst chain: chains are per tool);
``tools`` holds each tool's own fit where it differs from the defaults. Penalties are the defaults.

Libraries: the normal quantile is the standard library's ``statistics.NormalDist``. The two-state
Baum-Welch and the KS statistic stay hand-written: scipy and hmmlearn are not dependencies of the
env side (a scipy wheel is tens of MB, for two functions here), and ``scipy.stats.kstest`` has no
notion of the rounding bins logged latencies need (:func:`ks_lognormal`). ``tests/faults/test_fit.py``
checks that both recover the parameters of synthetic logs drawn from known profiles.
"""

from __future__ import annotations

import argparse
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import yaml

from agentrl_envs._output import check_output, write_atomically
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults.logs import MAX_LINE_BYTES, Call, LogReader, parse_line
from agentrl_envs.faults.profile import (
    DEFAULT_PENALTIES,
    FAULT_TYPES,
    LIMITS,
    ErrorProfile,
    Latency,
    ProfileError,
    parse_profile,
)
from agentrl_envs.tools import service_tools

__all__ = [
    "MAX_LINE_BYTES",
    "Call",
    "FitResult",
    "LogReader",
    "ToolFit",
    "add_arguments",
    "cmd_fit_profile",
    "fit_profile",
    "parse_line",
]

#: The burst chain is fitted on at most this many (most recent) calls per tool.
CHAIN_MAX_CALLS = 200_000

# ------------------------------------------------------------------------------------- fitting


@dataclass
class ToolFit:
    """The fit of one tool (or of all calls pooled, ``tool == "all"``) and what it was fitted from."""

    tool: str
    calls: int
    echoes: int
    counts: Counter[str]
    fields: dict[str, Any]
    success_latencies_s: np.ndarray
    burst_bic_gain: float | None = None
    chain: str = "not tried"
    notes: list[str] = field(default_factory=list)


@dataclass
class FitResult:
    """What :func:`fit_profile` produces: the validated profile, its YAML text and the fits."""

    profile: ErrorProfile
    yaml_text: str
    pooled: ToolFit
    tools: dict[str, ToolFit]


def fit_profile(
    calls: Iterable[Call], name: str, description: str = "", think_time_s: float = 1.0, bursts: bool = True
) -> FitResult:
    """Fit a profile to calls (see the module docstring for the method)."""
    lo, hi = LIMITS["think_time_s"]
    if not (isinstance(think_time_s, (int, float)) and lo <= think_time_s <= hi):
        raise ConfigError(f"think_time_s={think_time_s!r}: use a number of seconds within [{lo:g}, {hi:g}]")
    ordered = sorted(calls, key=lambda c: c.ts)  # stable: equal timestamps keep log order
    if not ordered:
        raise ConfigError("no usable calls to fit a profile to")
    by_tool: dict[str, list[Call]] = {}
    for call in ordered:
        by_tool.setdefault(call.tool, []).append(call)
    split = {tool: _draws(by_tool[tool]) for tool in service_tools() if tool in by_tool}
    fits = {tool: _fit_draws(tool, *split[tool], bursts=bursts) for tool in split}
    # Defaults, for tools missing from the logs: every tool's draws pooled, marginal rates, no chain.
    pooled_draws = sorted((c for draws, _, _ in split.values() for c in draws), key=lambda c: c.ts)
    echoes = sum(e for _, e, _ in split.values())
    pooled = _fit_draws("all", pooled_draws, echoes, [r for _, _, rs in split.values() for r in rs], bursts=False)
    tools: dict[str, dict[str, Any]] = {}
    for tool, fit in fits.items():
        override = {k: v for k, v in fit.fields.items() if pooled.fields.get(k) != v}
        if override:
            tools[tool] = override
    data: dict[str, Any] = {"name": name, "description": description, "think_time_s": think_time_s, "defaults": pooled.fields}
    if tools:
        data["tools"] = tools
    data["penalties"] = dict(DEFAULT_PENALTIES)
    header = f"# Fitted by agentrl-envs fit-profile from {len(ordered):,} calls; see docs/guide/faults.md for the method.\n"
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=160, allow_unicode=True)
    try:
        profile = parse_profile(text, f"fitted profile {name!r}")
    except ProfileError as exc:  # a bug here, not in the logs
        raise ProfileError(f"the fitted profile does not validate ({exc}); please report this") from None
    return FitResult(profile, text, pooled, fits)


def _draws(calls: list[Call]) -> tuple[list[Call], int, list[float]]:
    """Calls that were fresh draws (429 echoes left out), the echo count, fresh Retry-After values."""
    draws: list[Call] = []
    echoes = 0
    retry: list[float] = []
    until = -math.inf
    for call in calls:
        if call.outcome == "http_429":
            end = call.ts + call.latency_s + (call.retry_after_s or 0.0)
            if call.ts < until:
                echoes += 1
                until = max(until, end)
                continue
            if call.retry_after_s is not None:
                retry.append(call.retry_after_s)
                until = end
        draws.append(call)
    return draws, echoes, retry


def _fit_draws(tool: str, draws: list[Call], echoes: int, retry: list[float], bursts: bool) -> ToolFit:
    counts = Counter("ok" if c.outcome == "client_error" else c.outcome for c in draws)
    ok = np.array([c.latency_s for c in draws if c.outcome == "ok"], dtype=float)
    fit = ToolFit(tool, len(draws), echoes, counts, {}, ok)
    latency = _fit_latency(ok if ok.size else np.array([c.latency_s for c in draws if c.outcome != "timeout"]), fit.notes)
    timed_out = np.array([c.latency_s for c in draws if c.outcome == "timeout" and c.latency_s > 0], dtype=float)
    timeout_s = _fit_timeout(latency, timed_out, np.array([c.latency_s for c in draws]), fit.notes)
    tail = tail_probability(Latency(**latency), timeout_s) if timeout_s else 0.0
    faults = [k for k in FAULT_TYPES if counts[k]]
    rates = {k: counts[k] / len(draws) for k in faults}
    burst: dict[str, Any] | None = None
    fit.chain = "off" if not bursts else "not tried (fewer than 200 calls or 10 faults)"
    if bursts and len(draws) >= 200 and sum(counts[k] for k in faults) >= 10:
        symbols = {k: i + 1 for i, k in enumerate(faults)}
        obs = np.array([symbols.get(c.outcome, 0) for c in draws[-CHAIN_MAX_CALLS:]], dtype=np.int64)
        if len(draws) > CHAIN_MAX_CALLS:
            fit.notes.append(f"burst chain fitted on the last {CHAIN_MAX_CALLS:,} calls (EM time grows with calls)")
        chain = _fit_chain(obs, len(faults) + 1)
        fit.burst_bic_gain = chain["bic_gain"]
        fit.chain = f"{'yes' if chain['accept'] else 'no'} (BIC gain {chain['bic_gain']:,.0f})"
        if chain["accept"]:
            rates = {k: float(chain["emit"][0, i + 1]) for i, k in enumerate(faults)}
            burst = {
                "enter_p": _sig(chain["enter_p"]),
                "exit_p": _sig(chain["exit_p"]),
                "rates": _clean_rates({k: float(chain["emit"][1, i + 1]) for i, k in enumerate(faults)}, tail),
            }
    fit.fields["rates"] = _clean_rates(rates, tail)
    if retry:
        fit.fields["retry_after_s"] = [_clamp("retry_after_s", _sig(v), fit.notes) for v in (min(retry), max(retry))]
    fit.fields["latency"] = latency
    if timeout_s is not None:
        fit.fields["timeout_s"] = timeout_s
    if burst is not None:
        fit.fields["burst"] = burst
    return fit


def _fit_latency(latencies_s: np.ndarray, notes: list[str]) -> dict[str, Any]:
    if latencies_s.size == 0:
        notes.append("no latencies to fit: latency 0")
        return {"distribution": "constant", "ms": 0.0}
    if float(latencies_s.max() - latencies_s.min()) <= 1e-9 * max(1.0, float(latencies_s.max())):
        return {"distribution": "constant", "ms": _clamp("ms", _sig(float(latencies_s[0]) * 1000.0), notes)}
    floor = _floor(latencies_s)
    if (latencies_s < floor).any():
        notes.append(f"{int((latencies_s < floor).sum()):,} latencies below {floor * 1000:.3g} ms counted as that")
    logs = np.log(np.maximum(latencies_s, floor))
    median_ms = math.exp(min(700.0, float(logs.mean()))) * 1000.0
    return {
        "distribution": "lognormal",
        "median_ms": _clamp("median_ms", _sig(median_ms), notes),
        "sigma": _clamp("sigma", _sig(float(logs.std())), notes),
    }


def _clamp(name: str, value: float, notes: list[str]) -> float:
    """``value`` within the profile's range for ``name``, with a note when it had to move."""
    lo, hi = LIMITS[name]
    if lo <= value <= hi:
        return value
    clamped = min(max(value, lo), hi)
    notes.append(f"{name} {value:.4g} is outside the profile range [{lo:g}, {hi:g}]: clamped to {clamped:g}")
    return clamped


def _floor(latencies_s: np.ndarray) -> float:
    """Zeros are a logging-resolution artefact: count them as half the smallest positive value (>= 1 us)."""
    positive = latencies_s[latencies_s > 0]
    return max(1e-6, float(positive.min()) / 2 if positive.size else 0.0)


def _fit_timeout(latency: dict[str, Any], timed_out: np.ndarray, all_s: np.ndarray, notes: list[str]) -> float | None:
    if timed_out.size:
        value = float(np.quantile(timed_out, 0.95))
        notes.append(f"timeout_s: 95th percentile of {timed_out.size:,} timed-out calls' latencies")
    else:
        high = latency.get("ms", 0.0) / 1000.0
        if latency["distribution"] == "lognormal":  # its 99.99th percentile
            high = latency["median_ms"] / 1000.0 * math.exp(min(700.0, latency["sigma"] * NormalDist().inv_cdf(1 - 1e-4)))
        value = max(float(all_s.max()) if all_s.size else 0.0, high)
        notes.append("timeout_s: no timeouts logged; the largest latency or the fit's 99.99th percentile")
    if not value > 0 or not math.isfinite(value):
        notes.append("timeout_s: left at the default (no positive latencies)")
        return None
    return _clamp("timeout_s", _round_sig(max(value, 1e-3), 3, math.ceil), notes)  # at least 1 ms


def tail_probability(latency: Latency, timeout_s: float) -> float:
    """P(latency > timeout_s) for a profile's latency distribution."""
    limit_ms = timeout_s * 1000.0
    if latency.distribution == "lognormal" and latency.median_ms > 0 and latency.sigma > 0:
        z = (math.log(limit_ms) - math.log(latency.median_ms)) / latency.sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))
    if latency.distribution == "exponential" and latency.mean_ms > 0:
        return math.exp(-limit_ms / latency.mean_ms)
    value = latency.median_ms if latency.distribution == "lognormal" else latency.ms
    return 1.0 if value > limit_ms else 0.0


def _clean_rates(rates: dict[str, float], tail: float) -> dict[str, float]:
    """Rates as written: the timeout rate net of slow successes, rounded, zeros dropped, sum <= 1."""
    rates = dict(rates)
    if "timeout" in rates and tail > 0:
        other = sum(v for k, v in rates.items() if k != "timeout")
        rates["timeout"] = max(0.0, (rates["timeout"] - (1 - other) * tail) / max(1e-12, 1 - tail))
    out = {k: _sig(v) for k, v in rates.items() if _sig(v) >= 1e-6}
    excess = sum(out.values()) - 1.0
    if excess > 0:  # rounding pushed the sum past 1: take it off the largest rate
        top = max(out, key=lambda k: out[k])
        out[top] = _round_sig(out[top] - excess, 4, math.floor)
    return out


def _fit_chain(obs: np.ndarray, k: int, max_iter: int = 200) -> dict[str, Any]:
    """Baum-Welch for a two-state chain with categorical emissions over ``k`` symbols (0 = ok)."""
    n = obs.size
    freq = np.bincount(obs, minlength=k) / n
    fault = 1.0 - freq[0]
    loglik1 = float(np.sum(np.bincount(obs, minlength=k) * np.log(np.maximum(freq, 1e-300))))
    emit = np.empty((2, k))
    emit[0] = freq * np.r_[1.0, np.full(k - 1, 0.5)]
    high = min(0.9, max(0.3, 5 * fault))
    emit[1] = np.r_[1 - high, freq[1:] / max(fault, 1e-12) * high]
    emit /= emit.sum(axis=1, keepdims=True)
    trans = np.array([[0.99, 0.01], [0.2, 0.8]])
    loglik = -math.inf
    for _ in range(max_iter):
        new, gamma, xi = _forward_backward(obs, trans, emit)
        trans = xi / xi.sum(axis=1, keepdims=True)
        trans = np.clip(trans, 1e-9, 1 - 1e-9)
        trans /= trans.sum(axis=1, keepdims=True)
        for s in range(2):
            weights = np.bincount(obs, weights=gamma[:, s], minlength=k)
            emit[s] = np.maximum(weights / max(weights.sum(), 1e-300), 1e-12)
        emit /= emit.sum(axis=1, keepdims=True)
        done = new - loglik < 1e-6 * abs(new)
        loglik = new
        if done:
            break
    burst = int(emit[1, 0] < emit[0, 0])  # the state with fewer successes is the burst state
    normal = 1 - burst
    emit = emit[[normal, burst]]
    enter, exit_ = float(trans[normal, burst]), float(trans[burst, normal])
    share = enter / (enter + exit_)
    gain = 2 * (loglik - loglik1) - (k + 1) * math.log(n)
    accept = gain > 10 and n * share * exit_ >= 3 and (1 - emit[1, 0]) >= 2 * (1 - emit[0, 0])
    return {"emit": emit, "enter_p": enter, "exit_p": exit_, "bic_gain": gain, "accept": bool(accept)}


def _forward_backward(obs: np.ndarray, trans: np.ndarray, emit: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Scaled forward-backward for two states: log-likelihood, state posteriors, summed transitions."""
    a00, a01, a10, a11 = (float(x) for x in trans.ravel())
    e0: list[float] = emit[0][obs].tolist()
    e1: list[float] = emit[1][obs].tolist()
    n = len(e0)
    f0 = [0.0] * n
    f1 = [0.0] * n
    share = a01 / (a01 + a10)
    x0, x1 = (1 - share) * e0[0], share * e1[0]
    s = x0 + x1
    loglik = math.log(s)
    x0, x1 = x0 / s, x1 / s
    f0[0], f1[0] = x0, x1
    log = math.log
    for t in range(1, n):
        y0 = (x0 * a00 + x1 * a10) * e0[t]
        y1 = (x0 * a01 + x1 * a11) * e1[t]
        s = y0 + y1
        loglik += log(s)
        x0, x1 = y0 / s, y1 / s
        f0[t], f1[t] = x0, x1
    g0 = [0.0] * n
    g0[n - 1] = f0[n - 1]
    b0 = b1 = 1.0
    s00 = s01 = s10 = s11 = 0.0
    for t in range(n - 2, -1, -1):
        m0, m1 = e0[t + 1] * b0, e1[t + 1] * b1
        p, q = f0[t], f1[t]
        x00, x01, x10, x11 = p * a00 * m0, p * a01 * m1, q * a10 * m0, q * a11 * m1
        s = x00 + x01 + x10 + x11
        s00 += x00 / s
        s01 += x01 / s
        s10 += x10 / s
        s11 += x11 / s
        c0, c1 = a00 * m0 + a01 * m1, a10 * m0 + a11 * m1
        s = c0 + c1
        b0, b1 = c0 / s, c1 / s
        w0, w1 = p * b0, q * b1
        g0[t] = w0 / (w0 + w1)
    gamma0 = np.array(g0)
    return loglik, np.stack([gamma0, 1 - gamma0], axis=1), np.array([[s00, s01], [s10, s11]])


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _round_sig(x: float, digits: int, how: Any) -> float:
    """``x`` rounded up (``how=math.ceil``) or down (``math.floor``) to ``digits`` significant digits."""
    if x <= 0:
        return 0.0
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return _sig(how(x / scale + (-1e-9 if how is math.ceil else 1e-9)) * scale, digits)


# ------------------------------------------------------------------------------ goodness of fit


def fitted_rates(profile: ErrorProfile, tool: str) -> dict[str, float]:
    """Long-run share of each fault type the profile produces for ``tool`` (bursts and the latency
    tail past ``timeout_s`` included; Retry-After echoes excluded)."""
    cfg = profile.for_tool(tool)
    share = cfg.burst.stationary_share if cfg.burst is not None else 0.0
    burst_rates = cfg.burst.rates if cfg.burst is not None else {}
    rates = {k: (1 - share) * cfg.rates.get(k, 0.0) + share * burst_rates.get(k, 0.0) for k in FAULT_TYPES}
    rates["timeout"] += (1 - sum(rates.values())) * tail_probability(cfg.latency, cfg.timeout_s)
    return rates


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def ks_lognormal(latencies_s: np.ndarray, latency: Latency) -> float | None:
    """Kolmogorov-Smirnov statistic of the fitted lognormal against the empirical latencies.

    Logged latencies are rounded (nginx: to 1 ms), so each distinct value ``v`` stands for the bin
    ``v +- h/2``, ``h`` the smallest gap between distinct values: the empirical CDF just below and
    at ``v`` is compared with the model at the bin's edges (for unrounded data, plain KS).
    """
    if latency.distribution != "lognormal" or latency.sigma <= 0 or latencies_s.size == 0:
        return None
    floor = _floor(latencies_s)
    values, counts = np.unique(np.maximum(latencies_s, floor), return_counts=True)
    gaps = np.diff(values)
    half = float(gaps.min()) / 2 if gaps.size else 0.0
    at = np.cumsum(counts) / latencies_s.size

    def cdf(x: np.ndarray) -> np.ndarray:
        z = (np.log(np.maximum(x, floor / 2)) - math.log(latency.median_ms / 1000.0)) / (latency.sigma * math.sqrt(2.0))
        return 0.5 * (1.0 + np.array([math.erf(v) for v in z.tolist()]))

    below = at - counts / latencies_s.size
    return float(max(np.max(np.abs(at - cdf(values + half))), np.max(np.abs(below - cdf(values - half)))))


def report(result: FitResult, reader: LogReader | None = None) -> list[str]:
    """The goodness-of-fit summary, as lines of text."""
    lines: list[str] = []
    if reader is not None:
        used = len(reader.calls)
        skipped = sum(reader.skipped.values())
        lines.append(f"read {reader.lines:,} lines from {len(reader.files)} file(s): {used:,} used, {skipped:,} skipped")
        for reason, count in reader.skipped.most_common():
            lines.append(f"  skipped {count:>9,}  {reason}")
        if reader.unmapped:
            top = ", ".join(f"{e!r} x{c:,}" for e, c in reader.unmapped.most_common(5))
            lines.append(f"  endpoints that map to no tool (use --map REGEX=TOOL): {top}")
    for fit in result.tools.values():
        lines.append("")
        lines.extend(_tool_report(result.profile, fit))
    lines.append("")
    lines.append(
        f"defaults (for tools not in the logs): all {result.pooled.calls:,} calls pooled, marginal rates, no burst chain"
    )
    return lines


def _tool_report(profile: ErrorProfile, fit: ToolFit) -> list[str]:
    cfg = profile.for_tool(fit.tool)
    head = f"{fit.tool}: {fit.calls:,} calls"
    if fit.echoes:
        head += f" (+{fit.echoes:,} 429s inside a Retry-After window, not counted)"
    head += f"; burst chain: {fit.chain}"
    if cfg.burst is not None:
        b = cfg.burst
        head += f": enter_p {b.enter_p:g}, exit_p {b.exit_p:g}, {b.stationary_share:.1%} of calls in burst"
    out = [head, f"  {'fault':<17}{'observed':>9}  {'95% interval':<19}{'fitted':>8}"]
    fitted = fitted_rates(profile, fit.tool)
    for kind in FAULT_TYPES:
        if not fit.counts[kind] and fitted[kind] < 5e-7:
            continue
        lo, hi = wilson_interval(fit.counts[kind], fit.calls)
        flag = "" if lo - 1e-9 <= fitted[kind] <= hi + 1e-9 else "  <- OUTSIDE"
        interval = f"[{lo:.4f}, {hi:.4f}]"
        out.append(f"  {kind:<17}{fit.counts[kind] / max(1, fit.calls):>9.4f}  {interval:<19}{fitted[kind]:>8.4f}{flag}")
    lat = cfg.latency
    n = fit.success_latencies_s.size
    if lat.distribution == "lognormal":
        d = ks_lognormal(fit.success_latencies_s, lat)
        text = f"  latency: lognormal, median {lat.median_ms:g} ms, sigma {lat.sigma:g} ({n:,} successes)"
        if d is not None and n > 30:
            # Lilliefors (the parameters come from the same data), in Stephens' form for large n.
            critical = 0.895 / (math.sqrt(n) - 0.01 + 0.85 / math.sqrt(n))
            verdict = "ok" if d <= critical else "POOR FIT"
            text += f"; KS D = {d:.4f}, 5% critical {critical:.4f}: {verdict}"
        elif d is not None:
            text += f"; KS D = {d:.4f}"
        out.append(text)
    else:
        out.append(f"  latency: constant {lat.ms:g} ms ({n:,} successes)")
    out.append(f"  timeout_s {cfg.timeout_s:g}, retry_after_s {list(cfg.retry_after_s)}")
    out.extend(f"  note: {note}" for note in fit.notes)
    return out


# ------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``fit-profile`` arguments (and ``func``) on a (sub)parser."""
    parser.add_argument(
        "logs", nargs="+", metavar="LOG", help="JSON-lines or combined access logs (.gz read as such; - is stdin)"
    )
    parser.add_argument("-o", "--output", required=True, metavar="PROFILE.yaml", help="where to write the profile")
    parser.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    parser.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    parser.add_argument(
        "--think-time",
        dest="think_time_s",
        type=_non_negative_float,
        default=1.0,
        metavar="SECONDS",
        help="think_time_s to write (default 1.0)",
    )
    parser.add_argument(
        "--map",
        dest="endpoint_map",
        action="append",
        default=[],
        metavar="REGEX=TOOL",
        help="map endpoints matching REGEX to TOOL (sql, python, smtp) before the default rules; repeatable",
    )
    parser.add_argument("--no-burst", action="store_true", help="never fit a burst chain")
    parser.set_defaults(func=cmd_fit_profile)


def cmd_fit_profile(args: argparse.Namespace) -> int:
    """Fit, print the goodness-of-fit summary, write the YAML. User errors raise ConfigError."""
    output = check_output(args.output, force=args.force, example="profile.yaml")
    reader = LogReader(_rules(args.endpoint_map))
    for path in args.logs:
        reader.read_path(path)
    if not reader.calls:
        reasons = "; ".join(f"{c:,} {r}" for r, c in reader.skipped.most_common(5)) or "the input is empty"
        raise ConfigError(f"no usable log lines in {', '.join(map(str, args.logs))[:300]} ({reader.lines:,} read: {reasons})")
    name = args.name if args.name is not None else output.stem
    if not name.strip():
        raise ConfigError("--name must not be empty")
    files = ", ".join(Path(f).name for f in reader.files[:3]) + (", ..." if len(reader.files) > 3 else "")
    description = f"Fitted by agentrl-envs fit-profile from {len(reader.calls):,} calls in {files}."
    result = fit_profile(reader.calls, name, description, think_time_s=args.think_time_s, bursts=not args.no_burst)
    for line in report(result, reader):
        print(line)
    _write_atomically(output, result.yaml_text)
    print(f"\nwrote {output} (profile {name!r}); use it with gym.make(..., error_profile={str(output)!r})")
    return 0


def _write_atomically(output: Path, text: str) -> None:
    """Write ``text`` to ``output`` whole or not at all (see :func:`agentrl_envs._output.write_atomically`)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    write_atomically(output, write)


def _rules(specs: Sequence[str]) -> list[tuple[re.Pattern[str], str]]:
    rules = []
    for spec in specs:
        pattern, sep, tool = spec.rpartition("=")
        if not sep or tool not in service_tools() or not pattern:
            raise ConfigError(f"--map {spec[:80]!r}: use REGEX=TOOL with TOOL one of {', '.join(service_tools())}")
        try:
            rules.append((re.compile(pattern), tool))
        except re.error as exc:
            raise ConfigError(f"--map {spec[:80]!r}: bad regular expression ({exc})") from None
    return rules


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text[:40]!r}") from None
    lo, hi = LIMITS["think_time_s"]
    if not (math.isfinite(value) and lo <= value <= hi):
        raise argparse.ArgumentTypeError(f"expected a number of seconds within [{lo:g}, {hi:g}], got {text[:40]!r}")
    return value
