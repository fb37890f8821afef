"""fit-profile: logs generated from known profiles are fitted back; bad lines are counted, never fatal."""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentrl_envs.cli import main as cli
from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import FAULT_TYPES, ErrorProfile, load_profile
from agentrl_envs.faults.fit import (
    MAX_LINE_BYTES,
    Call,
    FitResult,
    LogReader,
    add_arguments,
    fit_profile,
    fitted_rates,
    parse_line,
    report,
    tail_probability,
    wilson_interval,
)
from tests.faults.fakes import combined, jsonl, simulate

PLAIN = ErrorProfile.model_validate(
    {
        "name": "plain",
        "tools": {
            "sql": {
                "rates": {
                    "http_500": 0.04,
                    "http_502": 0.01,
                    "http_503": 0.02,
                    "http_429": 0.03,
                    "timeout": 0.02,
                    "connection_reset": 0.01,
                },
                "latency": {"distribution": "lognormal", "median_ms": 80, "sigma": 0.6},
                "timeout_s": 8.0,
                "retry_after_s": [2.0, 6.0],
            },
            "python": {
                "rates": {"http_500": 0.03, "http_401": 0.02, "http_403": 0.01, "timeout": 0.04},
                "latency": {"distribution": "lognormal", "median_ms": 300, "sigma": 0.4},
                "timeout_s": 20.0,
            },
            "smtp": {
                "rates": {"http_503": 0.05, "http_429": 0.05},
                "latency": {"distribution": "lognormal", "median_ms": 150, "sigma": 0.5},
                "retry_after_s": [1.0, 2.0],
            },
        },
    }
)
BURSTY = ErrorProfile.model_validate(
    {
        "name": "bursty",
        "defaults": {
            "rates": {"http_500": 0.02},
            "latency": {"distribution": "lognormal", "median_ms": 50, "sigma": 0.5},
            "timeout_s": 5.0,
            "burst": {"enter_p": 0.01, "exit_p": 0.15, "rates": {"http_503": 0.6, "timeout": 0.2}},
        },
    }
)
ACCESS = ErrorProfile.model_validate(
    {
        "name": "access",
        "defaults": {
            "rates": {"http_500": 0.05, "http_502": 0.02, "http_503": 0.03, "http_401": 0.02, "timeout": 0.03},
            "latency": {"distribution": "lognormal", "median_ms": 120, "sigma": 0.7},
            "timeout_s": 6.0,
        },
    }
)
N = 15_000


def fit_lines(lines: list[str], bursts: bool = True) -> tuple[FitResult, LogReader]:
    reader = LogReader()
    for line in lines:
        parsed = parse_line(line.encode())
        assert isinstance(parsed, Call), (parsed, line)
        reader.calls.append(parsed)
    return fit_profile(reader.calls, "fitted", bursts=bursts), reader


def within(rate: float, p: float, n: int, sigmas: float = 4.0) -> bool:
    return abs(rate - p) <= sigmas * math.sqrt(max(p, 1 / n) * (1 - p) / n)


def declared_marginal(profile: ErrorProfile, tool: str) -> dict[str, float]:
    cfg = profile.for_tool(tool)
    share = cfg.burst.stationary_share if cfg.burst else 0.0
    burst = cfg.burst.rates if cfg.burst else {}
    return {k: (1 - share) * cfg.rates.get(k, 0.0) + share * burst.get(k, 0.0) for k in FAULT_TYPES}


@pytest.fixture(scope="module")
def plain_log() -> list[str]:
    return [jsonl(c, iso=i % 2 == 0) for i, c in enumerate(simulate(PLAIN, N, seed=1))]


@pytest.fixture(scope="module")
def plain_fit(plain_log: list[str]) -> FitResult:
    return fit_lines(plain_log)[0]


# ----------------------------------------------------------------------------- recovering a profile


def test_rates_recovered(plain_fit: FitResult) -> None:
    for tool in ("sql", "python", "smtp"):
        fit = plain_fit.tools[tool]
        assert fit.calls + fit.echoes == N
        fitted = fitted_rates(plain_fit.profile, tool)
        for kind, p in declared_marginal(PLAIN, tool).items():
            assert within(fitted[kind], p, fit.calls), (tool, kind, fitted[kind], p)


def test_no_burst_chain_when_there_are_no_bursts(plain_fit: FitResult) -> None:
    for tool in ("sql", "python", "smtp"):
        assert plain_fit.profile.for_tool(tool).burst is None
        gain = plain_fit.tools[tool].burst_bic_gain
        assert gain is not None and gain < 10


def test_latency_timeout_and_retry_after_recovered(plain_fit: FitResult) -> None:
    for tool in ("sql", "python", "smtp"):
        want, got = PLAIN.for_tool(tool), plain_fit.profile.for_tool(tool)
        assert got.latency.distribution == "lognormal"
        assert got.latency.median_ms == pytest.approx(want.latency.median_ms, rel=0.1)
        assert got.latency.sigma == pytest.approx(want.latency.sigma, rel=0.1)
        if want.rates.get("timeout"):
            assert got.timeout_s == pytest.approx(want.timeout_s, rel=0.01)  # injected timeouts take timeout_s
        else:  # no timeouts logged: past every latency seen, and past the fit's 99.99th percentile
            assert got.timeout_s >= plain_fit.tools[tool].success_latencies_s.max()
            assert tail_probability(got.latency, got.timeout_s) <= 1e-4
    lo, hi = plain_fit.profile.for_tool("sql").retry_after_s
    assert 2.0 <= lo < 2.05 and 5.95 < hi <= 6.0


def test_retry_after_echoes_are_not_draws(plain_fit: FitResult) -> None:
    # sql is called every 3 s with Retry-After 2-6 s: some calls land inside a window.
    assert plain_fit.tools["sql"].echoes > 20
    assert plain_fit.tools["python"].echoes == 0


def test_defaults_pool_every_tool(plain_fit: FitResult) -> None:
    pooled = plain_fit.profile.defaults
    calls = sum(f.calls for f in plain_fit.tools.values())
    assert plain_fit.pooled.calls == calls
    for kind in FAULT_TYPES:
        expected = sum(declared_marginal(PLAIN, t)[kind] * plain_fit.tools[t].calls for t in plain_fit.tools) / calls
        assert within(pooled.rates.get(kind, 0.0), expected, calls)
    assert pooled.burst is None and set(plain_fit.profile.tools) == {"sql", "python", "smtp"}


def test_report_flags_nothing_on_a_good_fit(plain_fit: FitResult) -> None:
    text = "\n".join(report(plain_fit))
    assert text.count("burst chain: no") == 3 and "OUTSIDE" not in text
    assert "KS D =" in text and "sql: " in text


def test_fit_is_deterministic(plain_log: list[str]) -> None:
    assert fit_lines(plain_log[:3000])[0].yaml_text == fit_lines(plain_log[:3000])[0].yaml_text


def test_burst_chain_detected() -> None:
    lines = [jsonl(c) for c in simulate(BURSTY, 20_000, seed=2, tools=("sql",))]
    result, _ = fit_lines(lines)
    cfg = result.profile.for_tool("sql")
    assert cfg.burst is not None, "\n".join(report(result))
    assert cfg.burst.enter_p == pytest.approx(0.01, rel=0.35)
    assert cfg.burst.exit_p == pytest.approx(0.15, rel=0.35)
    assert cfg.burst.stationary_share == pytest.approx(0.0625, rel=0.25)
    assert cfg.burst.rates.get("http_503", 0) == pytest.approx(0.6, abs=0.06)
    assert cfg.burst.rates.get("timeout", 0) == pytest.approx(0.2, abs=0.05)
    assert cfg.rates.get("http_500", 0) == pytest.approx(0.02, abs=0.005)
    assert "OUTSIDE" not in "\n".join(report(result))
    # Pooled defaults keep the average rate and drop the chain; the tool keeps its chain.
    assert result.profile.defaults.burst is None and set(result.profile.tools["sql"]) == {"rates", "burst"}
    fitted, declared = fitted_rates(result.profile, "sql"), declared_marginal(BURSTY, "sql")
    assert all(abs(fitted[k] - declared[k]) < 0.02 for k in FAULT_TYPES)
    assert fit_lines(lines, bursts=False)[0].profile.for_tool("sql").burst is None


@pytest.mark.parametrize("fmt", ["nginx", "apache"])
def test_access_logs(fmt: str, tmp_path: Path) -> None:
    lines = [combined(c, apache=fmt == "apache") for c in simulate(ACCESS, 8000, seed=3, tools=("sql", "smtp"))]
    path = tmp_path / f"access.{fmt}.log.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    reader = LogReader()
    reader.read_path(path)
    assert len(reader.calls) == len(lines) and not reader.skipped
    result = fit_profile(reader.calls, "access")
    for tool in ("sql", "smtp"):
        fitted, cfg = fitted_rates(result.profile, tool), result.profile.for_tool(tool)
        for kind, p in declared_marginal(ACCESS, tool).items():
            assert within(fitted[kind], p, 8000), (tool, kind)
        assert cfg.latency.median_ms == pytest.approx(120, rel=0.1)
        assert cfg.timeout_s == pytest.approx(6.0, rel=0.01) and cfg.burst is None


def test_apache_integer_seconds(tmp_path: Path) -> None:
    """%T logs whole seconds: integers whose median is below 1000 are taken as seconds."""
    line = '1.2.3.4 - - [02/Mar/2025:10:00:{s:02d} +0100] "GET /api/query?x=1 HTTP/1.0" 200 10 "-" "c" {t}'
    path = tmp_path / "t.log"
    path.write_text("\n".join(line.format(s=i, t=i % 3 + 1) for i in range(30)) + "\n")
    reader = LogReader()
    reader.read_path(path)
    assert sorted({c.latency_s for c in reader.calls}) == [1.0, 2.0, 3.0]
    assert reader.calls[0].ts == 1740906000.0 and reader.calls[0].tool == "sql"


# ----------------------------------------------------------------------------------- line parsing


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"ts": "2025-01-02T03:04:05Z", "tool": "sql", "status": 200, "latency_ms": 12}', ("sql", 1735787045.0, "ok", 0.012)),
        (
            '{"ts": "2025-01-02T03:04:05", "endpoint": "/v1/run", "status": "timeout", "latency_ms": 5}',
            ("python", 1735787045.0, "timeout", 0.005),
        ),
        (
            '{"ts": 1700000000123, "endpoint": "/send-mail", "status": "reset", "latency_ms": 0}',
            ("smtp", 1700000000.123, "connection_reset", 0.0),
        ),
        ('{"ts": 5, "endpoint": "/dbq", "status": 504, "latency_ms": 1e3}', ("sql", 5.0, "timeout", 1.0)),
        ('{"ts": 5, "endpoint": "/run_query", "status": 418, "latency_ms": 1}', ("sql", 5.0, "client_error", 0.001)),
        ('{"ts": 5, "tool": "PYTHON", "status": 507, "latency_ms": 1}', ("python", 5.0, "http_500", 0.001)),
        ('{"ts": 5, "tool": "smtp", "status": "429", "latency_ms": 1, "retry_after": 2}', ("smtp", 5.0, "http_429", 0.001)),
        (
            '10.0.0.1 - bob [10/Oct/2000:13:55:36 -0700] "GET /db/x HTTP/1.0" 499 0 "-" "ua" 0.250',
            ("sql", 971211336.0, "timeout", 0.25),
        ),
        (
            '10.0.0.1 - - [10/Oct/2000:13:55:36 +0000] "POST /exec HTTP/1.1" 502 0 3000000',
            ("python", 971186136.0, "http_502", 3.0),
        ),
        ('h - - [10/Oct/2000:13:55:36 +0000] "POST /mail HTTP/1.1" 200 5 "-" "ua" rt=0.125', ("smtp", 971186136.0, "ok", 0.125)),
    ],
)
def test_parse_good_lines(line: str, expected: tuple[Any, ...]) -> None:
    call = parse_line(line.encode())
    assert isinstance(call, Call), call
    assert (call.tool, call.ts, call.outcome) == expected[:3]
    assert call.latency_s == pytest.approx(expected[3])


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty line"),
        (b"   \r\n", "empty line"),
        (b"\x00\x01\x02binary", "binary data"),
        (b"\xff\xfe\xfa not utf-8", "binary data"),
        (b"random garbage", "neither JSON nor a combined access log line"),
        (b"{not json", "invalid JSON"),
        (b'{"a":' * 100_000, "JSON nested too deeply"),
        (b'{"ts": 1, "tool": "sql", "status": 200}', "missing key 'latency_ms'"),
        (b'{"ts": 1, "status": 200, "latency_ms": 1}', "missing key 'tool' or 'endpoint'"),
        (b'{"tool": "sql", "status": 200, "latency_ms": 1}', "missing key 'ts'"),
        (b'{"ts": 1, "tool": "ftp", "status": 200, "latency_ms": 1}', "endpoint maps to no tool"),
        (b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": -1}', "negative latency"),
        (b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": NaN}', "latency not a finite number"),
        (b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": Infinity}', "latency not a finite number"),
        (b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": "fast"}', "latency not a finite number"),
        (b'{"ts": NaN, "tool": "sql", "status": 200, "latency_ms": 1}', "bad ts"),
        (b'{"ts": "yesterday", "tool": "sql", "status": 200, "latency_ms": 1}', "bad ts"),
        (b'{"ts": true, "tool": "sql", "status": 200, "latency_ms": 1}', "bad ts"),
        (b'{"ts": 1, "tool": "sql", "status": 999, "latency_ms": 1}', "bad status"),
        (b'{"ts": 1, "tool": "sql", "status": "exploded", "latency_ms": 1}', "bad status"),
        (b'{"ts": 1, "tool": "sql", "status": 429, "latency_ms": 1, "retry_after": -3}', "bad retry_after"),
        (b'{"ts": 1, "tool": ["sql"], "status": 200, "latency_ms": 1}', "tool/endpoint is not a string"),
        (b"[1, 2, 3]", "neither JSON nor a combined access log line"),
        (b'h - - [10/Oct/2000:13:55:36 +0000] "GET /db HTTP/1.1" 200 5 "-" "ua"', "access log line without a request time"),
        (b'h - - [99/Foo/2000:13:55:36 +0000] "GET /db HTTP/1.1" 200 5 "-" "ua" 0.1', "bad ts"),
        (b'h - - [10/Oct/2000:13:55:36 +0000] "GET /health HTTP/1.1" 200 5 "-" "ua" 0.1', "endpoint maps to no tool"),
    ],
)
def test_parse_bad_lines(raw: bytes, reason: str) -> None:
    assert parse_line(raw) == reason


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
@example(b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": 1e400}')
@example(b'{"ts": 1e400, "tool": "sql", "status": 200, "latency_ms": 1}')
@example(b'{"ts": "9999-99-99", "tool": "sql", "status": 200, "latency_ms": 1}')
@example(b'h - - [31/Feb/2000:13:55:36 +9999] "GET /db HTTP/1.1" 200 5 0.1')
@example(b'{"ts": 1' + b"0" * 400 + b', "tool": "sql", "status": 200, "latency_ms": 1}')
@example(b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": 1' + b"0" * 400 + b"}")
@example(b'{"ts": 1, "tool": "sql", "status": 429, "latency_ms": 1, "retry_after": 1' + b"0" * 400 + b"}")
@example(b'{"ts": "9999-12-31T23:59:59-23:59", "tool": "sql", "status": 200, "latency_ms": 1}')
@example(b'h - - [01/Jan/2001:00:00:00 +0000] "GET /db HTTP/1.1" 200 5 1' + b"0" * 400)
@example(b'h - - [01/Jan/2001:00:00:00 +0000] "GET /db HTTP/1.1" 200 5 1' + b"0" * 400 + b".5")
def test_arbitrary_lines_never_crash(raw: bytes) -> None:
    parsed = parse_line(raw)
    assert isinstance(parsed, (Call, str))
    if isinstance(parsed, Call):
        assert math.isfinite(parsed.ts) and math.isfinite(parsed.latency_s) and parsed.latency_s >= 0
        assert parsed.tool in ("sql", "python", "smtp")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=30))
def test_arbitrary_files_never_crash(lines: list[str]) -> None:
    import io

    good = '{"ts": 1, "tool": "sql", "status": 200, "latency_ms": 3}'
    reader = LogReader()
    reader.read_stream(io.BytesIO("\n".join([good, *lines, good]).encode("utf-8", "surrogatepass")))
    assert reader.lines == len(reader.calls) + sum(reader.skipped.values())
    assert len(reader.calls) >= 2


def test_hostile_file_is_counted_not_fatal(tmp_path: Path) -> None:
    good = [jsonl(c) for c in simulate(ACCESS, 100, seed=4, tools=("sql",))]
    hostile = [
        b"garbage here",
        b"",
        bytes(b for b in range(256) if b != 10),
        b"x" * (10 * 1024 * 1024),  # a 10 MB line
        b"[" * 100_000,
        b'{"a":' * 100_000,  # JSON nested 100k deep
        b'{"ts": 1, "tool": "sql", "status": 200}',
        b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": -4}',
        b'{"ts": 1, "tool": "sql", "status": 200, "latency_ms": NaN}',
        b'{"ts": 1, "endpoint": "/healthz", "status": 200, "latency_ms": 1}',
    ]
    path = tmp_path / "mixed.log"
    path.write_bytes(b"\n".join([*(g.encode() for g in good[:50]), *hostile, *(g.encode() for g in good[50:])]) + b"\n")
    reader = LogReader()
    reader.read_path(path)
    assert len(reader.calls) == 100
    assert reader.lines == 100 + len(hostile) == len(reader.calls) + sum(reader.skipped.values())
    assert reader.skipped[f"line longer than {MAX_LINE_BYTES >> 20} MiB"] == 1
    assert reader.skipped["JSON nested too deeply"] == 1
    assert reader.skipped["negative latency"] == 1 and reader.skipped["latency not a finite number"] == 1
    assert reader.skipped["missing key 'latency_ms'"] == 1 and reader.skipped["endpoint maps to no tool"] == 1
    assert reader.unmapped == {"/healthz": 1}
    text = "\n".join(report(fit_profile(reader.calls, "m"), reader))
    assert "10 skipped" in text and "/healthz" in text


def test_truncated_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    lines = "\n".join(jsonl(c) for c in simulate(ACCESS, 300, seed=5)) + "\n"
    blob = gzip.compress(lines.encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(blob[: len(blob) * 2 // 3])
    reader = LogReader()
    reader.read_path(path)
    assert 0 < len(reader.calls) < 900
    assert any("gzip" in reason for reason in reader.skipped)


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(50, 1000)
    assert lo < 0.05 < hi and hi - lo == pytest.approx(0.027, abs=0.002)
    assert wilson_interval(0, 100)[0] == 0.0 and wilson_interval(0, 0) == (0.0, 1.0)


# -------------------------------------------------------------------------------------------- CLI


def args_for(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def small_log(tmp_path: Path) -> Path:
    path = tmp_path / "calls.jsonl"
    path.write_text("\n".join(jsonl(c) for c in simulate("realistic", 400, seed=6)) + "\n")
    return path


def test_cli_writes_a_profile_load_profile_accepts(small_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine.yaml"
    args = args_for(str(small_log), "-o", str(out), "--name", "mine", "--think-time", "0.5")
    assert args.func(args) == 0
    profile = load_profile(out)
    assert profile.name == "mine" and profile.think_time_s == 0.5 and profile.injects
    assert profile.for_tool("smtp").latency.median_ms == pytest.approx(250, rel=0.15)
    printed = capsys.readouterr().out
    assert "read 1,200 lines" in printed and "95% interval" in printed and f"wrote {out}" in printed


def test_cli_refuses_to_overwrite(small_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "taken.yaml"
    out.write_text("mine, not yours\n")
    with pytest.raises(ConfigError, match="--force"):
        args = args_for(str(small_log), "-o", str(out))
        args.func(args)
    assert out.read_text() == "mine, not yours\n"
    args = args_for(str(small_log), "-o", str(out), "--force")
    assert args.func(args) == 0
    assert load_profile(out).name == "taken"


@pytest.mark.parametrize(
    "content", [b"", b"\n\n", b"nothing to see\n\x00\x01\n", b'{"ts": 1, "tool": "ftp", "status": 200, "latency_ms": 1}\n']
)
def test_cli_no_usable_lines(content: bytes, tmp_path: Path) -> None:
    log = tmp_path / "useless.log"
    log.write_bytes(content)
    args = args_for(str(log), "-o", str(tmp_path / "p.yaml"))
    with pytest.raises(ConfigError, match="no usable log lines") as err:
        args.func(args)
    assert str(log) in str(err.value)
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--map", "x=ftp"], "REGEX=TOOL"),
        (["--map", "(=sql"], "bad regular expression"),
        (["missing.log"], "does not exist"),
        ([".", "-o", "p2.yaml"], "directory"),
    ],
)
def test_cli_user_errors(extra: list[str], match: str, small_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = args_for(str(small_log), *extra, "-o", "p.yaml") if extra[0].startswith("--") else args_for(*extra, "-o", "p.yaml")
    with pytest.raises(ConfigError, match=match):
        args.func(args)


def test_cli_map_rules_come_first(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    log.write_text(
        "\n".join(json.dumps({"ts": i, "endpoint": "/v2/jobs", "status": 200, "latency_ms": 10 + i}) for i in range(20)) + "\n"
    )
    out = tmp_path / "m.yaml"
    args = args_for(str(log), "-o", str(out), "--map", "^/v2/jobs$=python")
    assert args.func(args) == 0
    assert load_profile(out).for_tool("python").latency.distribution == "lognormal"


def test_cli_main_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Once fit-profile is wired into ``agentrl-envs``, user errors exit 2 with a one-line message."""
    if "fit-profile" not in cli._parser().format_help():
        pytest.skip("fit-profile is not wired into agentrl_envs/cli/main.py yet")
    log = tmp_path / "empty.log"
    log.write_text("")
    assert cli.main(["fit-profile", str(log), "-o", str(tmp_path / "p.yaml")]) == 2
    assert "no usable log lines" in capsys.readouterr().err


calls_strategy = st.lists(
    st.builds(
        Call,
        tool=st.sampled_from(["sql", "python", "smtp"]),
        ts=st.floats(0, 1e6),
        outcome=st.sampled_from(["ok", "client_error", *FAULT_TYPES]),
        latency_s=st.one_of(st.just(0.0), st.floats(0, 100)),
        retry_after_s=st.one_of(st.none(), st.floats(0, 10)),
    ),
    min_size=1,
    max_size=400,
)


@settings(max_examples=60, deadline=None)
@given(calls=calls_strategy, bursts=st.booleans())
def test_any_calls_fit_a_valid_profile(calls: list[Call], bursts: bool) -> None:
    result = fit_profile(calls, "any", bursts=bursts)
    assert load_profile(result.profile) is result.profile
    assert sum(f.calls + f.echoes for f in result.tools.values()) == len(calls)
    for tool in result.tools:
        assert sum(fitted_rates(result.profile, tool).values()) <= 1 + 1e-9
    report(result)


def test_constant_latency_and_all_faults() -> None:
    calls = [Call("sql", float(i), "ok", 0.05) for i in range(50)] + [Call("smtp", float(i), "http_503", 0.01) for i in range(50)]
    result = fit_profile(calls, "c")
    assert result.profile.for_tool("sql").latency.distribution == "constant"
    assert result.profile.for_tool("sql").latency.ms == 50.0
    assert result.profile.for_tool("smtp").rates == {"http_503": 1.0}
    assert np.isfinite(result.profile.for_tool("smtp").timeout_s)


# -- hostile logs and planted symbolic links -------------------------------------------------------


@pytest.mark.parametrize(
    ("latencies_ms", "field"),
    [
        ([1.6e62] * 30 + [1.7e62] * 30, "median_ms"),  # lognormal median far past an hour
        ([1e-3] * 30 + [1e300] * 30, "sigma"),  # a spread no lognormal should have
        ([5e15] * 60, "ms"),  # constant latency of 150,000 years
    ],
    ids=["huge-median", "huge-sigma", "huge-constant"],
)
def test_hostile_latencies_are_clamped_with_a_note(latencies_ms: list[float], field: str, tmp_path: Path) -> None:
    from agentrl_envs.faults.profile import LIMITS

    log = tmp_path / "hostile.jsonl"
    lines = [json.dumps({"ts": i, "tool": "sql", "status": 200, "latency_ms": v}) for i, v in enumerate(latencies_ms)]
    lines += [json.dumps({"ts": 100 + i, "tool": "sql", "status": 429, "latency_ms": 1, "retry_after": 1e200}) for i in range(3)]
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "p.yaml"
    args = args_for(str(log), "-o", str(out))
    assert args.func(args) == 0
    profile = load_profile(out)
    cfg = profile.for_tool("sql")
    assert getattr(cfg.latency, field) == LIMITS[field][1]
    assert cfg.timeout_s <= LIMITS["timeout_s"][1] and max(cfg.retry_after_s) <= LIMITS["retry_after_s"][1]
    assert any("clamped" in note for note in fit_profile(simulate_calls(log), "x").tools["sql"].notes)


def simulate_calls(log: Path) -> list[Call]:
    from agentrl_envs.faults.logs import LogReader

    reader = LogReader([])
    reader.read_path(str(log))
    return reader.calls


def test_think_time_out_of_range_is_refused(small_log: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        args_for(str(small_log), "-o", str(tmp_path / "p.yaml"), "--think-time", "1e308")
    with pytest.raises(ConfigError, match=r"\[0, 3600\]"):
        fit_profile([Call("sql", 0.0, "ok", 0.1)], "x", think_time_s=1e308)


def test_output_symlink_is_refused_and_its_target_untouched(small_log: Path, tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    for name, points_to in (("link.yaml", target), ("dangling.yaml", tmp_path / "nowhere.yaml")):
        link = tmp_path / name
        link.symlink_to(points_to)
        for extra in ([], ["--force"]):
            args = args_for(str(small_log), "-o", str(link), *extra)
            with pytest.raises(ConfigError, match="symbolic link"):
                args.func(args)
    assert target.read_text() == "keep me\n"
    assert not (tmp_path / "nowhere.yaml").exists()


def test_planted_temporary_files_are_never_followed(small_log: Path, tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out.yaml"
    # Every name the old code (and a guessable scheme) would have used for its temporary file.
    for planted in ("out.yaml.tmp", ".out.yaml.tmp", "out.tmp", ".out.yaml.0.tmp"):
        (tmp_path / planted).symlink_to(target)
    args = args_for(str(small_log), "-o", str(out))
    assert args.func(args) == 0
    assert target.read_text() == "keep me\n"
    assert not out.is_symlink() and load_profile(out).name == "out"
    leftovers = {p.name for p in tmp_path.iterdir()} - {"precious.txt", "out.yaml", "calls.jsonl"}
    assert leftovers == {"out.yaml.tmp", ".out.yaml.tmp", "out.tmp", ".out.yaml.0.tmp"}  # only the planted links


def test_a_failed_write_leaves_no_temporary_file(small_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def broken(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    args = args_for(str(small_log), "-o", str(tmp_path / "p.yaml"))
    with pytest.raises(ConfigError, match="could not be written: disk full"):  # a one-line error, not a traceback
        args.func(args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl"]
