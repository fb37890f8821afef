"""Text the envs accept and print: the Unicode text space, observation clipping and plain-text tables.

- ``spaces``: :class:`~agentrl_envs.text.spaces.UnicodeText`, the action and observation space;
- ``observation``: ``clip`` and ``printable``, shared by the tools' renders and the env core;
- ``table``: ``format_table``, the tables the CLI and benchmarks print.

It sits below ``tools`` and the core and imports nothing else from agentrl_envs.
"""
