"""A tool's tasks come from its own module, ``agentrl_envs/tasks/<tool>_templates.py``: no registration line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl_envs.tasks.http_templates import HTTP_TEMPLATES, with_tickets
from agentrl_envs.tasks.sampler import _KIND_CODE, KINDS
from agentrl_envs.tasks.templates import TEMPLATES, TOOL_KINDS, TaskKind, discover_kinds
from agentrl_envs.tools import get_tool

_KIND = """
from agentrl_envs.tasks.templates import TaskKind

TASK_KIND = TaskKind(name={name!r}, templates=(), code=99, title="Probe")
"""


def _package(tmp_path: Path, name: str, modules: dict[str, str]) -> str:
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)
    return name


def _forget(package: str) -> None:
    for mod in [m for m in sys.modules if m.startswith(package)]:
        del sys.modules[mod]


def test_the_http_kind_comes_from_its_module() -> None:
    assert set(TOOL_KINDS) == {"http"}
    kind = TOOL_KINDS["http"]
    assert all(get_tool(name).name == name for name in TOOL_KINDS)  # every kind is named after a registered tool
    assert kind.templates is HTTP_TEMPLATES and TEMPLATES["http"] is HTTP_TEMPLATES and kind.prepare is with_tickets
    # The kinds and their seed codes are those tasks were drawn with before the seam (same tasks per seed).
    assert KINDS == ("sql", "python", "smtp", "pipeline", "http", "workplace")
    assert _KIND_CODE == {"sql": 1, "python": 2, "smtp": 3, "pipeline": 4, "http": 5, "workplace": 6}


def test_a_new_templates_module_is_found_and_others_are_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, "kinds_probe_found", {"probe_templates": _KIND.format(name="probe"), "helpers": ""})
    try:
        kinds = discover_kinds(package)
    finally:
        _forget(package)
    assert list(kinds) == ["probe"] and isinstance(kinds["probe"], TaskKind) and kinds["probe"].code == 99


@pytest.mark.parametrize("text", [_KIND.format(name="sql"), "TASK_KIND = None\n", ""])
def test_a_templates_module_without_its_kind_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, f"kinds_probe_bad{len(text)}", {"probe_templates": text})
    try:
        with pytest.raises(TypeError, match=r"TASK_KIND = TaskKind\(name='probe'"):
            discover_kinds(package)
    finally:
        _forget(package)
