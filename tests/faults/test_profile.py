"""Error profiles: every shipped profile loads; bad ones fail with a message naming the key and the problem."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs
from agentrl_envs import ConfigError
from agentrl_envs.faults import DEFAULT_PENALTIES, FAULT_STATUS, ErrorProfile, ProfileError, load_profile, parse_profile

error_profiles = importlib.import_module("agentrl_envs.error_profiles")  # shipped from error_profiles/
SHIPPED = ("auth-expiry", "flaky", "none", "outage", "rate-limited", "realistic")


def test_the_six_profiles_ship() -> None:
    assert set(error_profiles.available()) == set(SHIPPED)


@pytest.mark.parametrize("name", error_profiles.available())
def test_every_shipped_profile_loads_and_round_trips(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name and profile.description
    for tool in ("sql", "python", "smtp"):
        cfg = profile.for_tool(tool)
        assert sum(cfg.rates.values()) <= 1.0 and cfg.timeout_s > 0
    for kind in FAULT_STATUS:
        assert profile.penalty(kind) <= 0
    assert parse_profile(profile.to_yaml(), name) == profile
    assert profile.injects == (name != "none")


def test_penalties_default_to_the_field_report() -> None:
    profile = parse_profile("name: bare")
    assert profile.penalty("http_500") == -2.0 and profile.penalty("http_401") == -1.5 and profile.penalty("timeout") == -3.0
    assert {k: profile.penalty(k) for k in FAULT_STATUS} == DEFAULT_PENALTIES


def test_tool_overrides_replace_default_fields() -> None:
    profile = load_profile("realistic")
    assert profile.for_tool("python").latency.median_ms == 150 and profile.for_tool("python").timeout_s == 30
    assert profile.for_tool("sql").latency.median_ms == 60 and profile.for_tool("sql").timeout_s == 10
    assert profile.for_tool("smtp").rates == profile.defaults.rates


# Each case: YAML text, and the pieces the message must hold (the key, then the problem).
BAD: dict[str, tuple[str, list[str]]] = {
    "unknown top-level key": ("name: x\nbogus: 1", ["bogus", "unknown key"]),
    "unknown key in defaults": ("name: x\ndefaults: {bogus: 1}", ["defaults.bogus", "unknown key"]),
    "unknown key in latency": ("name: x\ndefaults: {latency: {bogus: 1}}", ["defaults.latency.bogus", "unknown key"]),
    "unknown key in burst": ("name: x\ndefaults: {burst: {bogus: 1}}", ["defaults.burst.bogus", "unknown key"]),
    "unknown key in a tool": ("name: x\ntools: {sql: {bogus: 1}}", ["tools.sql", "bogus", "unknown key"]),
    "unknown key in a tool's latency": ("name: x\ntools: {smtp: {latency: {x: 1}}}", ["tools.smtp", "latency.x", "unknown key"]),
    "unknown fault type": ("name: x\ndefaults: {rates: {http_418: 0.1}}", ["defaults.rates", "http_418", "unknown fault type"]),
    "probability above 1": ("name: x\ndefaults: {rates: {http_500: 1.5}}", ["defaults.rates", "http_500", "[0, 1]"]),
    "negative probability": ("name: x\ndefaults: {rates: {timeout: -0.1}}", ["defaults.rates", "timeout", "[0, 1]"]),
    "NaN probability": ("name: x\ndefaults: {rates: {timeout: .nan}}", ["defaults.rates", "timeout", "[0, 1]"]),
    "probabilities past 1": ("name: x\ndefaults: {rates: {http_500: 0.6, timeout: 0.6}}", ["defaults.rates", "sum to 1.2"]),
    "burst rates past 1": ("name: x\ndefaults: {burst: {rates: {http_503: 0.9, timeout: 0.2}}}", ["defaults.burst.rates", "sum"]),
    "burst enter_p above 1": (
        "name: x\ndefaults: {burst: {enter_p: 1.5}}",
        ["defaults.burst.enter_p", "less than or equal to 1"],
    ),
    "burst exit_p negative": ("name: x\ndefaults: {burst: {exit_p: -0.5}}", ["defaults.burst.exit_p", "greater than or equal"]),
    "tool rates past 1": ("name: x\ntools: {python: {rates: {http_500: 0.7, http_503: 0.7}}}", ["tools.python", "rates", "sum"]),
    "negative constant latency": (
        "name: x\ndefaults: {latency: {ms: -5}}",
        ["defaults.latency.ms", "greater than or equal to 0"],
    ),
    "negative median": (
        "name: x\ndefaults: {latency: {distribution: lognormal, median_ms: -1, sigma: 1}}",
        ["defaults.latency.median_ms", "greater than or equal to 0"],
    ),
    "negative sigma": (
        "name: x\ndefaults: {latency: {distribution: lognormal, median_ms: 5, sigma: -1}}",
        ["defaults.latency.sigma", "greater than or equal to 0"],
    ),
    "unknown distribution": ("name: x\ndefaults: {latency: {distribution: weibull}}", ["defaults.latency.distribution"]),
    "negative think time": ("name: x\nthink_time_s: -1", ["think_time_s", "greater than or equal to 0"]),
    "zero timeout": ("name: x\ndefaults: {timeout_s: 0}", ["defaults.timeout_s", "greater than 0"]),
    "retry_after_s negative": ("name: x\ndefaults: {retry_after_s: [-1, 2]}", ["defaults.retry_after_s", "0 <= low <= high"]),
    "retry_after_s reversed": ("name: x\ndefaults: {retry_after_s: [3, 1]}", ["defaults.retry_after_s", "0 <= low <= high"]),
    "retry_after_s one number": ("name: x\ndefaults: {retry_after_s: [1]}", ["defaults.retry_after_s", "required"]),
    "retry_after_s a word": ("name: x\ndefaults: {retry_after_s: soon}", ["defaults.retry_after_s"]),
    "unknown tool": ("name: x\ntools: {ftp: {rates: {}}}", ["tools", "ftp", "unknown tool"]),
    "tool not a mapping": ("name: x\ntools: {sql: [1, 2]}", ["tools.sql", "dictionary"]),
    "positive penalty": ("name: x\npenalties: {http_500: 1.0}", ["penalties", "http_500", "[-100, 0]"]),
    "NaN penalty": ("name: x\npenalties: {timeout: .nan}", ["penalties", "timeout", "finite"]),
    "penalty of an unknown fault": ("name: x\npenalties: {http_418: -1}", ["penalties", "http_418", "unknown fault type"]),
    "missing name": ("description: no name", ["name", "required"]),
    "not YAML": ("name: [unclosed\n", ["not valid YAML"]),
    "not a mapping": ("- a\n- b\n", ["YAML mapping"]),
    "a scalar": ("just words", ["YAML mapping"]),
    "empty file": ("", ["YAML mapping"]),
    "nested 10k deep (flow)": ("a: " + "[" * 10_000 + "]" * 10_000, ["nested too deeply"]),
    # 300 levels (90 KB): 10,000 levels of block indentation make 100 MB, which the 1 MiB cap refuses unparsed
    "nested 300 deep (block)": ("".join("  " * i + f"k{i}:\n" for i in range(300)), ["nested too deeply"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_profile_text_names_key_and_problem(case: str) -> None:
    text, pieces = BAD[case]
    with pytest.raises(ProfileError) as err:
        parse_profile(text, "bad.yaml")
    message = str(err.value)
    assert message.startswith("bad.yaml: ")
    for piece in pieces:
        assert piece in message, (piece, message)
    assert len(message) < 1000 and "Traceback" not in message


@pytest.mark.parametrize("case", ["unknown key in a tool", "probabilities past 1", "empty file", "nested 10k deep (flow)"])
def test_bad_profile_file_names_the_file(case: str, tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(BAD[case][0], encoding="utf-8")
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(path) in str(err.value)
    assert all(piece in str(err.value) for piece in BAD[case][1])


def test_a_2mb_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\ndescription: '" + "x" * (2 << 20) + "'\n", encoding="utf-8")
    with pytest.raises(ProfileError, match="larger than 1 MiB"):
        load_profile(path)


def test_binary_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ProfileError, match=str(path)):
        load_profile(path)


@pytest.mark.parametrize("kind", ["missing file", "missing name", "directory", "directory named .yaml", "wrong suffix"])
def test_bad_paths(kind: str, tmp_path: Path) -> None:
    spec: Any = {
        "missing file": tmp_path / "nope.yaml",
        "missing name": "no-such-profile",
        "directory": tmp_path,
        "directory named .yaml": tmp_path / "dir.yaml",
        "wrong suffix": tmp_path / "profile.txt",
    }[kind]
    if kind == "directory named .yaml":
        spec.mkdir()
    if kind == "wrong suffix":
        spec.write_text("name: x\n")
    with pytest.raises(ProfileError) as err:
        load_profile(spec)
    message = str(err.value)
    assert "error_profile=" in message and str(spec) in message
    assert "realistic" in message  # lists the shipped names to choose from


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_bad_path_message_names_the_problem(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(ProfileError, match=r"does not exist|no such file|is a directory"):
        load_profile(path)


@pytest.mark.parametrize("bad", ["[1.0, .nan]", "[1.0, .inf]", "[.nan, .nan]"])
def test_non_finite_retry_after_is_refused(bad: str) -> None:
    with pytest.raises(ProfileError, match="retry_after_s"):
        parse_profile(f"name: x\ndefaults: {{retry_after_s: {bad}}}")


@pytest.mark.parametrize(
    "text",
    [
        "name: x\ndefaults: {latency: {ms: .inf}}",
        "name: x\ndefaults: {latency: {distribution: lognormal, median_ms: .inf, sigma: 1}}",
        "name: x\nthink_time_s: .inf",
    ],
)
def test_infinite_latency_is_refused(text: str) -> None:
    with pytest.raises(ProfileError):
        parse_profile(text)


def test_load_by_name_path_and_object(tmp_path: Path) -> None:
    by_name = load_profile("flaky")
    path = tmp_path / "copy.yml"
    path.write_text(by_name.to_yaml(), encoding="utf-8")
    assert load_profile(path) == by_name
    assert load_profile(str(path)) == by_name
    assert load_profile(by_name) is by_name
    built = ErrorProfile(name="built")
    assert load_profile(built) is built and not built.injects


@pytest.mark.parametrize("bad", ["no-such-profile", "bad-yaml", "bad-rates"])
def test_make_with_a_bad_profile_raises_config_error(bad: str, tmp_path: Path) -> None:
    spec: str = bad
    if bad == "bad-yaml":
        (tmp_path / "p.yaml").write_text("name: [\n")
        spec = str(tmp_path / "p.yaml")
    elif bad == "bad-rates":
        (tmp_path / "p.yaml").write_text("name: p\ndefaults: {rates: {http_500: 2}}\n")
        spec = str(tmp_path / "p.yaml")
    with pytest.raises(ConfigError) as err:
        gym.make("AgentRL/SQLPythonSMTP-v1", error_profile=spec)
    assert "error_profile" in str(err.value) or "p.yaml" in str(err.value)
    assert isinstance(err.value, agentrl_envs.AgentRLError)


@pytest.mark.parametrize("bad", [None, 5, {"name": "x"}])
def test_make_with_a_non_path_profile_raises_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError):
        gym.make("AgentRL/SQLPythonSMTP-v1", error_profile=bad)


def test_profile_error_pickles() -> None:
    import pickle

    try:
        parse_profile("name: x\nbogus: 1", "b.yaml")
    except ProfileError as exc:
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is ProfileError and str(again) == str(exc)


# -- ranges that keep every latency, the clock and every reward finite ----------------------------

HOSTILE = {
    "sigma 1000": (
        "defaults: {latency: {distribution: lognormal, median_ms: 80, sigma: 1000}}",
        "defaults.latency.sigma",
        "sigma",
    ),
    "median 1.6e59": (
        "defaults: {latency: {distribution: lognormal, median_ms: 1.6e59, sigma: 1}}",
        "defaults.latency.median_ms",
        "median_ms",
    ),
    "constant 1e308": ("defaults: {latency: {ms: 1e308}}", "defaults.latency.ms", "ms"),
    "exponential 1e20": (
        "defaults: {latency: {distribution: exponential, mean_ms: 1e20}}",
        "defaults.latency.mean_ms",
        "mean_ms",
    ),
    "think time 1e308": ("think_time_s: 1e308", "think_time_s", "think_time_s"),
    "timeout 1e308": ("defaults: {timeout_s: 1e308}", "defaults.timeout_s", "timeout_s"),
    "retry after 1e308": ("defaults: {retry_after_s: [1, 1e308]}", "defaults.retry_after_s", "retry_after_s"),
    "work latency 1e308": ("defaults: {sql_s_per_mstep: 1e308}", "defaults.sql_s_per_mstep", "sql_s_per_mstep"),
    "penalty -1e308": ("penalties: {timeout: -1e308}", "penalties", "penalty"),
    "penalty -101": ("penalties: {http_500: -101}", "penalties", "penalty"),
    "tool sigma": ("tools: {python: {latency: {distribution: lognormal, median_ms: 5, sigma: 50}}}", "tools.python", "sigma"),
    "tool timeout": ("tools: {sql: {timeout_s: 1e9}}", "tools.sql", "timeout_s"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_values_that_would_overflow_are_refused_naming_field_and_range(case: str) -> None:
    from agentrl_envs.faults.profile import LIMITS

    text, field, name = HOSTILE[case]
    with pytest.raises(ProfileError) as err:
        parse_profile("name: x\n" + text, "hostile.yaml")
    message = str(err.value)
    assert field in message, message
    lo, hi = LIMITS[name]
    assert f"{lo:g}, {hi:g}]" in message, message


def _extreme_profile() -> ErrorProfile:
    from agentrl_envs.faults.profile import LIMITS

    top = {k: hi for k, (_, hi) in LIMITS.items()}
    return parse_profile(
        f"""
name: extreme
think_time_s: {top["think_time_s"]}
defaults:
  rates: {{http_500: 0.2, http_429: 0.2, timeout: 0.2}}
  retry_after_s: [0, {top["retry_after_s"]}]
  latency: {{distribution: lognormal, median_ms: {top["median_ms"]}, sigma: {top["sigma"]}}}
  timeout_s: {top["timeout_s"]}
  sql_s_per_mstep: {top["sql_s_per_mstep"]}
tools:
  python: {{latency: {{distribution: exponential, mean_ms: {top["mean_ms"]}}}}}
  smtp: {{latency: {{ms: {top["ms"]}}}}}
penalties: {{http_500: -100, http_429: -100, timeout: -100}}
"""
    )


def test_draws_at_the_limits_stay_finite_and_below_a_day() -> None:
    import numpy as np

    from agentrl_envs.faults.profile import MAX_DRAW_S

    profile = _extreme_profile()
    rng = np.random.default_rng(0)
    for tool in ("sql", "python", "smtp"):
        draws = [profile.for_tool(tool).latency.sample_s(rng) for _ in range(20_000)]
        assert all(0 <= d <= MAX_DRAW_S for d in draws)
    # The far tails, where the unbounded formula overflows or passes a day.
    from agentrl_envs.faults.profile import Latency

    class Edge:
        def __init__(self, u: float) -> None:
            self.u = u

        def random(self) -> float:
            return self.u

    worst = Latency(distribution="lognormal", median_ms=3_600_000, sigma=5)
    for u in (0.0, 1e-300, 0.5, 1 - 1e-16):
        assert 0 <= worst.sample_s(Edge(u)) <= MAX_DRAW_S  # type: ignore[arg-type]
    assert Latency(distribution="exponential", mean_ms=3_600_000).sample_s(Edge(1 - 1e-16)) == MAX_DRAW_S  # type: ignore[arg-type]


def test_env_under_the_most_extreme_valid_profile_keeps_clock_and_rewards_finite() -> None:
    import math

    from agentrl_envs.agents import RandomAgent

    env = gym.make("AgentRL/SQLPythonSMTP-v1", error_profile=_extreme_profile(), max_steps=30)
    try:
        agent = RandomAgent(env, seed=7)
        for seed in range(3):
            obs, info = env.reset(seed=seed)
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
                total += reward
                assert math.isfinite(reward) and math.isfinite(info["virtual_time_s"])
                done = terminated or truncated
            assert math.isfinite(total)
    finally:
        env.close()


# -- seeds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["abc", -1, 1.5, 2**70, True, [1], {"a": 1}, 1e308])
def test_serve_answers_400_for_a_bad_seed(seed: Any) -> None:
    import json

    from agentrl_envs.server.simulator import SimulatorServer

    server = SimulatorServer(profile=load_profile("flaky"))
    try:
        body = json.dumps({"episode_id": "ep", "seed": seed}).encode()
        status, data, _ = server.dispatch("POST", "/v1/episodes", body, 0.0)
        assert status == 400, data
        assert b"seed" in data
        status, data, _ = server.dispatch("POST", "/v1/episodes", json.dumps({"episode_id": "ep", "seed": 12}).encode(), 0.0)
        assert status == 201, data
        status, _, _ = server.dispatch("POST", "/v1/episodes/ep/sql", b'{"query": "SELECT 1"}', 0.0)
        assert status < 500 or status in (500, 502, 503, 504, 599)  # an answer, possibly an injected fault
    finally:
        server.direct.close()


@pytest.mark.parametrize("seed", [-1, "3", 1.0, None, True])
def test_fault_injection_refuses_a_bad_seed(seed: Any) -> None:
    from agentrl_envs.faults.injector import FaultInjectingBackend
    from tests.faults.fakes import FakeBackend

    backend = FaultInjectingBackend(FakeBackend(), load_profile("flaky"))
    with pytest.raises(ConfigError, match="seed"):
        backend.start("ep", seed)


class _FixedDraw:
    """An rng whose ``random()`` always returns ``u`` (what ``Latency.sample_s`` consumes)."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def test_lognormal_draws_follow_the_normal_quantile() -> None:
    """Quantiles of seeded draws match the model's; the clamped tails match the tabled z of 1e-12."""
    import math
    from statistics import NormalDist

    import numpy as np

    from agentrl_envs.faults.profile import Latency

    lat = Latency(distribution="lognormal", median_ms=100.0, sigma=0.5)
    rng = np.random.default_rng(0)
    draws_ms = np.array([lat.sample_s(rng) for _ in range(20_000)]) * 1000.0
    for q, z in ((0.5, 0.0), (0.05, -1.6448536269514722), (0.95, 1.6448536269514722)):
        assert abs(np.quantile(draws_ms, q) / (100.0 * math.exp(0.5 * z)) - 1) < 0.02, q
    z_tail = -7.034483825301132  # the standard normal quantile at 1e-12 (tables; the old erfinv gave -7.03441)
    assert lat.sample_s(_FixedDraw(0.0)) == pytest.approx(0.1 * math.exp(0.5 * z_tail), rel=1e-12)
    # u clamps to the float 1 - 1e-12, whose upper tail is 1.0000889e-12: by symmetry z = -quantile(that tail).
    z_upper = -NormalDist().inv_cdf(1.0 - (1.0 - 1e-12))
    assert z_upper > -z_tail
    assert lat.sample_s(_FixedDraw(1.0)) == pytest.approx(0.1 * math.exp(0.5 * z_upper), rel=1e-12)
    assert lat.sample_s(_FixedDraw(0.5)) == pytest.approx(0.1, rel=1e-15)
