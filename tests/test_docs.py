"""The docs site: its Python examples run as written, and `mkdocs build --strict` passes.

docs/reference/rewards.md has its own test in tests/rewards. Blocks that name real hosts
(``db.internal``, ``llm.internal``) are configuration examples and are not run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Guide pages whose examples have a test of their own below (it also checks what they print).
OWN_TEST = ("guide/recording.md", "guide/faults.md")
GUIDE = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "guide").glob("*.md"))


def _blocks(name: str) -> list[str]:
    """The page's Python blocks, less configuration examples naming real hosts (``.internal``) and blocks
    whose first line says ``# needs a running server`` (each of those has a runnable twin under examples/)."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)
    return [b for b in blocks if ".internal" not in b and not b.startswith("# needs a running server")]


def _run(name: str, replace: dict[str, str] | None = None) -> None:
    blocks = _blocks(name)
    assert blocks, f"docs/{name} has no Python example"
    for block in blocks:
        for old, new in (replace or {}).items():
            block = block.replace(old, new)
        namespace: dict[str, object] = {}
        try:
            exec(compile(block, str(DOCS / name), "exec"), namespace)
        finally:
            env = namespace.get("env")
            if env is not None:
                env.close()  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples' tempfile.mkdtemp() folders go under the test's tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_storage_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    _run("guide/recording.md")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 ") and out[0].endswith(" True"), out  # one trajectory, solved by the oracle
    assert out[1] == "[0.1 0.2]", out


def test_faults_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _run("guide/faults.md")
    out = capsys.readouterr().out
    assert "finish" in out and "{" in out.splitlines()[-1], out


@pytest.mark.parametrize("name", [g for g in GUIDE if g not in OWN_TEST and _blocks(g)])
def test_guide_examples_run(name: str, capfd: pytest.CaptureFixture[str]) -> None:
    # capfd, not capsys: an MCP stdio client hands the server process the real stderr file descriptor
    if name == "guide/frameworks.md":
        pytest.importorskip("trl")
    if name == "guide/openenv-mcp.md":
        pytest.importorskip("mcp")
    _run(name)
    out = capfd.readouterr().out
    if name == "guide/play.md":
        assert "sql ok: 1 row(s) x 1 column(s), saved to results/q1.csv" in out
        assert "True {'queried': True, 'computed': True, 'emailed': True}" in out


def test_sandbox_example_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _run("reference/sandbox.md", {'"/path/to/workspace"': repr(str(workspace))})
    tier = capsys.readouterr().out.split()[0]
    assert tier in ("FULL", "REDUCED", "UNSAFE")


def test_adapters_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    _run("reference/adapters.md")
    assert capsys.readouterr().out.splitlines()[0] == "12 True"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` (what `make docs` runs): a broken link, a missing page or reference fails."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        if os.environ.get("AGENTRL_REQUIRE_INTEGRATION") == "1":
            pytest.fail("mkdocs and mkdocstrings are not installed: pip install -e '.[dev]'")
        pytest.skip("mkdocs and mkdocstrings are not installed (the [dev] extra has them)")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for page in (
        "index.html",
        "reference/envs/sqlpythonsmtp-v1/index.html",
        "reference/envs/sqlpythonsmtp-v0/index.html",
        "reference/cli/index.html",
        "results/performance/index.html",
    ):
        assert (site / page).is_file(), page
    env_page = (site / "reference/envs/sqlpythonsmtp-v1/index.html").read_text(encoding="utf-8")
    assert "Version History" in env_page and "Tool schemas" in env_page
