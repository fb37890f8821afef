"""benchmarks/leaderboard.py: miniatures (the no-model entries; two algorithm rows at the smallest budget) and their outputs."""

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
    [
        (("--entries", "random,nope"), "unknown ['nope']"),
        (("--entries", ","), "empty list"),
        (("--episodes", "0"), "positive"),
        (("--entries", "algo-nope"), "unknown ['algo-nope']"),
        (("--entries", "algo-grpo", "--algo-budget", "0"), "--algo-budget 0: use a positive number"),
        (("--entries", "algo-grpo", "--algo-budget", "-128"), "--algo-budget -128: use a positive number"),
        (("--entries", "algo-grpo", "--algo-seeds", ""), "--algo-seeds '': use distinct"),
        (("--entries", "algo-grpo", "--algo-seeds", "0,0"), "--algo-seeds '0,0': use distinct"),
        (("--entries", "algo-grpo", "--algo-seeds", "a"), "--algo-seeds 'a': use comma-separated integers"),
        (("--entries", "algo-grpo", "--env", "AgentRL/SQL-v0"), "the algorithm rows train on AgentRL/SQLPythonSMTP-v0"),
    ],
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


def _body(text: str) -> list[list[str]]:
    """The rows of the Markdown tables in ``text``, headers left out."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    return [r for r in rows if r[0] not in ("entry", "algorithm")]


SPREAD = re.compile(r"^(\d\.\d\d) \((\d\.\d\d)-(\d\.\d\d)\)$")  # mean (min-max)


@pytest.mark.slow
@pytest.mark.timeout(900)  # one tiny-model run of one update, evaluated on 6 cells x 1 episode
def test_algorithm_rows_miniature_train_evaluate_and_resume(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    md, png, runs = tmp_path / "lb.md", tmp_path / "lb.png", tmp_path / "runs"
    opts = ["--entries", "algo-ppo-gae", "--algo-seeds", "3", "--algo-budget", "1", "--episodes", "1"]
    proc = _run(*opts, "--runs", str(runs), "--md", str(md), "--png", str(png))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    body = _body(md.read_text())
    (row,) = body  # one algorithm: no difference table (test_algorithm_rows_mark_differences... checks it)
    assert row[:2] == ["PPO (gae), 1 seed", "candidates easy"]
    assert len(row) == 8 and all(SPREAD.match(v) and SPREAD.match(v).group(2) == v[:4] for v in row[2:]), row
    text = md.read_text()
    assert "every run trained to 1 env steps" in text and "once per seed 3;" in text
    assert "--entries algo-ppo-gae --episodes=1 --algo-budget=1 --algo-seeds=3`" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    folder = runs / "algorithms" / "budget1" / "ppo-gae-seed3"
    assert (folder / "leaderboard-result.json").exists() and (folder / "leaderboard-eval.json").exists()

    # again: the runs and their evaluations are reused, nothing trains, the table is the same
    again = tmp_path / "again.md"
    proc = _run(*opts, "--runs", str(runs), "--md", str(again), "--png", "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("bench_algorithms: reusing") == 1, proc.stdout
    assert _body(again.read_text()) == body


def test_algorithm_rows_mark_differences_larger_than_the_seed_spread() -> None:
    leaderboard = _module()
    keys = [f"{s}/{p}" for s, p in leaderboard.CELLS]

    def rows(*per_cell: list[float]) -> dict:  # type: ignore[type-arg]
        cells = {k: {"success_rate": sum(v) / len(v), "mean_return": 0.0, "per_seed": v} for k, v in zip(keys, per_cell)}
        return {"candidates easy": cells}

    ref = [[0.25, 0.5, 0.75]] * 6
    results = {
        "random": {"candidates easy": {k: {"success_rate": 0.25, "mean_return": 0.0} for k in keys}},
        "algo-ppo-hierarchical": rows(*ref),
        # ranges apart on the first cell (larger than the spread), touching on the second, overlapping elsewhere
        "algo-grpo": rows([0.8, 0.9, 1.0], [0.75, 0.9, 1.0], *[[0.0, 0.5, 1.0]] * 4),
    }
    text = leaderboard.markdown(results, leaderboard.Budget(), "python benchmarks/leaderboard.py", {"random": 1.0})
    body = _body(text)
    assert body[0] == ["random", "candidates easy"] + ["0.25"] * 6
    assert body[1] == ["PPO (hierarchical), 3 seeds", "candidates easy"] + ["0.50 (0.25-0.75)"] * 6
    assert body[2][2:4] == ["0.90 (0.80-1.00)", "0.88 (0.75-1.00)"]
    assert "Difference of the mean to PPO (hierarchical), 3 seeds;" in text
    assert body[3] == ["GRPO, 3 seeds", "**+0.40**", "+0.38", "+0.00", "+0.00", "+0.00", "+0.00"]
    assert "each cell is the mean (min-max) over the seeds" in text and "once per seed 0, 1, 2" in text


@pytest.mark.parametrize(
    "args, message", [(("--algos", "nope"), "--algos 'nope'"), (("--budget", "0"), "--budget and --episodes: use values >= 1")]
)
def test_bench_algorithms_bad_options_are_clear_errors(args: tuple[str, ...], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_algorithms
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    with pytest.raises(SystemExit):
        bench_algorithms.main([*args, "--md", "", "--png", ""])
    assert message in capsys.readouterr().err
