"""``python -m agentrl_envs``: the ``agentrl-envs`` command (:mod:`agentrl_envs.cli.main`), for when the script is not on PATH."""

from __future__ import annotations

import sys

from agentrl_envs.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
