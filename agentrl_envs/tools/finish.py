"""The ``finish`` tool: end the episode with a final answer. Handled by the env, not a backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl_envs.tools.base import Tool

__all__ = ["FinishTool"]


@dataclass(frozen=True)
class FinishTool(Tool):
    name: ClassVar[str] = "finish"
    description: ClassVar[str] = "End the episode. Put the final answer in 'answer' (any text when none is asked for)."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the final answer"}},
        "required": ["answer"],
    }
