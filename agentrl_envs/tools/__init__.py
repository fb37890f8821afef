"""The one registry of tools: :data:`TOOLS`. Everything that needs the list of tools reads it here.

Adding a tool: one file here (a :class:`Tool` subclass), one line in :data:`TOOLS`, and one folder
in ``simulators/`` declaring its route (see CONTRIBUTING.md). The contract test
(``tests/envs/test_tool_contract.py``) checks every registered tool has each piece.
"""

from __future__ import annotations

from agentrl_envs.errors import ConfigError
from agentrl_envs.tools.base import Tool
from agentrl_envs.tools.finish import FinishTool
from agentrl_envs.tools.python import PythonTool
from agentrl_envs.tools.smtp import SMTPTool
from agentrl_envs.tools.sql import SQLTool

TOOLS: dict[str, Tool] = {t.name: t for t in (SQLTool(), PythonTool(), SMTPTool(), FinishTool())}

__all__ = ["TOOLS", "FinishTool", "PythonTool", "SMTPTool", "SQLTool", "Tool", "get_tool", "service_tools"]


def service_tools() -> tuple[str, ...]:
    """The names of the tools a backend serves (every registered tool but ``finish``), in order."""
    return tuple(name for name, tool in TOOLS.items() if tool.service)


def get_tool(name: str) -> Tool:
    """The registered tool called ``name``.

    Raises:
        ConfigError: no tool of that name is registered.
    """
    tool = TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        raise ConfigError(f"unknown tool {str(name)[:64]!r}; the registered tools are {', '.join(TOOLS)}")
    return tool
