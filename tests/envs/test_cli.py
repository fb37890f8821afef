"""The agentrl-envs command: list, play, eval, and bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from agentrl_envs.cli import _parser, cmd_play, main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["list"], capsys)
    assert code == 0
    for env_id in ("AgentRL/SQL-v0", "AgentRL/Python-v0", "AgentRL/SMTP-v0", "AgentRL/SQLPythonSMTP-v0"):
        assert env_id in out


def test_eval_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["eval", "AgentRL/SQL-v0", "--agent", "oracle", "--episodes", "3"], capsys)
    assert code == 0
    assert "success" in out and "heldout" in out and "logistics" in out
    assert "100.0%" in out.splitlines()[-1]
    assert "ep" in err  # progress bar on stderr


def test_eval_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["eval", "AgentRL/SMTP-v0", "--agent", "random", "--episodes", "4", "--split", "test", "--json", "--no-progress"], capsys
    )
    assert code == 0
    rows = json.loads(out)
    total = next(r for r in rows if r["split"] == "all")
    assert total["episodes"] == 4 and total["success_rate"] < 0.5


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "Nope-v0"],
        ["eval", "AgentRL/SQL-v0", "--split", "validation"],
        ["eval", "AgentRL/SQL-v0", "--split", ","],
        ["eval", "AgentRL/SQL-v0", "--domain", "space"],
        ["eval", "AgentRL/SQL-v0", "--long-horizon"],
        ["play", "\x00\x1b[31m" + "x" * 10000],
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv", [["eval", "AgentRL/SQL-v0", "--episodes", "0"], ["eval", "AgentRL/SQL-v0", "--episodes", "ten"], ["frobnicate"], []]
)
def test_argparse_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def play(lines: list[str], *extra: str) -> str:
    args = _parser().parse_args(["play", "AgentRL/SQLPythonSMTP-v0", "--seed", "3", *extra])
    out = io.StringIO()
    assert cmd_play(args, stdin=io.StringIO("".join(line + "\n" for line in lines)), stdout=out) == 0
    return out.getvalue()


def test_play_by_picking_candidates() -> None:
    import gymnasium as gym

    env = gym.make("AgentRL/SQLPythonSMTP-v0", candidates=3)
    _, info = env.reset(seed=3)
    picks = []
    done = False
    while not done:
        oracle = env.unwrapped.oracle_action()
        picks.append(str(info["candidates"].index(oracle) + 1))
        _, _, term, trunc, info = env.step(oracle)
        done = term or trunc
    env.close()
    text = play(picks, "--candidates", "3")
    assert "== SOLVED" in text


def test_play_shorthand_and_garbage() -> None:
    garbage = [
        "",
        "   ",
        "\x00\x01",
        "\x1b[2J",
        "{" * 5000,
        "🙂" * 1000,
        "sql",
        "python",
        "smtp {not json",
        "99",
        ":help",
        ":render",
    ]
    text = play([*garbage, "finish 42"])
    assert text.count("action error") >= 7
    assert "NOT SOLVED" in text


def test_play_end_of_input() -> None:
    assert "end of input" in play([])


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "agentrl_envs.cli", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "AgentRL/SQL-v0" in out.stdout
