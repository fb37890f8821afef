"""What one sub-task has achieved so far: the state the tools' progress rules read and write."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl_envs.tasks.base import SubTask

__all__ = ["StepState", "ready"]


@dataclass
class StepState:
    """The progress of one sub-task.

    Attributes:
        done: per tool of the sub-task's ``steps``, whether its step holds (``Tool.component``).
        gold_csv: the workspace path of a saved query result that holds the sub-task's gold rows.
        looked_up: a tool result has shown every address of the sub-task's email (the oracle's
            ``staff`` lookup, or any call that found them).
    """

    done: dict[str, bool] = field(default_factory=dict)
    gold_csv: str | None = None
    looked_up: bool = False


def ready(sub: SubTask, state: StepState, tool: str) -> bool:
    """Whether every step of ``sub`` before ``tool``'s holds (steps are done in order)."""
    return all(state.done.get(t, False) for t in sub.steps[: sub.steps.index(tool)])
