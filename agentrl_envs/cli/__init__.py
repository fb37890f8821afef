"""The ``agentrl-envs`` command (``python -m agentrl_envs``); :func:`agentrl_envs.cli.main.main` is its entry point.

- ``main``: the parser and the dispatch to one ``cmd_*`` function per subcommand;
- ``argtypes``: the argparse types and option groups several commands share, and the env they make;
- ``play``, ``evaluate``, ``serve``: the commands with more than a screen of code (``serve`` also ``mcp``,
  ``openenv``, ``pg-sweep``);
- ``args``: ``parse_args`` with "did you mean" for a misspelt flag, shared with ``agentrl-train``.
"""
