"""The import arrows point one way (docs/design.md, "Layers and dependency direction"), checked on the source.

Each module's imports are read with ``ast``, including imports inside functions, which a check of
``sys.modules`` after ``import agentrl_envs`` would miss. A rule names the packages a layer must not
import; a violation names the file, the line and the import, so the fix is plain.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The packages above the env core: what drives envs (agents, analysis, cli, server) and the views of an env (wrappers,
#: integrations). Nothing below the core may import them, nor the core itself.
ABOVE_ENV = (
    "agentrl_envs.agents",
    "agentrl_envs.analysis",
    "agentrl_envs.cli",
    "agentrl_envs.server",
    "agentrl_envs.wrappers",
    "agentrl_envs.integrations",
)
HEAVY = ("agentrl_train", "torch")
BELOW_ENV = (*ABOVE_ENV, "agentrl_envs.core", *HEAVY)
#: Below every other package of agentrl_envs: text helpers import only ``errors``.
BELOW_ALL = (
    *(f"agentrl_envs.{p}" for p in ("core", "tools", "tasks", "rewards", "faults", "backends", "data")),
    *BELOW_ENV,
)
#: (layer, the imports it must not make). A layer is a package folder or a module path.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("agentrl_envs/text", BELOW_ALL),
    ("agentrl_envs/rewards", BELOW_ENV),
    ("agentrl_envs/faults", BELOW_ENV),
    ("agentrl_envs/backends", BELOW_ENV),
    ("agentrl_envs/tools", BELOW_ENV),
    # Tasks say what to do; tools grade their own steps against them (agentrl_envs/core/progress.py asks each tool).
    ("agentrl_envs/tasks", (*BELOW_ENV, "agentrl_envs.tools")),
    ("agentrl_envs/data", BELOW_ENV),
    ("agentrl_envs/core", (*ABOVE_ENV, *HEAVY)),
    # The server serves the simulator behind the backend seam; it drives no env and is no view of one.
    ("agentrl_envs/server", tuple(p for p in BELOW_ENV if p != "agentrl_envs.server")),
    (
        "agentrl_envs/wrappers",
        ("agentrl_envs.agents", "agentrl_envs.analysis", "agentrl_envs.cli", "agentrl_envs.integrations", *HEAVY),
    ),
    (
        "agentrl_envs/agents",
        ("agentrl_envs.analysis", "agentrl_envs.cli", "agentrl_envs.integrations", "agentrl_envs.server", *HEAVY),
    ),
    ("agentrl_envs/integrations", ("agentrl_envs.analysis", "agentrl_envs.cli", *HEAVY)),
    ("agentrl_envs/analysis", ("agentrl_envs.cli", "agentrl_envs.server", "agentrl_envs.integrations", *HEAVY)),
    ("agentrl_envs", ("agentrl_train", "torch", "transformers", "peft", "tests", "pytest")),
    ("simulators", ("agentrl_envs", "agentrl_train", "gymnasium", "torch")),
    # Shared helpers live in agentrl_envs.testing, so scripts never reach into the test suite.
    ("benchmarks", ("tests",)),
    ("examples", ("tests",)),
)
#: Moved modules: old path -> new path. The old paths are gone (the CHANGELOG lists the moves); nothing in the
#: repository may import them, and no doc may name them. ``agentrl_envs.server`` (now
#: ``agentrl_envs.server.simulator``) and ``agentrl_envs.core``, ``agentrl_envs.cli``, ``agentrl_envs.agents`` and
#: ``agentrl_envs.wrappers`` (modules that became packages of the same name) are not listed: their paths import again.
MOVED: dict[str, str] = {
    "agentrl_envs.tasks.progress": "agentrl_envs.core.progress",
    "agentrl_envs.rewards.report": "agentrl_envs.analysis.report",
    "agentrl_envs.rewards.counterfactual": "agentrl_envs.analysis.counterfactual",
    "agentrl_envs.env": "agentrl_envs.core.env",
    "agentrl_envs.envs": "agentrl_envs.core.registered_envs",
    "agentrl_envs.server_workers": "agentrl_envs.server.processes",
    "agentrl_envs.tools.text": "agentrl_envs.text.observation",
    "simulators.python.runner": "simulators.python.subprocess_runner",
    "simulators.python.sandbox.runner": "simulators.python.sandbox.host",
    "simulators.smtp.server": "simulators.smtp.mailbox",
    # issue #37: agentrl_envs grouped into packages by job
    "agentrl_envs.registered_envs": "agentrl_envs.core.registered_envs",
    "agentrl_envs.actions": "agentrl_envs.core.actions",
    "agentrl_envs.progress": "agentrl_envs.core.progress",
    "agentrl_envs.candidates": "agentrl_envs.core.candidates",
    "agentrl_envs.seeding": "agentrl_envs.core.seeding",
    "agentrl_envs.spaces": "agentrl_envs.text.spaces",
    "agentrl_envs.observation_text": "agentrl_envs.text.observation",
    "agentrl_envs.text_table": "agentrl_envs.text.table",
    "agentrl_envs.openai_agent": "agentrl_envs.agents.openai_chat",
    "agentrl_envs._deadline": "agentrl_envs.backends._deadline",
    "agentrl_envs.chat": "agentrl_envs.integrations.chat",
    "agentrl_envs.cli_args": "agentrl_envs.cli.args",
    "agentrl_envs.simulator_server": "agentrl_envs.server.simulator",
    "agentrl_envs.simulator_server_processes": "agentrl_envs.server.processes",
    "agentrl_envs.rewards.normalize": "agentrl_envs.wrappers.normalize_reward",
    "agentrl_envs.data.recorder": "agentrl_envs.wrappers.record_trajectories",
}
#: Where code and docs live; the docs are checked for stale paths (CHANGELOG.md records history and is left out).
CODE = ("agentrl_envs", "simulators", "agentrl_train", "benchmarks", "examples", "tests")
DOCS = ("README.md", "CONTRIBUTING.md", "docs")


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
        for line, name in imports(path, root):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{rel}:{line} imports {name}")
    return found


@pytest.mark.parametrize(("layer", "forbidden"), RULES, ids=[layer for layer, _ in RULES])
def test_layer_does_not_import_upwards(layer: str, forbidden: tuple[str, ...]) -> None:
    found = violations(layer, forbidden)
    assert not found, (
        f"{layer} must not import {', '.join(forbidden)} (docs/design.md, 'Layers and dependency direction'); move the code that needs "
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


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_paths_are_gone_and_new_ones_import(old: str) -> None:
    importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    try:
        spec = importlib.util.find_spec(old)
    except ModuleNotFoundError:  # its parent package is gone too
        return
    # An editable install of another checkout (a shared venv) can still find its copy; this checkout must have none.
    origin = Path(spec.origin or "").resolve() if spec is not None else None
    assert origin is None or ROOT not in origin.parents, f"{old} is still found, at {origin}"


def test_nothing_imports_an_old_path() -> None:
    found = []
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if ".venv" in path.parts:
                continue
            for line, name in imports(path):
                if any(name == old or name.startswith(old + ".") for old in MOVED):
                    found.append(f"{rel}:{line} imports {name}")
    assert not found, "import the new paths (tests/test_layers.py MOVED maps old to new):\n  " + "\n  ".join(found)


def _stale(text: str) -> list[str]:
    """Old module paths named in ``text``, dotted (``agentrl_envs.env``) or as files (``agentrl_envs/env.py``)."""
    found = []
    for old in MOVED:
        dotted = re.compile(re.escape(old) + r"(?![A-Za-z0-9_])")
        filename = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(old.replace(".", "/")) + r"\.py")
        found += [m.group(0) for pattern in (dotted, filename) for m in pattern.finditer(text)]
    return found


def test_no_doc_names_an_old_path() -> None:
    docs = [ROOT / d for d in DOCS if (ROOT / d).is_file()] + sorted(
        p for d in DOCS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.md")
    )
    found = [f"{p.relative_to(ROOT)}: {hit}" for p in docs for hit in _stale(p.read_text())]
    assert not found, "name the new module paths (tests/test_layers.py MOVED):\n  " + "\n  ".join(found)


def test_the_stale_path_check_fires() -> None:
    assert _stale("see agentrl_envs.env.ToolUseEnv and simulators/python/runner.py") == [
        "agentrl_envs.env",
        "simulators/python/runner.py",
    ]
    assert _stale("agentrl_envs.envs? no: agentrl_envs.core.registered_envs, agentrl_envs.core.env, tools/textual.py") == [
        "agentrl_envs.envs"
    ]


def _module_graph(
    tops: tuple[str, ...] = ("agentrl_envs", "simulators", "agentrl_train"), root: Path = ROOT
) -> dict[str, set[str]]:
    """Module -> the modules (not packages) it imports, at any depth of the file (functions included)."""
    files = {_module_name(p, root): p for top in tops for p in (root / top).rglob("*.py")}
    modules = {name for name, p in files.items() if p.name != "__init__.py"}
    return {
        name: {imported for _, imported in imports(files[name], root) if imported in modules and imported != name}
        for name in modules
    }


def mutual_imports(graph: dict[str, set[str]]) -> list[str]:
    """Pairs of modules that import each other, as ``a <-> b``."""
    return sorted({" <-> ".join(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, set())})


def test_no_two_modules_import_each_other() -> None:
    found = mutual_imports(_module_graph())
    assert not found, (
        "these modules import each other (a late import only hides it): move what both need into a module below "
        "them both:\n  " + "\n  ".join(found)
    )


def test_the_mutual_import_check_fires(tmp_path: Path) -> None:
    pkg = tmp_path / "agentrl_train"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from agentrl_train import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from agentrl_train.a import y\n")
    assert mutual_imports(_module_graph(("agentrl_train",), tmp_path)) == ["agentrl_train.a <-> agentrl_train.b"]
