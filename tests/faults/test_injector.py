"""FaultInjectingBackend: replay by seed, declared rates, bursts, Retry-After, timeouts, and the inner
backend left alone on injected faults. Statistical checks use 4-sigma binomial tolerances."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.backends.base import Backend, EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.faults import FAULT_STATUS, FAULT_TYPES, ErrorProfile, load_profile
from agentrl_envs.faults.injector import REFUSAL_S, FaultInjectingBackend
from tests.faults.fakes import TOOLS, FakeBackend, injecting

SHIPPED_INJECTING = ("auth-expiry", "flaky", "outage", "rate-limited", "realistic")


def make_profile(**defaults: Any) -> ErrorProfile:
    tools = defaults.pop("tools", {})
    return ErrorProfile.model_validate({"name": "test", "defaults": defaults, "tools": tools})


def within(count: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    """Whether ``count`` of ``n`` is within ``sigmas`` binomial standard deviations of ``n * p``."""
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1e-9


def run(backend: FaultInjectingBackend, plan: list[tuple[str, float]], episode: str = "ep") -> list[ToolResponse]:
    """Calls as the env makes them: the clock advances by the plan's gaps and by each latency."""
    clock = 0.0
    out = []
    for tool, gap in plan:
        clock += gap
        response = backend.handle(ToolRequest(episode, tool, {"q": 1}, at_s=clock))
        clock += response.latency_s
        out.append(response)
    return out


def test_fake_backend_is_a_backend() -> None:
    assert isinstance(FakeBackend(), Backend)
    assert isinstance(FaultInjectingBackend(FakeBackend(), load_profile("none")), Backend)


# ------------------------------------------------------------------------------- (a) replay by seed

plans = st.lists(st.tuples(st.sampled_from(TOOLS), st.floats(0.0, 5.0)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), plan=plans, name=st.sampled_from(SHIPPED_INJECTING))
def test_same_seed_same_responses(seed: int, plan: list[tuple[str, float]], name: str) -> None:
    first = run(injecting(name, seed)[0], plan)
    again = run(injecting(name, seed)[0], plan)
    assert first == again  # ok, status, result, error, latency_s and fault, field by field


@settings(max_examples=30, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**31 - 1), min_size=2, max_size=2, unique=True))
def test_different_seeds_differ(seeds: list[int]) -> None:
    plan = [(TOOLS[i % 3], 1.0) for i in range(30)]
    a, b = (run(injecting("flaky", s)[0], plan) for s in seeds)
    assert [r.latency_s for r in a] != [r.latency_s for r in b]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), plan=plans)
def test_episodes_replay_independently(seed: int, plan: list[tuple[str, float]]) -> None:
    """Two episodes with the same seed on one backend, interleaved, each replay the episode run alone."""
    alone = run(injecting("realistic", seed)[0], plan)
    backend, _ = injecting("realistic", seed)
    backend.open_episode(EpisodeSetup("other", None, seed=seed))
    clocks = {"ep": 0.0, "other": 0.0}
    got: dict[str, list[ToolResponse]] = {"ep": [], "other": []}
    for tool, gap in plan:
        for episode in ("other", "ep"):
            clocks[episode] += gap
            response = backend.handle(ToolRequest(episode, tool, {}, at_s=clocks[episode]))
            clocks[episode] += response.latency_s
            got[episode].append(response)
    assert got["ep"] == alone == got["other"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), plan=plans, name=st.sampled_from(SHIPPED_INJECTING))
def test_response_invariants_and_inner_calls(seed: int, plan: list[tuple[str, float]], name: str) -> None:
    """(f) every fault is well formed, and the inner backend sees exactly the calls that were not injected faults."""
    backend, inner = injecting(name, seed)
    responses = run(backend, plan)
    for r in responses:
        assert math.isfinite(r.latency_s) and r.latency_s >= 0
        if r.fault is None:
            assert r.ok and r.status == 200 and r.result["echo"] in TOOLS
            continue
        assert not r.ok and r.fault["type"] in FAULT_TYPES and r.status == FAULT_STATUS[r.fault["type"]] == r.fault["status"]
        assert r.error_type == r.fault["type"] and r.error
        assert r.fault["origin"] in ("injected", "agent")
        assert (r.fault["type"] == "http_429") == ("retry_after_s" in r.fault)
    passed_through = [r for r in responses if r.fault is None or r.fault["origin"] == "agent"]
    assert len(inner.calls) == len(passed_through)


# ------------------------------------------------------------------------------- (b) declared rates

RATES = {
    "sql": {"http_500": 0.05, "http_502": 0.02, "http_503": 0.03, "http_429": 0.03, "timeout": 0.02, "connection_reset": 0.01},
    "python": {"http_500": 0.02, "http_401": 0.04, "http_403": 0.01, "timeout": 0.05},
    "smtp": {"http_503": 0.10, "http_429": 0.05, "http_401": 0.01},
}


def test_declared_rates_hold_over_20000_draws_per_tool() -> None:
    n = 20_000
    profile = make_profile(
        retry_after_s=[0.001, 0.002],
        latency={"distribution": "lognormal", "median_ms": 50, "sigma": 0.5},
        timeout_s=10.0,
        tools={tool: {"rates": rates} for tool, rates in RATES.items()},
    )
    backend, inner = injecting(profile, seed=7)
    counts = {tool: dict.fromkeys(FAULT_TYPES, 0) for tool in TOOLS}
    latencies: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    for i in range(n * 3):
        tool = TOOLS[i % 3]
        # 10 s apart: always past the tiny Retry-After windows, so every call is a fresh draw.
        r = backend.handle(ToolRequest("ep", tool, {}, at_s=10.0 * i))
        if r.fault is None:
            latencies[tool].append(r.latency_s)
        else:
            counts[tool][r.fault["type"]] += 1
    for tool in TOOLS:
        for kind in FAULT_TYPES:
            p = RATES[tool].get(kind, 0.0)
            assert within(counts[tool][kind], n, p), (tool, kind, counts[tool][kind], n * p)
        ok = np.array(latencies[tool])
        assert abs(np.median(ok) - 0.050) < 0.050 * 0.03
        assert abs(np.log(ok).std() - 0.5) < 0.02
    assert len(inner.calls) == sum(len(v) for v in latencies.values())


def test_429_windows_refuse_calls_without_drawing() -> None:
    """With a real Retry-After window, the declared 429 rate holds among fresh draws; echoes are extra."""
    n = 20_000
    profile = make_profile(rates={"http_429": 0.1, "http_500": 0.05}, retry_after_s=[2.0, 4.0])
    backend, _ = injecting(profile, seed=3)
    until = -math.inf
    fresh = {"http_429": 0, "http_500": 0}
    echoes = draws = 0
    for i in range(n):
        at = 1.0 * i
        r = backend.handle(ToolRequest("ep", "sql", {}, at_s=at))
        if at < until:
            echoes += 1
            assert r.status == 429 and 0.0 < r.latency_s <= REFUSAL_S
            assert r.fault is not None and r.fault["retry_after_s"] == pytest.approx(until - at, abs=1e-3)
            continue
        draws += 1
        if r.fault is not None:
            fresh[r.fault["type"]] += 1
            if r.fault["type"] == "http_429":
                until = at + r.latency_s + r.fault["retry_after_s"]
    assert echoes > 0.05 * n
    assert within(fresh["http_429"], draws, 0.1) and within(fresh["http_500"], draws, 0.05)


# ----------------------------------------------------------------------------------- (c) bursts

BURST = {"enter_p": 0.02, "exit_p": 0.10, "rates": {"http_503": 0.6}}


def fault_runs(faulted: list[bool]) -> list[int]:
    runs, length = [], 0
    for f in faulted:
        if f:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return runs + ([length] if length else [])


def test_bursts_change_rates_as_declared() -> None:
    n = 50_000
    backend, _ = injecting(make_profile(rates={"http_500": 0.02}, burst=BURST), seed=11)
    in_burst, faulted, kinds = [], [], {"http_500": 0, "http_503": 0}
    for i in range(n):
        r = backend.handle(ToolRequest("ep", "sql", {}, at_s=float(i)))
        in_burst.append(backend._episodes["ep"].in_burst["sql"])
        faulted.append(r.fault is not None)
        if r.fault is not None:
            kinds[r.fault["type"]] += 1
    share = 0.02 / (0.02 + 0.10)
    # The chain's states are correlated over ~1/(enter+exit) calls: widen the binomial sigma by
    # the variance inflation (1 + lam) / (1 - lam) of a two-state chain with lam = 1 - enter - exit.
    lam = 1 - 0.12
    inflation = math.sqrt((1 + lam) / (1 - lam))
    sd = math.sqrt(share * (1 - share) / n) * inflation
    assert abs(np.mean(in_burst) - share) < 4 * sd
    expected = (1 - share) * 0.02 + share * 0.6
    assert abs(np.mean(faulted) - expected) < 4 * sd * 0.6 + 4 * math.sqrt(expected / n)
    # Each state draws from its own rates: 503s only in bursts, 500s only outside.
    assert abs(kinds["http_503"] / max(1, sum(in_burst)) - 0.6) < 0.03
    assert abs(kinds["http_500"] / (n - sum(in_burst)) - 0.02) < 0.005

    # Same average rate without bursts: fault runs are much shorter.
    plain, _ = injecting(make_profile(rates={"http_500": expected}), seed=11)
    flat = [plain.handle(ToolRequest("ep", "sql", {}, at_s=float(i))).fault is not None for i in range(n)]
    assert abs(np.mean(flat) - expected) < 4 * math.sqrt(expected / n)
    bursty_runs, flat_runs = np.mean(fault_runs(faulted)), np.mean(fault_runs(flat))
    assert flat_runs == pytest.approx(1 / (1 - expected), rel=0.05)
    assert bursty_runs > 1.5 * flat_runs


def test_burst_chains_are_per_tool() -> None:
    profile = make_profile(tools={"smtp": {"burst": {"enter_p": 1.0, "exit_p": 0.0, "rates": {"http_503": 1.0}}}})
    backend, _ = injecting(profile)
    responses = run(backend, [(TOOLS[i % 3], 1.0) for i in range(30)])
    assert all((r.status == 503) == (i % 3 == 2) for i, r in enumerate(responses))


# ------------------------------------------------------------------------------ (d) Retry-After


def alternating_429(retry: float = 2.0) -> ErrorProfile:
    """The first call is a 429 (enter_p 1), the next fresh draw is normal (exit_p 1): deterministic."""
    return make_profile(
        retry_after_s=[retry, retry],
        latency={"distribution": "constant", "ms": 100},
        burst={"enter_p": 1.0, "exit_p": 1.0, "rates": {"http_429": 1.0}},
    )


def test_429_then_refused_inside_the_window_then_normal() -> None:
    backend, inner = injecting(alternating_429(retry=2.0))
    first = backend.handle(ToolRequest("ep", "smtp", {}, at_s=10.0))
    assert first.status == 429 and first.fault == {"type": "http_429", "status": 429, "origin": "injected", "retry_after_s": 2.0}
    assert first.latency_s == pytest.approx(0.1) and first.result["retry_after_s"] == 2.0
    assert "Retry-After" in (first.error or "")
    # The window ends at 10 + 0.1 + 2.0 = 12.1.
    for at in (10.1, 11.0, 12.09):
        again = backend.handle(ToolRequest("ep", "smtp", {}, at_s=at))
        assert again.status == 429 and 0.0 < again.latency_s <= REFUSAL_S
        assert again.fault is not None and again.fault["retry_after_s"] == pytest.approx(12.1 - at, abs=1e-3)
    assert inner.calls == []
    # Other tools are not rate limited by smtp's window (their own chain starts in burst too).
    assert backend.handle(ToolRequest("ep", "sql", {}, at_s=11.0)).status == 429
    after = backend.handle(ToolRequest("ep", "smtp", {}, at_s=12.1))
    assert after.ok and after.fault is None and len(inner.calls) == 1 and inner.calls[0].tool == "smtp"


def test_retry_after_is_drawn_from_its_range() -> None:
    backend, _ = injecting(make_profile(rates={"http_429": 1.0}, retry_after_s=[1.0, 3.0]))
    waits = []
    for i in range(2000):
        r = backend.handle(ToolRequest("ep", "sql", {}, at_s=10.0 * i))
        assert r.fault is not None and r.fault["type"] == "http_429"
        waits.append(r.fault["retry_after_s"])
    assert 1.0 <= min(waits) < 1.05 and 2.95 < max(waits) <= 3.0
    assert abs(np.mean(waits) - 2.0) < 0.06


# ---------------------------------------------------------------------------------- (e) timeouts


def test_injected_timeouts_take_timeout_s() -> None:
    backend, inner = injecting(make_profile(rates={"timeout": 1.0}, timeout_s=7.5))
    for tool in TOOLS:
        r = backend.handle(ToolRequest("ep", tool, {}, at_s=0.0))
        assert r.status == 504 and r.latency_s == 7.5
        assert r.fault == {"type": "timeout", "status": 504, "origin": "injected"}
    assert inner.calls == []


def test_agent_caused_timeouts() -> None:
    # 300e6 VM steps at 0.05 s per million steps = 15 s of work, past the 10 s timeout.
    profile = make_profile(timeout_s=10.0, sql_s_per_mstep=0.05)
    backend, inner = injecting(profile, vm_steps=300_000_000)
    r = backend.handle(ToolRequest("ep", "sql", {"query": "SELECT heavy"}, at_s=0.0))
    assert r.fault is not None and r.fault["origin"] == "agent" and r.fault["type"] == "timeout"
    assert r.status == 504 and r.latency_s == 10.0 and "15.0 s" in (r.error or "")
    assert len(inner.calls) == 1  # the work really ran
    # Python and smtp answers carry no VM steps: no work latency.
    assert backend.handle(ToolRequest("ep", "python", {}, at_s=20.0)).ok


def test_work_below_the_timeout_adds_latency() -> None:
    profile = make_profile(timeout_s=10.0, latency={"distribution": "constant", "ms": 200})
    backend, _ = injecting(profile, vm_steps=100_000_000)  # 5 s of work
    r = backend.handle(ToolRequest("ep", "sql", {}, at_s=0.0))
    assert r.ok and r.latency_s == pytest.approx(5.2)


def test_slow_service_plus_work_is_an_injected_timeout() -> None:
    # 6 s of service latency + 5 s of work: past 10 s, but the agent's work alone was not.
    profile = make_profile(timeout_s=10.0, latency={"distribution": "constant", "ms": 6000})
    backend, _ = injecting(profile, vm_steps=100_000_000)
    r = backend.handle(ToolRequest("ep", "sql", {}, at_s=0.0))
    assert r.fault is not None and r.fault["origin"] == "injected" and r.latency_s == 10.0


def test_inner_latency_counts_toward_the_timeout() -> None:
    backend, _ = injecting(make_profile(timeout_s=1.0), latency_s=2.0)
    r = backend.handle(ToolRequest("ep", "python", {}, at_s=0.0))
    assert r.fault is not None and r.fault["type"] == "timeout" and r.latency_s == 1.0


# ------------------------------------------------------------------- (f) inner backend, plumbing


def test_injected_faults_do_not_reach_the_inner_backend() -> None:
    backend, inner = injecting("flaky", seed=5)
    responses = run(backend, [(TOOLS[i % 3], 1.0) for i in range(3000)])
    injected = [r for r in responses if r.fault is not None]
    assert 400 < len(injected) < 800  # flaky: about one call in five
    assert len(inner.calls) == len(responses) - len(injected)


def test_plumbing_passes_through() -> None:
    backend, inner = injecting("flaky")
    assert inner.opened == ["ep"]
    # Unknown episodes go straight to the inner backend; a tool the registry does not know is an
    # error, never a silent pass-through (issue #15).
    assert backend.handle(ToolRequest("unknown", "sql", {}, at_s=0.0)).ok
    calls = len(inner.calls)
    for tool in ("finish", "no_such_tool"):
        refused = backend.handle(ToolRequest("ep", tool, {}, at_s=0.0))
        assert (refused.ok, refused.status, refused.error_type) == (False, 404, "unknown_tool")
    assert len(inner.calls) == calls
    assert backend.vm_steps == inner.vm_steps  # optional capabilities pass through
    backend.close_episode("ep")
    assert inner.opened == [] and "ep" not in backend._episodes
    backend.close_episode("never-opened")
    backend.close()
    assert inner.closed


def test_none_profile_injects_nothing() -> None:
    backend, inner = injecting("none", vm_steps=0)  # (VM steps would add work latency even here)
    responses = run(backend, [(TOOLS[i % 3], 0.0) for i in range(300)])
    assert all(r.ok and r.latency_s == 0.0 and r.fault is None for r in responses)
    assert len(inner.calls) == 300


def test_backend_copies() -> None:
    backend, _ = injecting("flaky")
    clone = copy.copy(backend)
    assert clone.inner is backend.inner
