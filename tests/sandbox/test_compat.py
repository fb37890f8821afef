"""SandboxRunner keeps PythonRunner's contract: exit codes, output, workspace, limits, hygiene."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from simulators.python import PythonResult, RunLimits
from simulators.python.sandbox import SandboxRunner

from .conftest import SUITE_LIMITS, assert_no_leftovers


def _run(runner: SandboxRunner, code: str, workspace: Path, **limits: object) -> PythonResult:
    lim = RunLimits(**{**SUITE_LIMITS.__dict__, **limits}) if limits else None
    return runner.run(code, str(workspace), lim)


def test_stdout_and_zero_exit(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "print('hello', 6 * 7)", tmp_path)
    assert (res.exit_code, res.stdout, res.stderr) == (0, "hello 42\n", "")
    assert res.timed_out is False and res.output_truncated is False
    assert res.elapsed_s > 0


def test_exit_codes(runner: SandboxRunner, tmp_path: Path) -> None:
    assert _run(runner, "import sys; print('x'); sys.exit(3)", tmp_path).exit_code == 3
    res = _run(runner, "raise SystemExit('bye')", tmp_path)
    assert res.exit_code == 1 and res.stderr == "bye\n"
    assert _run(runner, "import sys; sys.exit(2**100)", tmp_path).exit_code == 255
    assert _run(runner, "import sys; sys.exit(None)", tmp_path).exit_code == 0
    res = _run(runner, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", tmp_path)
    assert res.exit_code == -signal.SIGTERM


def test_stderr_is_separate_and_unicode_survives(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "import sys; print('Chloé 👋 τ'); print('err', file=sys.stderr)", tmp_path)
    assert res.stdout == "Chloé 👋 τ\n" and res.stderr == "err\n"


def test_cwd_home_and_tmpdir_are_the_workspace(runner: SandboxRunner, tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "q1.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    code = (
        "import os, csv, tempfile\n"
        "print(os.getcwd())\n"
        "print(list(csv.reader(open('results/q1.csv'))))\n"
        "print(os.environ['HOME'] == os.getcwd() == tempfile.gettempdir())\n"
        "open('out.txt', 'w').write('written')\n"
        "open(os.path.join(os.getcwd(), 'abs.txt'), 'w').write('absolute')\n"
    )
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert os.path.realpath(lines[0]) == os.path.realpath(tmp_path)
    assert lines[1:] == ["[['a', 'b'], ['1', '2']]", "True"]
    assert (tmp_path / "out.txt").read_text() == "written"
    assert (tmp_path / "abs.txt").read_text() == "absolute"


def test_runs_are_independent(runner: SandboxRunner, tmp_path: Path) -> None:
    assert _run(runner, "import json\nx = 41\njson.dumps = None", tmp_path).exit_code == 0
    res = _run(runner, "print(x)", tmp_path)
    assert res.exit_code == 1 and "NameError" in res.stderr
    assert _run(runner, "import json; print(json.dumps([1]))", tmp_path).stdout == "[1]\n"


def test_name_is_main_and_argv_is_hidden(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "import sys\nif __name__ == '__main__':\n    print(sys.argv)", tmp_path)
    assert res.stdout == "['<agent>']\n"


def test_tracebacks_name_the_agent_file(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "def f():\n    return 1 / 0\n\nf()\n", tmp_path)
    assert res.exit_code == 1
    assert 'File "<agent>", line 4, in <module>' in res.stderr
    assert 'File "<agent>", line 2, in f' in res.stderr
    assert res.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "sandbox" not in res.stderr and ".py" not in res.stderr


@pytest.mark.parametrize(
    "code, error",
    [
        ("def f(:\n    pass\n", "SyntaxError"),
        ("import no_such_module_xyz\n", "ModuleNotFoundError"),
        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
        ("print('\\ud800')\n", "UnicodeEncodeError"),
    ],
)
def test_errors_are_reported_as_from_agent(runner: SandboxRunner, tmp_path: Path, code: str, error: str) -> None:
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 1
    assert error in res.stderr and '"<agent>"' in res.stderr
    assert "_agentrl_sandbox" not in res.stderr


def test_timeout_and_output_cap(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "while True:\n    pass", tmp_path, wall_s=0.5)
    assert res.timed_out is True and res.exit_code == -signal.SIGKILL
    assert res.elapsed_s >= 0.5  # the wall limit counts from the agent's code on: never early
    res = _run(runner, "while True:\n    print('x' * 1000)", tmp_path, output_bytes=100)
    assert res.output_truncated is True and res.timed_out is False
    assert res.stdout == "x" * 100 + "\n[output truncated]"
    assert res.stderr == ""
    res = _run(runner, "print('y' * 99, end='')", tmp_path, output_bytes=100)
    assert res.output_truncated is False and res.stdout == "y" * 99


def test_memory_and_file_size_limits(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "x = bytearray(2 * 1024 ** 3)\nprint(len(x))", tmp_path, memory_bytes=256 << 20)
    assert res.exit_code != 0 and "MemoryError" in res.stderr and res.stdout == ""
    res = _run(runner, "with open('big.bin', 'wb') as f:\n    f.write(b'0' * 200000)\n", tmp_path, file_bytes=100_000)
    assert res.exit_code != 0
    assert os.path.getsize(tmp_path / "big.bin") <= 100_000


def test_input_gets_eof(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "print(input())", tmp_path)
    assert res.exit_code == 1 and "EOFError" in res.stderr and res.timed_out is False


def test_stdio_objects_are_a_piped_interpreters(runner: SandboxRunner, tmp_path: Path) -> None:
    """The stdio objects are made once in the zygote (on a pipe and /dev/null, as a program's are):
    they answer as those of an interpreter with piped output would."""
    code = (
        "import sys\n"
        "try:\n    sys.stdout.tell(); told = 'no error'\nexcept OSError:\n    told = 'OSError'\n"
        "print(sys.stdout.seekable(), sys.stderr.seekable(), sys.stdout.line_buffering, sys.stderr.line_buffering,"
        " sys.stdin.read() == '', told, sys.stdout is sys.__stdout__, sys.stdout.fileno(), sys.stderr.errors)"
    )
    res = _run(runner, code, tmp_path)
    assert res.stdout == "False False False True True OSError True 1 backslashreplace\n", res.stderr


def test_unflushed_output_never_reaches_another_run(runner: SandboxRunner, tmp_path: Path) -> None:
    """Each run writes through its own copy of the zygote's stdio objects: what one run left in a
    buffer (lost at os._exit, as in a cold interpreter) never shows up in the next."""
    res = _run(runner, "import os, sys\nsys.stdout.write('left in the buffer')\nos._exit(0)", tmp_path)
    assert (res.exit_code, res.stdout) == (0, "")
    assert _run(runner, "print('next')", tmp_path).stdout == "next\n"


def test_invalid_utf8_is_decoded_with_replacement(runner: SandboxRunner, tmp_path: Path) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb\\n')\nsys.stderr.buffer.write(b'\\xc3(')"
    res = _run(runner, code, tmp_path)
    assert res.exit_code == 0 and res.stdout == "a\ufffd\ufffdb\n" and res.stderr == "\ufffd("


def test_environment_is_scrubbed(runner: SandboxRunner, tmp_path: Path) -> None:
    res = _run(runner, "import os, json\nprint(json.dumps(dict(os.environ)))", tmp_path)
    env = json.loads(res.stdout)
    assert env["PATH"] == "/usr/bin:/bin" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert os.path.realpath(env["HOME"]) == os.path.realpath(tmp_path)
    assert not any(k.startswith(("PYTEST", "VIRTUAL_ENV", "AGENTRL")) for k in env)


def test_stdlib_always_and_numpy_when_installed(runner: SandboxRunner, tmp_path: Path) -> None:
    code = "import statistics, decimal, fractions, zoneinfo, sqlite3, textwrap\nprint(statistics.mean([1, 2, 3]))"
    assert _run(runner, code, tmp_path).stdout == "2\n"
    pytest.importorskip("numpy")
    assert runner.numpy_available
    code = "import numpy as np\nprint(np.arange(10).sum(), np.linalg.det(np.eye(3)), np.fft.fft([1, 0]).real.tolist())"
    res = _run(runner, code, tmp_path)
    assert res.stdout == "45 1.0 [1.0, 1.0]\n", res.stderr


def test_random_state_differs_between_runs(runner: SandboxRunner, tmp_path: Path) -> None:
    code = "import random\nprint(random.random())"
    if runner.numpy_available:
        code = "import random, numpy\nprint(random.random(), numpy.random.rand())"
    outputs = {_run(runner, code, tmp_path).stdout for _ in range(3)}
    assert len(outputs) == 3


def test_numpy_starts_each_run_on_a_fresh_whole_key(runner: SandboxRunner, tmp_path: Path) -> None:
    if not runner.numpy_available:
        pytest.skip("numpy is not installed")
    code = "import numpy\n_, key, pos, gauss, _ = numpy.random.get_state()\nprint(pos, gauss, key[:4].tolist())"
    runs = [_run(runner, code, tmp_path).stdout.split(" ", 2) for _ in range(3)]
    assert [(pos, gauss) for pos, gauss, _key in runs] == [("624", "0")] * 3  # a new block is drawn from the new key
    assert len({key for _pos, _gauss, key in runs}) == 3


def test_subprocesses_and_threads_work(runner: SandboxRunner, tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, threading\n"
        "print(subprocess.run([sys.executable, '-c', 'print(40 + 2)'], capture_output=True, text=True).stdout.strip())\n"
        "out = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(out))\n"
    )
    res = _run(runner, code, tmp_path)
    assert res.stdout == "42\n[0, 1, 2, 3, 4, 5, 6, 7]\n", res.stderr


def test_concurrent_runs_from_threads(runner: SandboxRunner, tmp_path: Path) -> None:
    results: dict[int, PythonResult] = {}

    def work(i: int) -> None:
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        for j in range(5):
            results[i * 10 + j] = _run(runner, f"open('f', 'w').write('{i}-{j}')\nprint({i} * 1000 + {j})", ws)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, res in results.items():
        assert res.stdout == f"{(key // 10) * 1000 + key % 10}\n", res
    assert (tmp_path / "ws3" / "f").read_text() == "3-4"


def test_code_type_and_workspace_are_checked(runner: SandboxRunner, tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        runner.run(b"print(1)", str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        runner.run("print(1)", str(tmp_path / "missing"))


def test_a_child_left_running_ends_with_the_run(runner: SandboxRunner, tmp_path: Path) -> None:
    """The program says "done" without looking for children (the host checks that itself): a
    child it left running keeps the run open until the program exits, then dies with the run, and
    the program's own exit code and output are the result."""
    code = "import subprocess\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 30; echo late'])\nprint('early')\nraise SystemExit(3)"
    res = _run(runner, code, tmp_path)
    assert (res.exit_code, res.stdout, res.timed_out) == (3, "early\n", False), res.stderr
    assert_no_leftovers(runner)
