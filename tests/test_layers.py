"""The import arrows point one way (DESIGN.md, "Layout and dependency direction"), checked on the source.

Each module's imports are read with ``ast``, including imports inside functions, which a check of
``sys.modules`` after ``import agentrl_envs`` would miss. A rule names the packages a layer must not
import; a violation names the file, the line and the import, so the fix is plain.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Code that drives envs with agents: nothing below the env core may import it.
ABOVE_ENV = ("agentrl_envs.agents", "agentrl_envs.openai_agent", "agentrl_envs.analysis", "agentrl_envs.cli")
BELOW_ENV = (*ABOVE_ENV, "agentrl_train", "torch")
#: (layer, the imports it must not make). A layer is a package folder or a module path.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("agentrl_envs/rewards", BELOW_ENV),
    ("agentrl_envs/faults", BELOW_ENV),
    ("agentrl_envs/backends", BELOW_ENV),
    ("agentrl_envs/tools", BELOW_ENV),
    ("agentrl_envs/tasks", BELOW_ENV),
    ("agentrl_envs/data", BELOW_ENV),
    ("agentrl_envs", ("agentrl_train", "torch", "transformers", "peft", "tests", "pytest")),
    ("simulators", ("agentrl_envs", "agentrl_train", "gymnasium", "torch")),
    # Shared helpers live in agentrl_envs.testing, so scripts never reach into the test suite.
    ("benchmarks", ("tests",)),
    ("examples", ("tests",)),
)
#: Deprecated aliases that re-export a moved module from its old path, kept for one release.
ALIASES = {"agentrl_envs/rewards/report.py", "agentrl_envs/rewards/counterfactual.py"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path``; relative imports are resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:  # `from agentrl_envs import agents` imports the module agentrl_envs.agents
                yield node.lineno, f"{base}.{alias.name}"


def violations(layer: str, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """Imports under ``layer`` that reach a ``forbidden`` package, as ``file:line imports name``."""
    found = []
    for path in sorted((root / layer).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALIASES:
            continue
        for line, name in imports(path, root):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{rel}:{line} imports {name}")
    return found


@pytest.mark.parametrize(("layer", "forbidden"), RULES, ids=[layer for layer, _ in RULES])
def test_layer_does_not_import_upwards(layer: str, forbidden: tuple[str, ...]) -> None:
    found = violations(layer, forbidden)
    assert not found, (
        f"{layer} must not import {', '.join(forbidden)} (DESIGN.md, dependency direction); move the code that needs "
        "it up a layer (agentrl_envs/analysis for code that drives envs with agents):\n  " + "\n  ".join(found)
    )


def test_the_check_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The rule fires on an upward import hidden in a function, written relatively or absolutely."""
    layer = tmp_path / "agentrl_envs" / "rewards"
    layer.mkdir(parents=True)
    (layer / "__init__.py").write_text("")
    (layer / "bad.py").write_text("def f():\n    from ..agents import OracleAgent\n    from agentrl_envs import analysis\n")
    (layer / "good.py").write_text("from . import schedule\nfrom agentrl_envs.errors import ConfigError\n")
    found = violations("agentrl_envs/rewards", ABOVE_ENV, root=tmp_path)
    assert found == [
        "agentrl_envs/rewards/bad.py:2 imports agentrl_envs.agents",
        "agentrl_envs/rewards/bad.py:2 imports agentrl_envs.agents.OracleAgent",
        "agentrl_envs/rewards/bad.py:3 imports agentrl_envs.analysis",
    ]


@pytest.mark.parametrize(("module", "private"), [("report", "_Episode"), ("counterfactual", "_writable_dir")])
def test_old_paths_still_import_with_a_deprecation_warning(module: str, private: str) -> None:
    from agentrl_envs.analysis import counterfactual, report

    moved = {"report": report, "counterfactual": counterfactual}[module]
    sys.modules.pop(f"agentrl_envs.rewards.{module}", None)
    with pytest.warns(DeprecationWarning, match=f"agentrl_envs.analysis.{module}"):
        old = importlib.import_module(f"agentrl_envs.rewards.{module}")
    assert old.__all__ == moved.__all__
    for name in moved.__all__:
        assert getattr(old, name) is getattr(moved, name)
    assert getattr(old, private) is getattr(moved, private)  # private names are forwarded too
