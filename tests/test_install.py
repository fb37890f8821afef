"""A non-editable install into a fresh venv works from another directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import importlib.util, os, sys, gymnasium as gym, agentrl_envs
missing = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None]
assert not missing, f'packages left out of the install: {missing}'
from agentrl_envs.agents import OracleAgent
assert 'site-packages' in agentrl_envs.__file__, agentrl_envs.__file__
from agentrl_envs import error_profiles
assert 'none' in error_profiles.available()
for env_id in agentrl_envs.ENV_IDS:
    env = gym.make(env_id)
    obs, info = env.reset(seed=1)
    agent = OracleAgent(env)
    done = False
    while not done:
        obs, r, term, trunc, info = env.step(agent.act(obs, info))
        done = term or trunc
    assert info['success'], env_id
    env.close()
print('INSTALL-OK')
"""


#: The folders whose packages ship (setup.py finds every package under them).
SHIPPED = ("agentrl_envs", "agentrl_train", "simulators")


def _packages() -> list[str]:
    """The dotted names of the packages under :data:`SHIPPED` (folders with an ``__init__.py``)."""
    return sorted(".".join(p.parent.relative_to(ROOT).parts) for root in SHIPPED for p in (ROOT / root).rglob("__init__.py"))


def test_every_code_folder_is_a_package() -> None:
    """setup.py ships what ``find_packages`` finds: a folder of code without ``__init__.py`` would be left out."""
    folders = {p.parent for root in SHIPPED for p in (ROOT / root).rglob("*.py") if "__pycache__" not in p.parts}
    assert len(folders) >= 15, folders  # the walk found the tree
    assert {"simulators.http", "agentrl_train.serve"} <= set(_packages())
    missing = sorted(str(d.relative_to(ROOT)) for d in folders if not (d / "__init__.py").is_file())
    assert not missing, f"add an __init__.py to {missing}, or setup.py's find_packages leaves them out of an install"


@pytest.mark.slow
def test_non_editable_install_from_another_directory(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # Build from a clean copy: pip builds a local folder in place, and a stale build/lib of an earlier
    # build would ship a package the package list leaves out (and hide that it is left out).
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "runs", "__pycache__"))
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src)],
        check=True,
        timeout=600,
        cwd=tmp_path,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(py), "-c", SCRIPT, *_packages()], cwd=elsewhere, capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "INSTALL-OK" in out.stdout
    cli = subprocess.run(
        [str(env_dir / "bin" / "agentrl-envs"), "list"], cwd=elsewhere, capture_output=True, text=True, timeout=120, env=env
    )
    assert cli.returncode == 0 and "AgentRL/SQLPythonSMTP-v1" in cli.stdout
    assert sys.executable  # the test venv is untouched
