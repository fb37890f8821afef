"""The simulated code-execution service: exit codes, workspace, limits, output handling, hygiene."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from simulators.python import PythonResult, PythonRunner, RunLimits
from tests.procs import alive, with_marker


@pytest.fixture(scope="module")
def runner():
    r = PythonRunner(RunLimits(wall_s=5.0, cpu_s=5))
    yield r
    r.close()


def _run(runner: PythonRunner, code: str, workspace: Path, **limits: object) -> PythonResult:
    lim = RunLimits(**limits) if limits else None  # type: ignore[arg-type]
    return runner.run(code, str(workspace), lim)


def _wait_dead(pid: int, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# -- limits ----------------------------------------------------------------------------------------


def test_default_limits_and_the_least_meaningful_ones_are_accepted() -> None:
    assert RunLimits() == RunLimits(5.0, 5, 1 << 30, 16 << 20, 64, 64, 1 << 20)
    least = RunLimits(wall_s=1, cpu_s=1, memory_bytes=1, file_bytes=0, open_files=1, processes=1, output_bytes=1)
    assert least.wall_s == 1.0 and type(least.wall_s) is float and least.file_bytes == 0


BAD_LIMITS = [
    ("wall_s", 0.0),
    ("wall_s", -1.0),
    ("wall_s", float("nan")),
    ("wall_s", float("inf")),
    ("wall_s", True),
    ("wall_s", "5"),
    ("wall_s", None),
    ("cpu_s", 0),
    ("cpu_s", -5),
    ("cpu_s", 2.5),
    ("cpu_s", True),
    ("memory_bytes", 0),
    ("memory_bytes", 1 << 63),
    ("memory_bytes", float("inf")),
    ("file_bytes", -1),
    ("open_files", 0),
    ("open_files", "64"),
    ("processes", 0),
    ("processes", False),
    ("output_bytes", 0),
    ("output_bytes", None),
]


@pytest.mark.parametrize(("name", "value"), BAD_LIMITS, ids=[f"{n}={v!r}" for n, v in BAD_LIMITS])
def test_a_limit_no_run_can_have_is_refused_naming_the_field(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"RunLimits\.{name}=.*: use "):
        RunLimits(**{name: value})  # type: ignore[arg-type]


# -- basics ----------------------------------------------------------------------------------------


def test_stdout_and_zero_exit(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "print('hello', 6 * 7)", tmp_path)
    assert res.exit_code == 0
    assert res.stdout == "hello 42\n"
    assert res.stderr == ""
    assert res.timed_out is False and res.output_truncated is False
    assert res.elapsed_s > 0


def test_exit_codes(runner: PythonRunner, tmp_path: Path) -> None:
    assert _run(runner, "import sys; print('x'); sys.exit(3)", tmp_path).exit_code == 3
    res = _run(runner, "raise SystemExit('bye')", tmp_path)
    assert res.exit_code == 1 and res.stderr == "bye\n"
    res = _run(runner, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", tmp_path)
    assert res.exit_code == -signal.SIGTERM


def test_stderr_is_separate(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "import sys; print('out'); print('err', file=sys.stderr)", tmp_path)
    assert res.stdout == "out\n" and res.stderr == "err\n"


def test_unicode_output(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "print('Chloé 👋 τ')", tmp_path)
    assert res.stdout == "Chloé 👋 τ\n"


def test_cwd_is_the_workspace(runner: PythonRunner, tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "q1.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    code = (
        "import os, csv\n"
        "print(os.getcwd())\n"
        "print(list(csv.reader(open('results/q1.csv'))))\n"
        "open('out.txt', 'w').write('written')\n"
    )
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert os.path.realpath(lines[0]) == os.path.realpath(tmp_path)
    assert lines[1] == "[['a', 'b'], ['1', '2']]"
    assert (tmp_path / "out.txt").read_text() == "written"


def test_runs_are_independent(runner: PythonRunner, tmp_path: Path) -> None:
    assert _run(runner, "x = 41", tmp_path).exit_code == 0
    res = _run(runner, "print(x)", tmp_path)
    assert res.exit_code == 1 and "NameError" in res.stderr


def test_name_is_main_and_argv_is_hidden(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "import sys\nif __name__ == '__main__':\n    print(sys.argv)", tmp_path)
    assert res.stdout == "['<agent>']\n"


# -- limits ----------------------------------------------------------------------------------------


def test_timeout_kills_a_busy_loop(runner: PythonRunner, tmp_path: Path) -> None:
    start = time.perf_counter()
    res = _run(runner, "while True:\n    pass", tmp_path, wall_s=0.5)
    elapsed = time.perf_counter() - start
    assert res.timed_out is True
    assert res.exit_code == -signal.SIGKILL
    assert 0.5 <= elapsed < 60.0  # killed at the deadline, not left running (a hang detector, not a speed check)


@pytest.mark.parametrize(
    "code", ["while True:\n    pass", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"]
)
def test_running_out_of_cpu_time_is_a_timeout(runner: PythonRunner, tmp_path: Path, code: str) -> None:
    """SIGXCPU (or SIGKILL at the hard CPU limit) is the same outcome as the wall deadline."""
    res = _run(runner, code, tmp_path, wall_s=30.0, cpu_s=1)
    assert (res.exit_code, res.timed_out, res.stdout, res.stderr) == (-signal.SIGKILL, True, "", ""), res


def _none_left(marker: str, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not with_marker(marker):
            return True
        time.sleep(0.02)
    survivors = with_marker(marker)
    for pid in survivors:
        _kill_quietly(pid)
    return not survivors


def _sleeper(marker: str, **popen: str) -> str:
    extra = "".join(f", {k}={v}" for k, v in popen.items())
    return f"p = subprocess.Popen(['/bin/sleep', '{marker}']{extra})\n"


def test_timeout_kills_child_processes(runner: PythonRunner, tmp_path: Path) -> None:
    marker = f"61.{os.getpid()}1"
    code = "import subprocess, time\n" + _sleeper(marker) + "time.sleep(60)\n"
    res = _run(runner, code, tmp_path, wall_s=0.5)
    assert res.timed_out is True
    assert _none_left(marker), "a child survived the timeout"


def test_background_child_is_killed_when_the_program_exits(runner: PythonRunner, tmp_path: Path) -> None:
    marker = f"61.{os.getpid()}2"
    code = "import subprocess\n" + _sleeper(marker, stdout="subprocess.DEVNULL", stderr="subprocess.DEVNULL") + "print('bye')\n"
    res = _run(runner, code, tmp_path, wall_s=30.0)
    assert res.exit_code == 0 and res.timed_out is False
    assert _none_left(marker), "a background child survived the run"


def test_timeout_kills_a_child_in_a_new_session(runner: PythonRunner, tmp_path: Path) -> None:
    marker = f"61.{os.getpid()}3"
    code = "import subprocess, time\n" + _sleeper(marker, start_new_session="True") + "time.sleep(60)\n"
    res = _run(runner, code, tmp_path, wall_s=0.5)
    assert res.timed_out is True
    assert _none_left(marker), "a child in its own session survived the timeout"


def test_double_forked_daemon_dies_with_the_program(runner: PythonRunner, tmp_path: Path) -> None:
    if not runner.isolation:
        pytest.skip("no pid namespace here (unshare missing or not permitted): daemons are contained by issue #4's sandbox")
    marker = f"61.{os.getpid()}4"
    code = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    res = _run(runner, code, tmp_path, wall_s=30.0)
    assert res.exit_code == 0 and "parent done" in res.stdout
    assert _none_left(marker), "a double-forked daemon survived the run"


def test_output_cap_truncates_and_stops(runner: PythonRunner, tmp_path: Path) -> None:
    start = time.perf_counter()
    res = _run(runner, "while True:\n    print('x' * 1000)", tmp_path, output_bytes=100, wall_s=5.0)
    assert time.perf_counter() - start < 8.0
    assert res.output_truncated is True
    assert res.timed_out is False
    assert res.stdout == "x" * 100 + "\n[output truncated]"
    assert res.stderr == ""  # stderr did not reach the cap, so it carries no marker


def test_output_cap_on_stderr(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "import sys\nsys.stdout.write('ok')\nsys.stderr.write('e' * 5000)", tmp_path, output_bytes=64)
    assert res.output_truncated is True
    assert res.stderr == "e" * 64 + "\n[output truncated]"
    assert res.stdout in ("", "ok")


def test_output_below_cap_is_untouched(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "print('y' * 99, end='')", tmp_path, output_bytes=100)
    assert res.output_truncated is False
    assert res.stdout == "y" * 99


def test_memory_limit(runner: PythonRunner, tmp_path: Path) -> None:
    res = _run(runner, "x = bytearray(2 * 1024 ** 3)\nprint(len(x))", tmp_path, memory_bytes=256 << 20)
    assert res.exit_code != 0
    assert "MemoryError" in res.stderr or res.exit_code < 0
    assert res.stdout == ""


def test_file_size_limit(runner: PythonRunner, tmp_path: Path) -> None:
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'0' * 200000)\n"
    res = _run(runner, code, tmp_path, file_bytes=100_000)
    assert res.exit_code != 0
    assert os.path.getsize(tmp_path / "big.bin") <= 100_000


def test_input_gets_eof(runner: PythonRunner, tmp_path: Path) -> None:
    start = time.perf_counter()
    res = _run(runner, "print(input())", tmp_path, wall_s=30.0)
    assert time.perf_counter() - start < 6.0
    assert res.timed_out is False
    assert res.exit_code == 1
    assert "EOFError" in res.stderr
    res = _run(runner, "import sys; print(repr(sys.stdin.read()))", tmp_path)
    assert res.stdout == "''\n"


# -- output decoding and hygiene -------------------------------------------------------------------


def test_invalid_utf8_is_decoded_with_replacement(runner: PythonRunner, tmp_path: Path) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb\\n')\nsys.stderr.buffer.write(b'\\xc3(')"
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 0
    assert res.stdout == "a\ufffd\ufffdb\n"
    assert res.stderr == "\ufffd("


def test_tracebacks_name_the_agent_file(runner: PythonRunner, tmp_path: Path) -> None:
    code = "def f():\n    return 1 / 0\n\nf()\n"
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 1
    assert 'File "<agent>", line 4, in <module>' in res.stderr
    assert 'File "<agent>", line 2, in f' in res.stderr
    assert res.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "agentrl-py-" not in res.stderr
    assert ".py" not in res.stderr
    assert "exec(compile" not in res.stderr  # the bootstrap frame is hidden


@pytest.mark.parametrize(
    "code, error",
    [
        ("def f(:\n    pass\n", "SyntaxError"),
        ("import no_such_module_xyz\n", "ModuleNotFoundError"),
        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
        ("def r():\n    return r()\nr()\n", "RecursionError"),
    ],
)
def test_error_output_has_no_host_path_of_the_scratch_file(runner: PythonRunner, tmp_path: Path, code: str, error: str) -> None:
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 1
    assert error in res.stderr
    assert '"<agent>"' in res.stderr
    assert tempfile.gettempdir() + "/" not in res.stderr
    assert "agentrl-py-" not in res.stderr


def test_scratch_file_is_removed_after_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between runs a runner holds no files: one that is never closed leaves nothing behind."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    runner = PythonRunner(RunLimits(wall_s=5.0, cpu_s=5))
    assert list(scratch.iterdir()) == []
    seen = _run(runner, "import sys; print(sys.argv)", tmp_path)  # the program is a file only while it runs
    assert seen.stdout == "['<agent>']\n"
    _run(runner, "raise SystemExit(3)", tmp_path)
    assert list(scratch.iterdir()) == []


def test_environment_is_scrubbed(runner: PythonRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "s3cr3t-value")
    code = "import os, json\nprint(json.dumps(dict(os.environ)))"
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 0
    assert "AGENTRL_TEST_SECRET" not in res.stdout
    assert "s3cr3t-value" not in res.stdout
    import json

    env = json.loads(res.stdout)
    assert os.path.realpath(env["HOME"]) == os.path.realpath(tmp_path)
    assert env["PATH"] == "/usr/bin:/bin"
    assert not any(k.startswith(("PYTEST", "VIRTUAL_ENV")) for k in env)


def test_isolated_mode_ignores_python_env_vars(runner: PythonRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('hijacked')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "sitecustomize.py"))
    res = _run(runner, "print('clean')", tmp_path)
    assert res.stdout == "clean\n"


def test_close_is_harmless_and_the_runner_still_works(tmp_path: Path) -> None:
    r = PythonRunner()
    assert _run(r, "print(1)", tmp_path).stdout == "1\n"
    r.close()
    r.close()
    assert _run(r, "print(2)", tmp_path).stdout == "2\n"
