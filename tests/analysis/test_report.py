"""The reward validation report: a small run passes and writes its plots; failures exit non-zero."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agentrl_envs import ConfigError
from agentrl_envs.analysis.report import (
    Thresholds,
    _correlation,
    _Episode,
    _term_stats,
    add_arguments,
    check_rewards,
    cmd_check_rewards,
)

PNG = b"\x89PNG\r\n\x1a\n"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[bool, Path]:
    # v0: its long-horizon oracle episodes are 16 steps, each a tool boundary (v1's staff lookups vary the length)
    return check_rewards("AgentRL/SQLPythonSMTP-v0", 2, "oracle,random", tmp_path_factory.mktemp("report"), progress=False)


def test_small_run_passes_and_writes_the_report(pipeline_report: tuple[bool, Path]) -> None:
    passed, path = pipeline_report
    assert passed and path.name == "report.md"
    text = path.read_text()
    for section in (
        "## Checks",
        "## (a) Reward terms",
        "## (b) Cross-tool correlation",
        "## (c) Temporal credit",
        "## (d) Domain",
    ):
        assert section in text
    for png in ("rewards_distribution.png", "correlation.png", "credit_assignment.png", "domain_shift.png"):
        assert f"]({png})" in text
        data = (path.parent / png).read_bytes()
        assert data.startswith(PNG) and 2_000 < len(data) < 200_000
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["passed"] and all(c["passed"] for c in summary["checks"])
    credit = summary["credit"]
    assert credit["mean_length"] == 16
    assert credit["gae"][10] == pytest.approx((0.99 * 0.95) ** 10, abs=1e-9)
    assert credit["hier_tool"][15] == pytest.approx(0.99**15, abs=1e-9)  # a boundary at every step: Monte Carlo
    assert credit["hier_subtask"][15] == pytest.approx(0.99**15 * 0.95**2, abs=1e-9)
    assert summary["domain"]["oracle"]["heldout"]["success"] == 1.0


def test_env_without_long_horizon_skips_credit_assignment(tmp_path: Path) -> None:
    passed, path = check_rewards("AgentRL/SQL-v0", 2, ["oracle"], tmp_path, progress=False)
    text = path.read_text()
    assert passed and "Not applicable" in text and not (tmp_path / "credit_assignment.png").exists()
    assert "random success" not in text


def test_forced_failing_threshold_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["AgentRL/SMTP-v0", "--episodes", "2", "--out", str(tmp_path), "--min-return-gap", "50"])
    assert cmd_check_rewards(args) == 1
    out, err = capsys.readouterr()
    assert "FAIL  oracle - random mean return" in out and "FAILED" in err
    assert "**FAIL**" in (tmp_path / "report.md").read_text()
    assert "check-rewards" in err  # the progress bar


def test_passing_cli_run_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["AgentRL/SMTP-v0", "--episodes", "2", "--agents", "oracle", "--out", str(tmp_path), "--no-progress"])
    assert cmd_check_rewards(args) == 0
    out, err = capsys.readouterr()
    assert "passed: report at" in out and err == ""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"agents": "oracle,gpt5"}, "oracle, random"),
        ({"agents": ""}, "none given"),
        ({"agents": ", ,"}, "none given"),
        ({"agents": ["oracle", "\x00" * 1000]}, "oracle, random"),
        ({"episodes": 0}, "episodes"),
        ({"episodes": -3}, "episodes"),
        ({"episodes": True}, "episodes"),
        ({"env_id": "CartPole-v1"}, "available"),
        ({"seed": -1}, "seed"),
        ({"gamma": 1.5}, "gamma"),
        ({"lam": float("nan")}, "lam"),
        ({"error_profile": "no-such-profile"}, "no-such-profile"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str, tmp_path: Path) -> None:
    call: dict[str, object] = {"env_id": "AgentRL/SQL-v0", "episodes": 1, "out_dir": tmp_path, "progress": False}
    call.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        check_rewards(**call)  # type: ignore[arg-type]


def test_bad_thresholds_and_directories(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="spike_k"):
        Thresholds(spike_k=-1)
    with pytest.raises(ConfigError, match="min_credit"):
        Thresholds(min_credit=float("nan"))
    with pytest.raises(ConfigError, match="min_credit"):
        cmd_check_rewards(parse(["AgentRL/SQL-v0", "--min-credit", "-0.5", "--out", str(tmp_path)]))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="writable"):
        check_rewards("AgentRL/SQL-v0", 1, out_dir=tmp_path / "file" / "sub", progress=False)


def _ep(success: bool, steps: list[tuple[str, dict[str, float]]]) -> _Episode:
    return _Episode("x", "train", success, sum(sum(c.values()) for _, c in steps), steps)


def test_spikes_and_dominating_values_are_detected() -> None:
    ok = {"task": 0.0, "aux": 0.24, "fault": 0.0}
    runs = [_ep(True, [("sql", ok), ("finish", {"task": 1.0, "aux": 0.0, "fault": 0.0})]) for _ in range(20)]
    stats = _term_stats(runs, Thresholds())
    assert all(s["spikes"] == 0 and s["dominating"] == 0 for s in stats.values())
    runs.append(_ep(False, [("sql", {"task": 0.0, "aux": 50.0, "fault": -3.0})]))
    stats = _term_stats(runs, Thresholds())
    assert stats["aux"]["spikes"] == 1 and stats["aux"]["spike_values"] == [50.0]
    assert stats["fault"]["dominating"] == 1 and stats["aux"]["dominating"] == 1
    assert stats["task"]["dominating"] == 0  # the task reward is meant to be the big one


def test_correlation_drops_constant_columns_and_warns_about_misaligned_bonuses() -> None:
    runs = [_ep(i % 2 == 0, [("sql", {"aux": 0.0 if i % 2 == 0 else 0.3, "format": -0.1})]) for i in range(10)]
    corr = _correlation(runs)
    assert corr["labels"] == ["aux@sql", "success"] and "format@sql" in corr["constant"]
    assert corr["matrix"][0][1] == pytest.approx(-1.0)
    assert corr["warnings"] and "aux@sql" in corr["warnings"][0]
    assert _correlation([])["labels"] == []
