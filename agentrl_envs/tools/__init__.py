"""The tools an agent can call. Adding a tool: one file here, one folder in ``simulators/``."""

from agentrl_envs.tools.base import Tool
from agentrl_envs.tools.finish import FinishTool
from agentrl_envs.tools.python import PythonTool
from agentrl_envs.tools.smtp import SMTPTool
from agentrl_envs.tools.sql import SQLTool

TOOLS: dict[str, Tool] = {t.name: t for t in (SQLTool(), PythonTool(), SMTPTool(), FinishTool())}

__all__ = ["TOOLS", "FinishTool", "PythonTool", "SMTPTool", "SQLTool", "Tool"]
