"""A Python program cannot show the host's workspace path in an observation (and runs stay reproducible)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401
from agentrl_envs.core.actions import format_call

PROGRAMS = [
    "import os\nprint(os.getcwd())",
    "import os\nprint(os.environ.get('HOME'), os.environ.get('TMPDIR'))",
    "import tempfile\nprint(tempfile.gettempdir())",
    "import os\nprint(os.path.abspath('results'), os.path.realpath('.'))",
    "open('/nonexistent/../' + __import__('os').getcwd() + '/no/such/file')",  # the path in a traceback (stderr)
    "import os, sys\nsys.stderr.write(os.getcwd() * 3)",
]


@pytest.mark.parametrize("code", PROGRAMS)
def test_program_output_hides_the_host_workspace(code: str) -> None:
    env = gym.make("AgentRL/Python-v0")
    try:
        seen = []
        for _ in range(2):
            env.reset(seed=11)
            obs, *_rest, info = env.step(format_call("python", {"code": code}))
            seen.append(obs)
            assert "agentrl-ws-" not in obs and "/tmp/" not in obs.replace("/workspace", ""), obs
            assert "agentrl-ws-" not in str(info)
        assert seen[0] == seen[1]  # the same episode and action give the same transcript
    finally:
        env.close()
