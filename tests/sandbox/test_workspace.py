"""The capped workspace: a run's writes land on a tmpfs overlay and are copied back when it ends."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from simulators.python import RunLimits
from simulators.python.sandbox import SandboxRunner

from .conftest import SUITE_LIMITS, need


@pytest.fixture
def ws(runner: SandboxRunner, tmp_path: Path) -> Path:
    need(runner, "workspace_tmpfs")
    return tmp_path


def test_changes_are_copied_back(runner: SandboxRunner, ws: Path) -> None:
    (ws / "keep.txt").write_text("keep")
    (ws / "gone.txt").write_text("gone")
    (ws / "edit.csv").write_text("a\n1\n")
    (ws / "olddir").mkdir()
    (ws / "olddir" / "x").write_text("x")
    code = (
        "import os, shutil\n"
        "os.remove('gone.txt')\n"
        "open('edit.csv', 'a').write('2\\n')\n"
        "os.makedirs('new/deep')\n"
        "open('new/deep/f.bin', 'wb').write(bytes(range(256)) * 100)\n"
        "shutil.rmtree('olddir')\n"
        "os.mkdir('olddir')\n"
        "open('olddir/y', 'w').write('y')\n"
        "os.chmod('keep.txt', 0o600)\n"
    )
    res = runner.run(code, str(ws))
    assert res.exit_code == 0, res.stderr
    assert not (ws / "gone.txt").exists()
    assert (ws / "edit.csv").read_text() == "a\n1\n2\n"
    assert (ws / "new" / "deep" / "f.bin").read_bytes() == bytes(range(256)) * 100
    assert sorted(os.listdir(ws / "olddir")) == ["y"]
    assert stat.S_IMODE((ws / "keep.txt").stat().st_mode) == 0o600
    assert not [p for p in os.listdir(ws) if p.startswith(".sandbox-copy")]


def test_writes_before_a_timeout_are_kept(runner: SandboxRunner, ws: Path) -> None:
    # the CPU limit ends the spin: the write before it always happens, however busy the machine
    limits = RunLimits(**{**SUITE_LIMITS.__dict__, "cpu_s": 1})
    res = runner.run("open('partial.txt', 'w').write('before')\nwhile True:\n    pass\n", str(ws), limits)
    assert res.timed_out is True
    assert (ws / "partial.txt").read_text() == "before"


def test_the_host_sees_its_own_changes_between_runs(runner: SandboxRunner, ws: Path) -> None:
    assert runner.run("open('a.txt', 'w').write('1')", str(ws)).exit_code == 0
    (ws / "a.txt").write_text("2")
    (ws / "b.txt").write_text("from host")
    res = runner.run("print(open('a.txt').read(), open('b.txt').read())", str(ws))
    assert res.stdout == "2 from host\n"


def test_the_tmpfs_cap_is_per_run(runner: SandboxRunner, ws: Path) -> None:
    for name in ("one", "two", "three"):  # each run may write up to the cap; together they exceed it
        res = runner.run(f"open({name!r}, 'wb').write(b'0' * (1 << 20))", str(ws))
        assert res.exit_code == 0, res.stderr
    assert sorted(os.listdir(ws)) == ["one", "three", "two"]


def test_direct_workspace_when_tmpfs_is_off(tmp_path: Path) -> None:
    with SandboxRunner(SUITE_LIMITS, workspace_bytes=None) as r:
        assert r.layers["workspace_tmpfs"] is False
        res = r.run("open('direct.txt', 'w').write('ok')\nprint(open('direct.txt').read())", str(tmp_path))
        assert res.stdout == "ok\n"
        assert (tmp_path / "direct.txt").read_text() == "ok"


def test_directories_nested_too_deep_are_reported(runner: SandboxRunner, ws: Path) -> None:
    code = "import os\nos.makedirs('/'.join(['d'] * 70))\nopen('top.txt', 'w').write('kept')\n"
    res = runner.run(code, str(ws))
    assert res.exit_code == 0
    assert "[sandbox] workspace:" in res.stderr and "deeper than 64 levels" in res.stderr
    assert (ws / "top.txt").read_text() == "kept"
    depth, path = 0, ws / "d"
    while path.is_dir():
        depth, path = depth + 1, path / "d"
    assert depth == 64


SQUATTERS = {
    "old_names_files": "for i in range(200):\n    open(f'.sandbox-copy-1-{i}', 'w').close()\n",
    "old_names_dirs": "import os\nfor i in range(200):\n    os.makedirs(f'.sandbox-copy-1-{i}/x')\n",
    "old_names_in_subdir": "import os\nos.mkdir('sub')\nfor i in range(200):\n    os.mkdir(f'sub/.sandbox-copy-1-{i}')\n",
    "reserved_prefix": "import os\nfor i in range(50):\n    os.makedirs(f'.agentrl-copyback-{i:032x}/x')\n",
    "symlinks": "import os\nfor i in range(5):\n    os.symlink('/etc/passwd', f'.sandbox-copy-1-{i}')\n",
}


@pytest.mark.parametrize("squat", sorted(SQUATTERS))
def test_copy_back_temporaries_cannot_be_squatted(runner: SandboxRunner, ws: Path, squat: str) -> None:
    """Entries named like copy-back temporaries never make a later run lose its output while reporting success."""
    runner.run(SQUATTERS[squat], str(ws))  # may be refused in part (symlinks): what it left is what counts
    assert not [p for p in ws.rglob(".agentrl-copyback-*")], "a reserved name was copied back"
    code = "import os\nos.makedirs('sub', exist_ok=True)\nfor name in ('out.txt', 'sub/out.txt'):\n    open(name, 'w').write('kept')\nprint('wrote')\n"
    res = runner.run(code, str(ws))
    assert (res.exit_code, res.stdout, res.stderr) == (0, "wrote\n", ""), res
    assert (ws / "out.txt").read_text() == "kept" and (ws / "sub" / "out.txt").read_text() == "kept"
    assert not [p for p in ws.rglob(".agentrl-copyback-*")], "a temporary was left behind"


def test_a_planted_reserved_name_is_reported_not_kept(runner: SandboxRunner, ws: Path) -> None:
    res = runner.run("open('.agentrl-copyback-' + 'f' * 32, 'w').write('x')\nopen('ok.txt', 'w').write('y')\n", str(ws))
    assert res.exit_code == 0 and "reserved, not kept" in res.stderr, res
    assert sorted(os.listdir(ws)) == ["ok.txt"]


def test_each_run_is_granted_its_own_workspace_only(runner: SandboxRunner, tmp_path: Path) -> None:
    """The Landlock rules every run shares are packed once in the zygote; the workspace rule is
    added per run: a run in one workspace cannot read, list or write the workspace of the run before."""
    need(runner, "landlock")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert runner.run("open('mine.txt', 'w').write('first run')", str(first)).exit_code == 0
    probe = (
        "import os\n"
        "for attempt in (lambda: open(os.path.join(other, 'mine.txt')).read(), lambda: os.listdir(other),\n"
        "                lambda: open(os.path.join(other, 'new.txt'), 'w')):\n"
        "    try:\n        attempt()\n        print('allowed')\n"
        "    except PermissionError:\n        print('denied')\n"
        "open('ok.txt', 'w').write('second run')\n"
    )
    res = runner.run(f"other = {str(first)!r}\n" + probe, str(second))
    assert (res.exit_code, res.stdout) == (0, "denied\ndenied\ndenied\n"), res.stderr
    assert sorted(os.listdir(first)) == ["mine.txt"] and (second / "ok.txt").read_text() == "second run"
    assert runner.run("print(open('mine.txt').read())", str(first)).stdout == "first run\n"
