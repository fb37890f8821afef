"""The agentrl-envs command: list, play, eval, and bad input."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_envs.cli.main import _parser, main
from agentrl_envs.cli.play import _shorthand, cmd_play
from agentrl_envs.core.actions import format_call


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["list"], capsys)
    assert code == 0
    for env_id in ("AgentRL/SQL-v0", "AgentRL/Python-v0", "AgentRL/SMTP-v0", "AgentRL/SQLPythonSMTP-v1"):
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


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["eval", "AgentRL/SQL-v0", "--episods", "3"], "unrecognized arguments: --episods 3; did you mean --episodes?"),
        (["play", "AgentRL/SQL-v0", "--sed=3"], "unrecognized arguments: --sed=3; did you mean --seed?"),
        (
            ["eval", "AgentRL/SQL-v0", "--agnet", "oracle", "--no-progres", "--jsn"],
            "unrecognized arguments: --agnet oracle --jsn; did you mean --agent (for --agnet), --json (for --jsn)?",
        ),
    ],
)
def test_a_misspelt_flag_names_the_closest_one(argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse said "unrecognized arguments: --episods 3" and nothing more (YAML keys got "did you mean")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"agentrl-envs {argv[0]}: error: {hint}" in err, err


@pytest.mark.parametrize(
    "extra",
    [["garbage"], ["--zzzzzzzz"], ["--"], ["--", "\x00\x1b[31m"], ["--episodes-" + "x" * 1_000_000], ["x" * 1_000_000] * 20],
)
def test_unknown_arguments_without_a_near_flag_exit_2_with_a_short_message(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["list", *extra])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "agentrl-envs list: error: unrecognized arguments:" in err, err
    assert "did you mean" not in err and len(err) < 1000


def play(lines: list[str], *extra: str) -> str:
    args = _parser().parse_args(["play", "AgentRL/SQLPythonSMTP-v1", "--seed", "3", *extra])
    out = io.StringIO()
    assert cmd_play(args, stdin=io.StringIO("".join(line + "\n" for line in lines)), stdout=out) == 0
    return out.getvalue()


def test_play_by_picking_candidates() -> None:
    import gymnasium as gym

    env = gym.make("AgentRL/SQLPythonSMTP-v1", candidates=3)
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


def play_env(env_id: str, lines: list[str]) -> str:
    args = _parser().parse_args(["play", env_id, "--seed", "3"])
    out = io.StringIO()
    assert cmd_play(args, stdin=io.StringIO("".join(line + "\n" for line in lines)), stdout=out) == 0
    return out.getvalue()


def test_play_help_lists_the_envs_own_tools_only() -> None:
    text = play_env("AgentRL/SQL-v0", [":help"])
    assert text.count("sql SELECT") == 2 and text.count("finish 42") == 2  # at the start and on :help
    assert "python print(1)" not in text and "smtp {" not in text and "http GET" not in text
    text = play_env("AgentRL/Workplace-v1", [])
    for shorthand in ("sql SELECT", "python print(1)", "smtp {", "http GET", "finish 42"):
        assert shorthand in text


def test_play_http_shorthand() -> None:
    assert _shorthand("http GET /v1/tickets?limit=2&status=open", None) == format_call(
        "http", {"method": "GET", "path": "/v1/tickets", "query": {"limit": 2, "status": "open"}}
    )
    assert _shorthand('http patch /v1/tickets/7 {"status": "closed"}', None) == format_call(
        "http", {"method": "PATCH", "path": "/v1/tickets/7", "body": {"status": "closed"}}
    )
    for line in (
        "http",
        "http GET",
        "http GET v1/no-slash",
        "http POST /v1/x [1]",
        "http POST /v1/x {bad",
        "http POST /v1/x " + "[" * 5000,
    ):
        assert _shorthand(line, None) == line  # not that shape: the env gets it as typed and explains
    text = play_env("AgentRL/HTTP-v0", ["http GET /openapi.json", "http POST /v1/x {bad", "http GET /v1/tickets?limit=1"])
    assert text.count("http ok [HTTP 200]") == 2
    assert text.count("action error") == 1


def test_play_end_of_input() -> None:
    assert "end of input" in play([])


def test_play_empty_lines_ask_again_without_costing_a_step() -> None:
    # an empty line went to the env as an action: a format penalty and one step of the budget gone
    lines = "\n   \n\t\n" + " " * 1_000_000 + "\nfinish 42\n"
    out = subprocess.run(
        [sys.executable, "-m", "agentrl_envs", "play", "AgentRL/SQL-v0", "--seed", "3"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "[step 1 |" in out.stdout and "[step 2 |" not in out.stdout and "action error" not in out.stdout
    assert out.stdout.count("\n> ") == 5  # asked again after each of the four empty lines


def test_play_at_a_terminal_reads_with_input_and_line_editing(monkeypatch: pytest.MonkeyPatch) -> None:
    # sys.stdin.readline() has no line editing: arrow keys typed escape codes into the action
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    typed = iter(["", "finish 42"])
    prompts: list[str] = []

    def fake_input(prompt: str = "") -> str:
        prompts.append(prompt)
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdin", terminal)
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr("builtins.input", fake_input)
    assert cmd_play(_parser().parse_args(["play", "AgentRL/SQL-v0", "--seed", "3"])) == 0
    assert prompts == ["> ", "> "] and "[step 1 |" in terminal.getvalue()
    assert "readline" in sys.modules or sys.platform == "win32"


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "agentrl_envs", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "AgentRL/SQL-v0" in out.stdout


def _options(parser: argparse.ArgumentParser, path: str = "agentrl-envs") -> list[tuple[str, argparse.Action]]:
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{path} {name}")
        else:
            found.append((path, action))
    return found


def test_every_option_has_help_text() -> None:
    options = _options(_parser())
    commands = {path for path, _ in options}
    assert {"agentrl-envs play", "agentrl-envs eval", "agentrl-envs serve", "agentrl-envs pg-sweep"} <= commands
    assert len(options) > 40
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in options
        if not a.help or a.help == argparse.SUPPRESS or not a.help.strip()
    ]
    assert missing == []


@pytest.mark.parametrize("command", ["play", "eval"])
def test_play_and_eval_take_an_error_profile(command: str) -> None:
    args = _parser().parse_args([command, "AgentRL/SQL-v0", "--error-profile", "flaky"])
    assert args.error_profile == "flaky"
    assert _parser().parse_args([command, "AgentRL/SQL-v0"]).error_profile == "none"


def test_eval_with_an_error_profile_pays_fault_penalties(capsys: pytest.CaptureFixture[str]) -> None:
    def mean_return(*extra: str) -> float:
        code, out, _ = run(
            ["eval", "AgentRL/SQLPythonSMTP-v1", "--episodes", "8", "--split", "train", "--json", "--no-progress", *extra], capsys
        )
        assert code == 0
        rows = json.loads(out)
        total = next(r for r in rows if r["split"] == "all")
        assert total["success_rate"] == 1.0
        return float(total["mean_return"])

    assert mean_return("--error-profile", "flaky") < mean_return()


def test_play_with_an_error_profile_shows_faults() -> None:
    # The oracle's actions replayed by hand; with 'flaky' some of them meet injected faults.
    import gymnasium as gym

    env = gym.make("AgentRL/SQLPythonSMTP-v1", error_profile="flaky", max_steps=40)
    env.reset(seed=3)
    actions, faults, done = [], 0, False
    while not done:
        actions.append(env.unwrapped.oracle_action())
        _, _, term, trunc, info = env.step(actions[-1])
        faults += bool(info["fault"])
        done = term or trunc
    env.close()
    text = play(actions, "--error-profile", "flaky", "--max-steps", "40")
    assert text.count("[fault: ") == faults
    assert "== SOLVED" in text


@pytest.mark.parametrize("profile", ["no-such-profile", "/nonexistent/profile.yaml", "\x00"])
def test_bad_error_profile_exits_2(profile: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["eval", "AgentRL/SQL-v0", "--episodes", "1", "--error-profile", profile, "--no-progress"], capsys)
    assert code == 2
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "postgresql://x:y@127.0.0.1:1/db",
        "postgresql://x@[::1/db",
        "host=127.0.0.1 port=notaport",
        "",
        "  ",
        "x" * 100_000,
    ],
    ids=["words", "unreachable", "bracket", "bad-port", "empty", "blank", "huge"],
)
def test_pg_sweep_bad_or_unreachable_urls_exit_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["pg-sweep", url, "--dry-run"], capsys)
    assert code == 2
    assert "error:" in err and "Traceback" not in err and len(err) < 2000, err[:300]
    if not url.strip():
        assert "the URL is empty" in err


def test_python_found_through_a_relative_path_entry(tmp_path: Path) -> None:
    """``PATH=.venv/bin:...`` makes sys.executable relative; the sandbox still starts and runs code."""
    venv_bin = Path(sys.executable).parent
    cwd = venv_bin.parent.parent
    relative = os.path.relpath(venv_bin, cwd)
    assert not os.path.isabs(relative)
    env = dict(os.environ, PATH=f"{relative}{os.pathsep}{os.environ.get('PATH', '')}")
    # cwd is the venv's project, maybe another checkout (a shared venv): import this checkout's code first
    program = (
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "import gymnasium as gym, agentrl_envs\n"
        "from agentrl_envs.core.actions import format_call\n"
        "assert not sys.executable.startswith('/'), sys.executable\n"
        "env = gym.make('AgentRL/Python-v0')\n"
        "env.reset(seed=0)\n"
        "print(env.step(format_call('python', {'code': 'print(6 * 7)'}))[0])\n"
        "env.close()\n"
    )
    out = subprocess.run(
        [Path(sys.executable).name, "-c", program], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("python ok") and "42" in out.stdout, out.stdout


# -- output files: checked before the work, written whole -----------------------------------------


def _fit_log(tmp_path: Path) -> Path:
    log = tmp_path / "calls.jsonl"
    log.write_text(
        "".join(json.dumps({"ts": i, "endpoint": "/v1/sql", "status": 200, "latency_ms": 5 + i}) + "\n" for i in range(20))
    )
    return log


def _unwritable_outputs(tmp_path: Path) -> list[tuple[str, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (str(tmp_path), "is a directory"),
        (str(tmp_path / "missing" / "out.x"), "does not exist"),
        (str(a_file / "out.x"), "does not exist"),
        (str(tmp_path / ("n" * 300 + ".x")), "cannot be written"),
        ("", "give a file name"),
    ]
    if Path("/proc/self").is_dir():  # a folder no one can create files in (root included)
        cases.append(("/proc/self/out.x", "cannot be written"))
    return cases


def _listing(tmp_path: Path) -> set[str]:
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}


def test_fit_profile_refuses_an_output_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _fit_log(tmp_path)
    for output, message in _unwritable_outputs(tmp_path):
        before = _listing(tmp_path)
        code, out, err = run(["fit-profile", str(log), "-o", output], capsys)
        assert code == 2, (output, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert _listing(tmp_path) == before  # nothing half-written, no temporary file left


def test_export_sft_refuses_an_output_it_cannot_write_before_playing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentrl_envs.integrations.chat

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("export_sft ran although its output cannot be written")

    monkeypatch.setattr(agentrl_envs.integrations.chat, "export_sft", never)
    for output, message in _unwritable_outputs(tmp_path):
        before = _listing(tmp_path)
        code, out, err = run(["export-sft", "AgentRL/SQL-v0", "--episodes", "1", "-o", output], capsys)
        assert code == 2, (output, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert _listing(tmp_path) == before


def test_export_sft_refuses_to_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sft.parquet"
    out.write_bytes(b"mine, not yours")
    code, _, err = run(["export-sft", "AgentRL/SQL-v0", "--episodes", "1", "-o", str(out)], capsys)
    assert code == 2 and "--force" in err
    assert out.read_bytes() == b"mine, not yours"
    code, printed, err = run(["export-sft", "AgentRL/SQL-v0", "--episodes", "1", "-o", str(out), "--force"], capsys)
    assert code == 0, err
    assert "wrote 1 episodes" in printed and out.read_bytes()[:4] == b"PAR1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.parquet"]  # no temporary file left


def test_a_failed_export_sft_write_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    def disk_full(table: object, where: str) -> None:
        Path(where).write_bytes(b"PAR1 half")
        raise OSError(28, "No space left on device")

    out = tmp_path / "sft.parquet"
    out.write_bytes(b"the old export")
    monkeypatch.setattr(pq, "write_table", disk_full)
    code, _, err = run(["export-sft", "AgentRL/SQL-v0", "--episodes", "1", "-o", str(out), "--force"], capsys)
    assert code == 2 and "No space left on device" in err and "Traceback" not in err
    assert out.read_bytes() == b"the old export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.parquet"]


# -- serve: limits refused at parse time, naming the option -------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--port", "99999"),
        ("--port", "65536"),
        ("--port", "-1"),
        ("--port", "http"),
        ("--max-upload-mb", "0"),
        ("--max-upload-mb", "-5"),
        ("--max-upload-mb", "nan"),
        ("--max-upload-mb", "1.5"),
        ("--max-upload-mb", "1048577"),
        ("--max-upload-mb", "9" * 40),
        ("--python-workers", "4097"),
        ("--per-client", "100000"),
        ("--workers", "65"),
        ("--workers", "0"),
    ],
)
def test_serve_refuses_out_of_range_options_at_parse_time(
    flag: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("serve was reached")

    monkeypatch.setattr("agentrl_envs.server.processes.serve", never)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "0", flag, value] if flag != "--port" else ["serve", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "ServeLimits" not in err and "Traceback" not in err, err


def test_serve_parses_the_largest_limits_it_accepts() -> None:
    args = _parser().parse_args(
        [
            "serve",
            "--port",
            "65535",
            "--max-upload-mb",
            "1048576",
            "--python-workers",
            "4096",
            "--per-client",
            "4096",
            "--workers",
            "64",
        ]
    )
    from agentrl_envs.server.simulator import ServeLimits

    limits = ServeLimits(
        python_workers=args.python_workers, per_client=args.per_client, max_upload_bytes=args.max_upload_mb << 20
    )
    assert limits.max_upload_bytes == 1 << 40 and args.workers == 64


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "AgentRL/SQL-v0", "--seed", "-5"],
        ["eval", "AgentRL/SQL-v0", "--seed", str(2**63)],
        ["play", "AgentRL/SQL-v0", "--seed", "-1"],
        ["export-sft", "AgentRL/SQL-v0", "--seed", "9" * 30, "-o", "x.parquet"],
        ["eval", "AgentRL/SQL-v0", "--candidates", "99999999"],
        ["play", "AgentRL/SQL-v0", "--candidates", "-1"],
    ],
)
def test_seeds_and_candidates_out_of_range_are_refused_at_parse_time(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[2]}:" in err and "Traceback" not in err, err


def test_export_sft_refuses_seeds_past_int64_before_playing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sft.parquet"
    code, _, err = run(["export-sft", "AgentRL/SQL-v0", "--seed", str(2**63 - 2), "--episodes", "3", "-o", str(out)], capsys)
    assert code == 2 and "--seed" in err and "2**63-1" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["make-rm-data", "AgentRL/SQL-v0", "--episodes", "1", "-o", ""],
        ["check-rewards", "AgentRL/SQL-v0", "--episodes", "1", "--out", " ", "--no-progress"],
    ],
)
def test_an_empty_output_directory_is_refused_not_taken_for_here(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(argv, capsys)
    assert code == 2 and "output directory is empty" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("host", ["", "a b", "h" * 5000, "local\nhost", "\x1b[31m"])
def test_serve_refuses_a_host_that_is_no_address_at_parse_time(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--host", host, "--token", "s3cret-token-for-tests-0123456789"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --host:" in err and len(err) < 2000, err[:300]
