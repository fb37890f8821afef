"""The ``agentrl-envs`` command (``python -m agentrl_envs``); :func:`agentrl_envs.cli.main.main` is its entry point.

- ``main``: the parser and the dispatch to one ``cmd_*`` function per subcommand;
- ``args``: the argument types and checks shared with ``agentrl-train``.
"""
