"""The README's Python examples run as written."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The examples' tempfile.mkdtemp() run folders (a 64 MiB ring among them) go under pytest's tmp_path.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # Blocks that name real hosts (db.internal, mail.internal) are configuration examples, not run here.
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if ".internal" not in b]
    assert blocks
    for block in blocks:
        namespace: dict[str, object] = {}
        exec(compile(block, str(README), "exec"), namespace)
        env = namespace.get("env")
        if env is not None:
            env.close()  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "sql ok: 1 row(s) x 1 column(s), saved to results/q1.csv" in out
    assert "True {'queried': True, 'computed': True, 'emailed': True}" in out


def test_readme_starts_with_the_two_commands() -> None:
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None
    assert first_block.group(1).splitlines()[0].startswith("make demo")
    assert first_block.group(1).splitlines()[1].startswith("make test")


def test_the_tiny_build_time_is_stated_the_same_everywhere() -> None:
    # One build, one measured figure wherever the build time is stated; the build runs on one thread wherever it runs
    root = README.parent
    sentence = r"(?:(?!\. ).){0,250}?"  # within one sentence
    pattern = re.compile(
        rf"(?:builds? the (?:tiny )?model|pretrained once){sentence}((?:about |a few |\d+ )(?:[\d-]+ )?min(?:utes)?(?: \d+ s)?[^.;:),]*)"
    )
    found = {}
    for name in ("README.md", "CONTRIBUTING.md", "Makefile", "docs/guide/training.md"):
        flat = " ".join((root / name).read_text().split())
        found[name] = [m.group(1).strip() for m in pattern.finditer(flat)]
    assert all(found.values()), found
    assert {said for saids in found.values() for said in saids} == {"4 min 59 s and 6 min 05 s wall on a 2-core machine"}, found
