"""docs/reference/rewards.md: its Python examples run as written and its image is there and small."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "rewards.md"


def test_python_blocks_run(capsys) -> None:  # type: ignore[no-untyped-def]
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "[0.398 0.424 0.45 ]" in out and "[-0.1 -0.1] [-1. -1.]" in out


def test_images_exist_and_are_small() -> None:
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", DOC.read_text())
    assert images
    for image in images:
        path = DOC.parent / image
        assert path.is_file() and path.stat().st_size < 100_000
