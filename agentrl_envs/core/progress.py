"""What an episode has achieved so far: the task checker, and the oracle's view of the next step.

The checker is judged on what the services returned (tool results), never on the agent's claims.
Each step of a sub-task is one tool's (``SubTask.steps``, in order), and the tool owns its rule:
what call completes its step (``Tool.observe``), the component name it reports (``Tool.component``)
and the gold plan's call for it (``Tool.gold_call``). For the shipped tools:

- ``queried``: a successful SQL query returned rows (before the computation);
- ``computed``: a successful Python run printed the sub-task's figure(s) after its query;
- ``emailed``: an accepted message went to exactly the required recipients, after the
  computation, with the figures in the body (and the required attachments);
- ``answer``: the final answer holds the expected figure or name (answer tasks only).

With ``lookups`` (envs whose ``oracle_lookup`` is on), the gold plan finds an email's recipients
before sending it: a sub-task with a ``lookup_sql`` whose addresses no tool result has shown yet gets
that ``sql`` query before its ``smtp`` call. The lookup is the oracle's, not a component: success
and rewards are judged as without it.

Component names carry a ``sN.`` prefix when a task has several sub-tasks. A task succeeds when
every component holds. Text is compared format-invariantly (:mod:`agentrl_envs.tasks.scoring`).
"""

from __future__ import annotations

from typing import Any

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.tasks.base import SubTask, Task
from agentrl_envs.tasks.scoring import contains_figure, contains_name
from agentrl_envs.tasks.state import StepState
from agentrl_envs.tools import TOOLS, get_tool
from agentrl_envs.tools.python import MAX_NUMBERS_OUTPUT
from agentrl_envs.tools.smtp import MAX_NUMBERS_EMAIL, email_matches

__all__ = ["MAX_NUMBERS_ANSWER", "MAX_NUMBERS_EMAIL", "MAX_NUMBERS_OUTPUT", "Progress", "email_matches"]

MAX_NUMBERS_ANSWER = 3


class Progress:
    """Tracks one episode of one task."""

    def __init__(self, task: Task, lookups: bool = False) -> None:
        self.task = task
        self.lookups = lookups
        for sub in task.subtasks:
            for tool in sub.steps:
                if get_tool(tool).component is None:
                    raise ValueError(f"sub-task {sub.template}: tool {tool!r} has no progress rule (Tool.component)")
        self.states = [StepState({tool: False for tool in sub.steps}) for sub in task.subtasks]
        self.answer: str | None = None

    # -- updates ---------------------------------------------------------------------------------

    def observe(self, tool: str, arguments: dict[str, Any], response: ToolResponse) -> list[int]:
        """Record one tool result; return the indices of the sub-tasks it moved forward."""
        moved = get_tool(tool).observe(self.task.subtasks, self.states, arguments, response)
        if self.lookups and response.ok:
            pending = [(sub, st) for sub, st in zip(self.task.subtasks, self.states) if sub.lookup_sql and not st.looked_up]
            shown = repr(response.result) if pending else ""
            for sub, st in pending:
                assert sub.email is not None  # templates set lookup_sql only beside an email
                st.looked_up = all(address in shown for address in (*sub.email.to, *sub.email.cc))
        return moved

    def finish(self, answer: str) -> None:
        self.answer = answer

    # -- judgement -------------------------------------------------------------------------------

    def components(self) -> dict[str, bool]:
        """Each required component by name, and whether it holds."""
        out: dict[str, bool] = {}
        multi = len(self.task.subtasks) > 1
        for i, (sub, st) in enumerate(zip(self.task.subtasks, self.states)):
            prefix = f"s{i + 1}." if multi else ""
            for tool in sub.steps:
                out[prefix + str(TOOLS[tool].component)] = st.done[tool]
            if self.task.answer_required:
                out[prefix + "answer"] = self.answer is not None and _answer_matches(sub, self.answer)
        return out

    def subtask_index(self) -> int:
        """Index of the first sub-task not yet complete (len(subtasks) when all are)."""
        for i, st in enumerate(self.states):
            if not all(st.done.values()):
                return i
        return len(self.task.subtasks)

    # -- the oracle's next step ------------------------------------------------------------------

    def next_gold_call(self) -> tuple[str, dict[str, Any]]:
        """The gold plan's next call from the current state, whatever led here."""
        for sub, st in zip(self.task.subtasks, self.states):
            if not all(st.done.values()):
                return self._gold_step(sub, st)
        return "finish", {"answer": self.task.gold_answer}

    def _gold_step(self, sub: SubTask, st: StepState) -> tuple[str, dict[str, Any]]:
        for tool in sub.steps:
            arguments = TOOLS[tool].gold_call(sub, st)
            if arguments is not None:
                if tool == "smtp" and self.lookups and sub.lookup_sql is not None and not st.looked_up:
                    return "sql", {"query": sub.lookup_sql}
                return tool, arguments
        raise AssertionError(f"sub-task {sub.template} is not complete but no tool has a next gold call")


def _answer_matches(sub: SubTask, answer: str) -> bool:
    if sub.names:
        return all(contains_name(answer, n) for n in sub.names)
    return contains_figure(answer, sub.figures, MAX_NUMBERS_ANSWER)
