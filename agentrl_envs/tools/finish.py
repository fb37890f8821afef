"""The ``finish`` tool: end the episode with a final answer. Handled by the env, not a backend."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agentrl_envs.tasks.base import Task
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tools.base import Tool, pick
from agentrl_envs.tools.perturb import numbers, shift_numbers

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
    service: ClassVar[bool] = False

    def random_arguments(self, task: Task | None, rng: np.random.Generator, number: float) -> dict[str, Any]:
        return {"answer": pick(rng, [str(number), "done", "I don't know"])}

    def perturb(self, task: Task, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """Shifted figures, a made-up name."""
        answer = arguments["answer"]
        out: list[dict[str, Any]] = []
        shifted = shift_numbers(answer)
        if shifted != answer:
            out.append({"answer": shifted})
        for sub in task.subtasks:
            for n in sub.names:
                out.append({"answer": n.split()[0] + " Unknown"})
        return out

    def perturb_hard(self, task: Task, arguments: dict[str, Any], context: str) -> list[dict[str, Any]]:
        """Another figure or quoted word of the context; right-looking figures and names found nowhere in it."""
        domain = DOMAINS[task.domain]
        answer = arguments["answer"]
        out: list[dict[str, Any]] = [{"answer": other} for other in numbers(context) if other != answer]
        if re.fullmatch(r"-?\d+(?:\.\d+)?", answer):
            x, decimals = float(answer), len(answer.partition(".")[2])
            for y in (x + 1, x - 1, x * 2, x / 2, x * 1.1, x * 0.9):
                out.append({"answer": f"{y:.{decimals}f}"})
        elif task.data is not None and domain.entity in task.data.tables:
            table = task.data.tables[domain.entity]
            columns = [c[0] if isinstance(c, (list, tuple)) else c for c in table["columns"]]
            if "name" in columns:
                col = columns.index("name")
                names = [str(row[col]) for row in table["rows"][:12]]
                out += [{"answer": n} for n in names if n != answer]
        for word in re.findall(r"'([^']+)'", context):
            if word != answer:
                out.append({"answer": word})
        return out
