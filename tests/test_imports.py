"""Import hygiene: the env side never pulls in torch; simulators never pull in gymnasium."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return set(out.stdout.split())


def test_agentrl_envs_does_not_import_torch() -> None:
    mods = _modules_after(
        "import agentrl_envs, agentrl_envs.agents, agentrl_envs.cli.main, agentrl_envs.core.candidates\n"
        "import gymnasium as gym\nenv = gym.make('AgentRL/SQLPythonSMTP-v1')\nenv.reset(seed=0)\nenv.close()"
    )
    assert "agentrl_envs" in mods
    assert not {"torch", "transformers", "peft"} & mods
    assert not {"verifiers", "skyrl_gym", "gem", "mcp", "openenv", "fastapi"} & mods, "integrations load on their own import only"


def test_simulators_do_not_import_gymnasium_or_envs() -> None:
    mods = _modules_after("import simulators, simulators.sql, simulators.python, simulators.smtp")
    assert "simulators.app" in mods
    assert not {m for m in mods if m.split(".")[0] in ("gymnasium", "agentrl_envs", "torch")}


def test_error_profiles_ship_with_the_package() -> None:
    from agentrl_envs import error_profiles

    assert "none" in error_profiles.available()
    assert "name: none" in error_profiles.read_text("none")


def test_python_dash_m_agentrl_envs_is_the_command_and_imports_no_torch() -> None:
    listed = subprocess.run([sys.executable, "-m", "agentrl_envs", "list"], capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "AgentRL/SQL-v0" in listed.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "agentrl_envs", "serve", "--port", "99999"], capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2 and "--port" in refused.stderr and "Traceback" not in refused.stderr
    mods = _modules_after(
        "import runpy, sys\nsys.argv = ['agentrl_envs', 'list']\n"
        "try:\n    runpy.run_module('agentrl_envs', run_name='__main__')\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code"
    )
    assert "agentrl_envs.cli.main" in mods
    assert not {"torch", "transformers", "peft"} & mods
