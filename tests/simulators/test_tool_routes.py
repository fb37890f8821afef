"""The simulator finds its tools' routes: ``simulators/<tool>/route.py`` needs no registration line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulators.routes import ToolRoute
from simulators.tools import TOOL_ROUTES, discover_routes

_ROUTE = """
from simulators.routes import ToolRoute, ok

ROUTE = ToolRoute(name={name!r}, summary="echo", handler=lambda app, episode, payload: ok(payload),
                  request={{"type": "object"}}, result={{}}, result_name="EchoResult")
"""


def _package(tmp_path: Path, name: str, tools: dict[str, str | None]) -> str:
    """A package ``name`` in ``tmp_path`` with one subpackage per tool (``None``: no ``route.py``)."""
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "notes.py").write_text("")  # a module, not a package: never a tool
    for folder, route_name in tools.items():
        (root / folder).mkdir()
        (root / folder / "__init__.py").write_text("")
        if route_name is not None:
            (root / folder / "route.py").write_text(_ROUTE.format(name=route_name))
    return name


def test_every_simulator_folder_with_a_route_is_a_tool() -> None:
    assert set(TOOL_ROUTES) == {"sql", "python", "smtp", "http"}
    assert all(isinstance(r, ToolRoute) and r.name == name for name, r in TOOL_ROUTES.items())
    assert discover_routes() == TOOL_ROUTES  # the same table on a second walk


def test_a_new_folder_is_found_and_a_helper_package_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, "sim_probe_found", {"echo": "echo", "helpers": None, "alpha": "alpha"})
    try:
        routes = discover_routes(package)
    finally:
        for mod in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[mod]
    assert list(routes) == ["alpha", "echo"]
    assert routes["echo"].handler(None, None, {"x": 1}) == (200, {"ok": True, "result": {"x": 1}})


def test_a_route_named_after_another_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, "sim_probe_misnamed", {"echo": "sql"})
    try:
        with pytest.raises(TypeError, match=r"ROUTE = ToolRoute\(name='echo'"):
            discover_routes(package)
    finally:
        for mod in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[mod]
