"""Tier probing: FULL where every layer holds, REDUCED with a warning, UNSAFE refused by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from simulators.python.sandbox import FULL, REDUCED, UNSAFE, SandboxError, SandboxRunner, SandboxWarning

from .conftest import SUITE_LIMITS, assert_no_leftovers, require_integration

EVERYTHING = ["userns", "mntns", "netns", "pidns", "ipcns", "landlock", "seccomp", "pid_max", "workspace_tmpfs"]


def test_tier_is_full(runner: SandboxRunner) -> None:
    """CI (AGENTRL_REQUIRE_INTEGRATION=1) asserts FULL; elsewhere a lesser tier is reported and skipped."""
    if runner.tier != FULL and not require_integration():
        pytest.skip(f"tier {runner.tier} here: missing {runner.missing} ({'; '.join(runner.notes)})")
    assert runner.tier == FULL, runner.info()
    assert runner.missing == []
    assert all(runner.layers[name] for name in ("pidns", "netns", "seccomp", "landlock", "process_cap", "no_capabilities"))


def test_info_reports_the_tier(runner: SandboxRunner) -> None:
    info = runner.info()
    assert info["tier"] == runner.tier in (FULL, REDUCED, UNSAFE)
    assert set(info["missing"]) <= set(info["layers"])


def test_unsafe_is_refused_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="allow_unsafe=True"):
        SandboxRunner(SUITE_LIMITS, disable=EVERYTHING)
    with pytest.warns(SandboxWarning, match="UNSAFE"):
        r = SandboxRunner(SUITE_LIMITS, allow_unsafe=True, disable=EVERYTHING)
    try:
        assert r.tier == UNSAFE
        assert {"pidns", "netns", "seccomp", "landlock"} <= set(r.missing)
        assert r.run("print(6 * 7)", str(tmp_path)).stdout == "42\n"
        res = r.run("while True:\n    pass", str(tmp_path), SUITE_LIMITS.__class__(wall_s=0.5))
        assert res.timed_out is True
    finally:
        r.close()


def test_reduced_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.warns(SandboxWarning, match="landlock"):
        r = SandboxRunner(SUITE_LIMITS, disable=["landlock"])
    try:
        assert r.tier == REDUCED and r.missing == ["landlock"]
        assert any("landlock" in note for note in r.notes)
        assert r.run("print(1)", str(tmp_path)).stdout == "1\n"
    finally:
        r.close()


def test_without_a_pid_namespace_the_subreaper_still_kills_daemons(tmp_path: Path) -> None:
    with pytest.warns(SandboxWarning):
        r = SandboxRunner(SUITE_LIMITS, disable=["pidns"])
    try:
        assert r.tier == REDUCED and "pidns" in r.missing
        marker = f"agentrl-sbx-reduced-{os.getpid()}"
        code = (
            "import os, subprocess\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['{marker}', '1000'])\n"
            "    os._exit(0)\n"
            f"subprocess.Popen(['{marker}', '1000'], executable='/bin/sleep', start_new_session=True)\n"
            "print('parent done')\n"
        )
        res = r.run(code, str(tmp_path))
        assert res.stdout == "parent done\n", res.stderr
        assert_no_leftovers(r, marker)
    finally:
        r.close()


@pytest.mark.slow
def test_unprivileged_user_gets_the_same_tier() -> None:
    """As root, run a host process as ``nobody`` (system interpreter) and check it probes FULL too."""
    setpriv, system_python = shutil.which("setpriv"), "/usr/bin/python3"
    if os.geteuid() != 0 or setpriv is None or not os.access(system_python, os.X_OK):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to start an unprivileged host")
    repo = Path(__file__).resolve().parents[2]
    site = [p for p in sys.path if p.endswith("site-packages")]
    tmp_path = Path(tempfile.mkdtemp(prefix="agentrl-sbx-nobody-"))
    script = tmp_path / "unprivileged.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, shutil, sys, tempfile
            sys.path[:0] = [{str(repo)!r}, *{site!r}]
            from simulators.python.sandbox import SandboxRunner
            r = SandboxRunner()
            ws = tempfile.mkdtemp()
            res = r.run("import os\\nprint(os.getuid())\\nopen('f', 'w').write('x')\\nopen('/etc/passwd')", ws)
            print(r.tier, r.missing, r.layers["workspace_tmpfs"], os.listdir(ws), res.exit_code, "PermissionError" in res.stderr)
            r.close()
            shutil.rmtree(ws)
            """
        )
    )
    os.chmod(tmp_path, 0o755)
    proc = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", system_python, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"},
    )
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == "FULL [] True ['f'] 1 True", proc.stdout + proc.stderr[-2000:]
