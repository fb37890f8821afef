"""The ``python`` tool: run a program in the episode workspace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.tools.base import Tool, render_error
from agentrl_envs.tools.text import clip

__all__ = ["PythonTool"]


@dataclass(frozen=True)
class PythonTool(Tool):
    """Python 3 with the standard library; prints are the result. Output in the observation is capped."""

    name: ClassVar[str] = "python"
    description: ClassVar[str] = (
        "Run a Python 3 program (standard library only). The working directory is the episode "
        "workspace, which holds the CSV files saved by the sql tool and any data files. Print what "
        "you need to see; no network, no input()."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the program"}},
        "required": ["code"],
    }
    max_chars: int = 4000

    def describe(self, facts: Mapping[str, Any]) -> str:
        if facts.get("numpy"):
            return self.description.replace("(standard library only)", "(standard library and numpy)")
        return self.description

    def render(self, response: ToolResponse) -> str:
        if not response.ok:
            return render_error(self.name, response)
        r = response.result
        code = r.get("exit_code")
        head = "python ok" if code == 0 else f"python error [exit code {code}]"
        if r.get("timed_out"):
            head = "python error [timeout]: the program was stopped at its time limit (wall clock or CPU)"
        elif r.get("output_truncated"):
            head += " (output limit reached; the program was stopped)"
        parts = [head]
        stdout, stderr = r.get("stdout", ""), r.get("stderr", "")
        if stdout:
            parts.append("stdout:\n" + clip(stdout, self.max_chars))
        if stderr:
            parts.append("stderr:\n" + clip(stderr, self.max_chars))
        if not stdout and not stderr:
            parts.append("(no output)")
        return "\n".join(parts)
