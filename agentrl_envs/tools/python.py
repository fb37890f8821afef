"""The ``python`` tool: run a program in the episode workspace."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.tasks.base import SubTask, Task
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.scoring import contains_figure
from agentrl_envs.tasks.state import StepState, ready
from agentrl_envs.text.observation import clip
from agentrl_envs.tools.base import Tool, pick, render_error
from agentrl_envs.tools.perturb import each, swap_words

__all__ = ["MAX_NUMBERS_OUTPUT", "PythonTool"]

#: A program's output holds the figure only among its first this many numbers (no printing every number).
MAX_NUMBERS_OUTPUT = 20


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
    aux_term: ClassVar[float | None] = 0.2
    log_names: ClassVar[tuple[str, ...]] = ("python", "exec", "run", "code")
    hosts_workspace: ClassVar[bool] = True
    component: ClassVar[str | None] = "computed"
    reads_query_csv: ClassVar[bool] = True
    max_chars: int = 4000

    def succeeded(self, response: ToolResponse) -> bool:
        """The program ran, exited 0 and was not stopped at its time limit."""
        return response.ok and response.result.get("exit_code") == 0 and not response.result.get("timed_out")

    def details(self, response: ToolResponse) -> dict[str, Any]:
        r = response.result
        return {
            "exit_code": r.get("exit_code"),
            "stdout": clip(str(r.get("stdout", "")), 4000),
            "stderr": clip(str(r.get("stderr", "")), 4000),
            "timed_out": r.get("timed_out"),
        }

    def observe(
        self, subs: Sequence[SubTask], states: Sequence[StepState], arguments: dict[str, Any], response: ToolResponse
    ) -> list[int]:
        """A run that printed a sub-task's figure(s), after its query, completes it."""
        ok = self.succeeded(response)
        stdout = str(response.result.get("stdout", "")) if ok else ""
        moved: list[int] = []
        for i, (sub, st) in enumerate(zip(subs, states)):
            if self.name not in sub.steps or st.done[self.name]:
                continue
            if not ok:
                # The oracle's own program ran and failed on the saved CSV (deleted,
                # overwritten): query again. A fault (no program ran) is just retried.
                ran = response.ok and response.fault is None
                if ran and st.gold_csv is not None and arguments.get("code") == sub.code_for(st.gold_csv):
                    st.gold_csv = None
                continue
            if ready(sub, st, self.name) and contains_figure(stdout, sub.figures, MAX_NUMBERS_OUTPUT):
                st.done[self.name] = True
                moved.append(i)
        return moved

    def gold_call(self, sub: SubTask, state: StepState) -> dict[str, Any] | None:
        if state.done[self.name]:
            return None
        path = state.gold_csv if "sql" in sub.steps else sub.data_path  # the query's saved result, else a data file
        assert path is not None
        return {"code": sub.code_for(path)}

    def perturb(self, task: Task, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """The wrong column, a dropped row, a syntax error, the wrong result file."""
        domain = DOMAINS[task.domain]
        code = arguments["code"]
        return [
            {"code": code.replace(repr(domain.measure), repr(domain.count), 1)},
            {"code": code.replace("for r in rows", "for r in rows[1:]", 1)},
            {"code": code.rstrip().rstrip(")")},
            {"code": re.sub(r"'results/q\d+\.csv'", "'results/q0.csv'", code, count=1)},
        ]

    def perturb_hard(self, task: Task, arguments: dict[str, Any], context: str) -> list[dict[str, Any]]:
        """Another statistic or column, a flipped test, swapped operands, an off-by-one slice."""
        domain = DOMAINS[task.domain]
        code = arguments["code"]
        variants = [
            swap_words(code, [("statistics.median(", "statistics.mean("), ("statistics.pstdev(", "statistics.stdev(")]),
            swap_words(code, [("statistics.pstdev(", "statistics.median("), ("sum(vals) / len(vals)", "max(vals)")]),
            swap_words(code, [(repr(domain.measure), repr(domain.count)), (repr(domain.count), repr(domain.measure))]),
            each(code, r" == ", lambda m: " != "),
            swap_words(
                code, [("(b - a) / a", "(a - b) / b"), ("(b - a) / a", "(b - a) / b"), ("part / total", "(total - part) / total")]
            ),
            swap_words(
                code,
                [
                    ("for r in rows", "for r in rows[1:]"),
                    ("vals[-", "vals[:"),
                    ("sum(vals) / len(vals)", "sum(vals) / (len(vals) + 1)"),
                ],
            ),
        ]
        pairs = re.findall(r"total\('(\d{4}-\d{2})'\), total\('(\d{4}-\d{2})'\)", code)
        for m1, m2 in pairs:
            variants.append([code.replace(f"total({m1!r}), total({m2!r})", f"total({m2!r}), total({m1!r})")])
        return [{"code": v} for vs in variants for v in vs]

    def random_arguments(self, task: Task | None, rng: np.random.Generator, number: float) -> dict[str, Any]:
        code = pick(
            rng,
            [
                "import os\nprint(os.listdir('.'))",
                f"print({number})",
                "import glob\nprint(glob.glob('**/*.csv', recursive=True))",
                "print(sum(range(10)))",
            ],
        )
        return {"code": code}

    def guess(self, task: Task) -> dict[str, Any] | None:
        return {"code": "import os\nprint(sorted(os.listdir('.')))"}

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
