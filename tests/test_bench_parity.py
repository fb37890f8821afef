"""benchmarks/bench_parity.py in its smallest mode: one id, one seed, the gym.make baseline and TRL's class."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_parity.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_the_smallest_run_writes_one_row_per_path_with_gym_make_rewards(tmp_path: Path) -> None:
    md = tmp_path / "parity.md"
    proc = _run("--seeds", "1", "--env-ids", "AgentRL/SQL-v0", "--paths", "TRL", "--md", str(md))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in md.read_text().splitlines() if line.startswith("|")]
    assert proc.stdout.startswith(lines[0])  # the table printed is the table written
    header, rule, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert len(header) == 9 and header[3].startswith("oracle success") and header[4].startswith("rewards = gym.make")
    assert set(rule) == {"---"} and len(rule) == 9
    assert [row[0] for row in rows] == ["gym.make", "TRL"] and all(len(row) == 9 for row in rows)
    for row in rows:
        episodes, success, same = row[2], row[3], row[4]
        assert episodes == "2"  # 1 id x 1 seed x faults off and flaky
        assert success == same == "1/1 / 1/1"
        assert float(row[5].replace(",", "")) > 0 and float(row[6].replace(",", "")) > 0
    assert rows[0][7:] == ["1.00", "1.00"]  # the baseline against itself


def test_bad_arguments_are_clear_errors() -> None:
    for args, message in (
        (("--seeds", "0"), "use 1 or more"),
        (("--env-ids", "AgentRL/Nope-v0"), "unknown env ids"),
        (("--paths", "Ray"), "invalid choice"),
    ):
        proc = _run(*args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
