"""benchmarks/leaderboard.py: a miniature (the no-model entries, a few episodes) and its outputs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "leaderboard.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=840)


@pytest.mark.timeout(900)  # 24 cells of env episodes in a subprocess: a few seconds idle, minutes on a loaded machine
def test_miniature_leaderboard_table_shape_and_order(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    md, png, js = tmp_path / "lb.md", tmp_path / "lb.png", tmp_path / "lb.json"
    proc = _run(
        "--entries",
        "random,overlap,oracle",
        "--env",
        "AgentRL/SQL-v0",
        "--episodes",
        "4",
        "--md",
        str(md),
        "--png",
        str(png),
        "--json",
        str(js),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = md.read_text().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["entry", "view"] + [f"{s} / {p}" for s in ("train", "test", "heldout") for p in ("none", "realistic")]
    body = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:] if line.startswith("| ")]
    assert [(r[0], r[1]) for r in body] == [
        ("random", "candidates easy"),
        ("random", "candidates hard"),
        ("overlap", "candidates easy"),
        ("overlap", "candidates hard"),
        ("oracle", "gold plan"),
    ]
    assert all(len(r) == 8 and all(0.0 <= float(v) <= 1.0 for v in r[2:]) for r in body)
    assert (
        "Command: `python benchmarks/leaderboard.py --entries random,overlap,oracle --env=AgentRL/SQL-v0 --episodes=4`."
        in md.read_text()
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads(js.read_text())["results"]
    cells = results["oracle"]["gold plan"]
    for view in ("candidates easy", "candidates hard"):
        for key, oracle in cells.items():
            assert oracle["success_rate"] > results["random"][view][key]["success_rate"], (view, key)


def _module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import leaderboard
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return leaderboard


def test_same_seeds_as_agentrl_train_eval() -> None:
    leaderboard = _module()
    episodes = pytest.importorskip("agentrl_train.episodes")
    evaluate = pytest.importorskip("agentrl_train.evaluate")
    assert leaderboard.EVAL_SEED == evaluate.EVAL_SEED
    assert leaderboard.eval_seeds(5) == [episodes.episode_seed(evaluate.EVAL_SEED, j, 0) for j in range(5)]


@pytest.mark.parametrize(
    "args, message",
    [(("--entries", "random,nope"), "unknown ['nope']"), (("--entries", ","), "empty list"), (("--episodes", "0"), "positive")],
)
def test_bad_options_are_clear_errors(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    from agentrl_envs.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        _module().main([*args, "--md", str(tmp_path / "x.md"), "--png", ""])
    assert not (tmp_path / "x.md").exists()


def test_a_damaged_run_folder_is_skipped_with_a_warning(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("agentrl_train.config_io")
    from agentrl_envs.errors import ConfigError

    leaderboard = _module()
    monkeypatch.setattr(leaderboard, "_agentrl", lambda args: pytest.fail(f"trained again over a damaged run: {args}"))
    runs = tmp_path / "runs"
    folder = runs / "agentrl-candidates-easy"
    (folder / "final").mkdir(parents=True)
    b = leaderboard.Budget(env="AgentRL/SQL-v0", episodes=1)
    leaderboard._stamp(
        folder, {"env": b.env, "candidates": b.candidates, "updates": b.ppo_updates, "seed": b.seed, "difficulty": "easy"}
    )
    (folder / "config.yaml").write_text("{{{ not yaml")
    (runs / "results").mkdir()
    (runs / "results" / "random.json").write_text('{"budget": ')  # a damaged results cache is evaluated again
    md = tmp_path / "lb.md"
    opts = ["--env", "AgentRL/SQL-v0", "--episodes", "1", "--runs", str(runs), "--md", str(md), "--png", ""]
    assert leaderboard.main(["--entries", "random,agentrl-candidates", "--reuse-results", *opts]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any("random.json is damaged" in line and "evaluating again" in line for line in err), err
    (skip,) = [line for line in err if "skipping" in line]
    assert skip.startswith("leaderboard: warning: skipping agentrl-candidates: ") and "config.yaml is damaged" in skip
    assert "| random | candidates easy |" in md.read_text() and "| agentrl-candidates |" not in md.read_text()
    # a damaged budget stamp is skipped too (training again would overwrite the run), and nothing left is an error
    (folder / "leaderboard-budget.json").write_text("{not json")
    with pytest.raises(ConfigError, match="every entry was skipped"):
        leaderboard.main(["--entries", "agentrl-candidates", *opts])
    assert "leaderboard-budget.json is damaged" in capsys.readouterr().err
