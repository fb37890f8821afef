"""What an episode has achieved so far: the task checker, and the oracle's view of the next step.

The checker is judged on what the services returned (tool results), never on the agent's claims:

- ``queried``: a successful SQL query returned rows (before the computation);
- ``computed``: a successful Python run printed the sub-task's figure(s) after its query;
- ``emailed``: an accepted message went to exactly the required recipients, after the
  computation, with the figures in the body (and the required attachments);
- ``answer``: the final answer holds the expected figure or name (answer tasks only).

Component names carry a ``sN.`` prefix when a task has several sub-tasks. A task succeeds when
every component holds. Text is compared format-invariantly (:mod:`agentrl_envs.tasks.scoring`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.tasks.base import SubTask, Task, normalize_rows
from agentrl_envs.tasks.scoring import contains_figure, contains_name

__all__ = ["Progress"]

MAX_NUMBERS_OUTPUT = 20
MAX_NUMBERS_EMAIL = 12
MAX_NUMBERS_ANSWER = 3


@dataclass
class _State:
    queried: bool = False
    computed: bool = False
    emailed: bool = False
    gold_csv: str | None = None


class Progress:
    """Tracks one episode of one task."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.states = [_State() for _ in task.subtasks]
        self.answer: str | None = None

    # -- updates ---------------------------------------------------------------------------------

    def observe(self, tool: str, arguments: dict[str, Any], response: ToolResponse) -> list[int]:
        """Record one tool result; return the indices of the sub-tasks it moved forward."""
        moved: list[int] = []
        subs = self.task.subtasks
        if tool == "sql":
            if response.ok and response.result.get("rows"):
                rows = normalize_rows(response.result["rows"])
                for sub, st in zip(subs, self.states):
                    if sub.gold_rows is not None and rows == sub.gold_rows:
                        st.gold_csv = response.result.get("csv_path")
                for i, (sub, st) in enumerate(zip(subs, self.states)):
                    if "sql" in sub.steps and not st.queried:
                        st.queried = True
                        moved.append(i)
                        break
        elif tool == "python":
            ok = response.ok and response.result.get("exit_code") == 0 and not response.result.get("timed_out")
            stdout = str(response.result.get("stdout", "")) if ok else ""
            for i, (sub, st) in enumerate(zip(subs, self.states)):
                if "python" not in sub.steps or st.computed:
                    continue
                if not ok:
                    # The oracle's own program ran and failed on the saved CSV (deleted,
                    # overwritten): query again. A fault (no program ran) is just retried.
                    ran = response.ok and response.fault is None
                    if ran and st.gold_csv is not None and arguments.get("code") == sub.code_for(st.gold_csv):
                        st.gold_csv = None
                    continue
                if ("sql" not in sub.steps or st.queried) and contains_figure(stdout, sub.figures, MAX_NUMBERS_OUTPUT):
                    st.computed = True
                    moved.append(i)
        elif tool == "smtp" and response.ok:
            for i, (sub, st) in enumerate(zip(subs, self.states)):
                if "smtp" not in sub.steps or st.emailed:
                    continue
                if "python" in sub.steps and not st.computed:
                    continue
                if email_matches(sub, response.result):
                    st.emailed = True
                    moved.append(i)
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
            if "sql" in sub.steps:
                out[prefix + "queried"] = st.queried
            if "python" in sub.steps:
                out[prefix + "computed"] = st.computed
            if "smtp" in sub.steps:
                out[prefix + "emailed"] = st.emailed
            if self.task.answer_required:
                out[prefix + "answer"] = self.answer is not None and _answer_matches(sub, self.answer)
        return out

    def subtask_index(self) -> int:
        """Index of the first sub-task not yet complete (len(subtasks) when all are)."""
        for i, (sub, st) in enumerate(zip(self.task.subtasks, self.states)):
            if not self._complete(sub, st):
                return i
        return len(self.task.subtasks)

    def _complete(self, sub: SubTask, st: _State) -> bool:
        return (
            ("sql" not in sub.steps or st.queried)
            and ("python" not in sub.steps or st.computed)
            and ("smtp" not in sub.steps or st.emailed)
        )

    # -- the oracle's next step ------------------------------------------------------------------

    def next_gold_call(self) -> tuple[str, dict[str, Any]]:
        """The gold plan's next call from the current state, whatever led here."""
        for sub, st in zip(self.task.subtasks, self.states):
            if not self._complete(sub, st):
                return self._gold_step(sub, st)
        return "finish", {"answer": self.task.gold_answer}

    def _gold_step(self, sub: SubTask, st: _State) -> tuple[str, dict[str, Any]]:
        needs_csv = "python" in sub.steps and not st.computed and "sql" in sub.steps and st.gold_csv is None
        if "sql" in sub.steps and (not st.queried or needs_csv):
            return "sql", {"query": sub.gold_sql}
        if "python" in sub.steps and not st.computed:
            path = st.gold_csv if "sql" in sub.steps else sub.data_path
            assert path is not None
            return "python", {"code": sub.code_for(path)}
        assert sub.email is not None
        args: dict[str, Any] = {"to": list(sub.email.to), "subject": sub.email.subject, "body": sub.email.body}
        if sub.email.cc:
            args["cc"] = list(sub.email.cc)
        if sub.email.attachments:
            args["attachments"] = list(sub.email.attachments)
        return "smtp", args


def email_matches(sub: SubTask, delivered: dict[str, Any]) -> bool:
    spec = sub.email
    if spec is None:
        return False
    to = {str(a).lower() for a in delivered.get("to", [])}
    cc = {str(a).lower() for a in delivered.get("cc", [])}
    # Exactly the required people; the primary recipients must be in To, Cc may go either way.
    if to | cc != {a.lower() for a in spec.to + spec.cc} or not {a.lower() for a in spec.to} <= to:
        return False
    attached = {a.get("path") for a in delivered.get("attachments", []) if isinstance(a, dict)}
    if not set(spec.attachments) <= attached:
        return False
    body = str(delivered.get("body", ""))
    return contains_figure(body, sub.figures, MAX_NUMBERS_EMAIL) and all(contains_name(body, n, 200) for n in sub.names)


def _answer_matches(sub: SubTask, answer: str) -> bool:
    if sub.names:
        return all(contains_name(answer, n) for n in sub.names)
    return contains_figure(answer, sub.figures, MAX_NUMBERS_ANSWER)
