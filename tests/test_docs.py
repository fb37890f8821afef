"""The Python examples of docs/*.md run as written (docs/rewards.md has its own test in tests/rewards)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _blocks(name: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)
    assert blocks, f"docs/{name} has no Python example"
    return blocks


def _run(name: str, replace: dict[str, str] | None = None) -> None:
    for block in _blocks(name):
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
    _run("storage.md")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 ") and out[0].endswith(" True"), out  # one trajectory, solved by the oracle
    assert out[1] == "[0.1 0.2]", out


def test_faults_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _run("faults.md")
    out = capsys.readouterr().out
    assert "finish" in out and "{" in out.splitlines()[-1], out


def test_sandbox_example_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _run("sandbox.md", {'"/path/to/workspace"': repr(str(workspace))})
    tier = capsys.readouterr().out.split()[0]
    assert tier in ("FULL", "REDUCED", "UNSAFE")


def test_adapters_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    _run("adapters.md")
    assert capsys.readouterr().out.splitlines()[0] == "12 True"
