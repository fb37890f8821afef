"""The ``smtp`` tool: send one email through the episode's mail service."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agentrl_envs.backends.base import Backend, ToolResponse
from agentrl_envs.tasks.base import SubTask, Task
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.scoring import contains_figure, contains_name
from agentrl_envs.tasks.state import StepState, ready
from agentrl_envs.tools.base import Tool, pick, render_error
from agentrl_envs.tools.perturb import as_list, numbers, shift_numbers

__all__ = ["MAX_NUMBERS_EMAIL", "SMTPTool", "email_matches"]

#: A message's body holds the figure only among its first this many numbers.
MAX_NUMBERS_EMAIL = 12


@dataclass(frozen=True)
class SMTPTool(Tool):
    """Email with To, optional Cc, subject, plain-text body and workspace attachments."""

    name: ClassVar[str] = "smtp"
    description: ClassVar[str] = (
        "Send one plain-text email. The sender is fixed by the environment. Attachments are paths of files in the workspace."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "to": {"type": ["string", "array"], "items": {"type": "string"}, "description": "recipient address(es)"},
            "subject": {"type": "string"},
            "body": {"type": "string"},
            "cc": {"type": "array", "items": {"type": "string"}, "description": "carbon-copy addresses"},
            "attachments": {"type": "array", "items": {"type": "string"}, "description": "workspace file paths"},
        },
        "required": ["to", "subject", "body"],
    }
    aux_term: ClassVar[float | None] = 0.5
    log_names: ClassVar[tuple[str, ...]] = ("smtp", "mail", "email", "send")
    backend_schemes: ClassVar[tuple[str, ...]] = ("smtp://",)
    file_argument: ClassVar[str | None] = "attachments"
    component: ClassVar[str | None] = "emailed"

    def observe(
        self, subs: Sequence[SubTask], states: Sequence[StepState], arguments: dict[str, Any], response: ToolResponse
    ) -> list[int]:
        """An accepted message that matches a sub-task's required email, after its computation, completes it."""
        moved: list[int] = []
        if not response.ok:
            return moved
        for i, (sub, st) in enumerate(zip(subs, states)):
            if self.name in sub.steps and not st.done[self.name] and ready(sub, st, self.name):
                if email_matches(sub, response.result):
                    st.done[self.name] = True
                    moved.append(i)
        return moved

    def gold_call(self, sub: SubTask, state: StepState) -> dict[str, Any] | None:
        if state.done[self.name]:
            return None
        assert sub.email is not None
        args: dict[str, Any] = {"to": list(sub.email.to), "subject": sub.email.subject, "body": sub.email.body}
        if sub.email.cc:
            args["cc"] = list(sub.email.cc)
        if sub.email.attachments:
            args["attachments"] = list(sub.email.attachments)
        return args

    def details(self, response: ToolResponse) -> dict[str, Any]:
        r = response.result
        return {"message_id": r.get("message_id"), "to": r.get("to"), "cc": r.get("cc"), "attachments": r.get("attachments")}

    def perturb(self, task: Task, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """Another recipient, a missing Cc or attachment, shifted figures."""
        domain = DOMAINS[task.domain]
        staff = [s.email for s in domain.staff(task.data.tables)] if task.data is not None else []
        to = list(arguments["to"])
        others = [e for e in staff if e not in to and e not in arguments.get("cc", [])]
        out: list[dict[str, Any]] = []
        if others:
            out.append({**arguments, "to": [others[0], *to[1:]]})
            out.append({**arguments, "to": [*to, others[-1]]})
        if arguments.get("cc"):
            out.append({k: v for k, v in arguments.items() if k != "cc"})
        out.append({**arguments, "body": shift_numbers(arguments["body"])})
        if arguments.get("attachments"):
            out.append({k: v for k, v in arguments.items() if k != "attachments"})
        return out

    def perturb_hard(self, task: Task, arguments: dict[str, Any], context: str) -> list[dict[str, Any]]:
        """To and Cc swapped, the director or a unit's person added, a figure from the context, figures swapped."""
        domain = DOMAINS[task.domain]
        staff = domain.staff(task.data.tables) if task.data is not None else []
        to, cc = list(as_list(arguments["to"])), list(arguments.get("cc", []))
        rest = {key: v for key, v in arguments.items() if key not in ("to", "cc")}
        out: list[dict[str, Any]] = []
        if cc:
            out.append({**rest, "to": cc, "cc": to})
            out.append({**rest, "to": [*to, *cc]})
        for person in staff:
            if person.email in to or person.email in cc:
                continue
            if person.role == "director" or person.unit in context:
                out.append({**arguments, "to": [person.email]})
                out.append({**arguments, "cc": [*cc, person.email]})
        figures = numbers(arguments["body"])
        for other in numbers(context):
            for figure in figures:
                if other != figure and "." in other:
                    out.append({**arguments, "body": arguments["body"].replace(figure, other)})
        if len(figures) == 2:
            a, b = figures
            out.append({**arguments, "body": arguments["body"].replace(a, "\0").replace(b, a).replace("\0", b)})
        return out

    def random_arguments(self, task: Task | None, rng: np.random.Generator, number: float) -> dict[str, Any]:
        domain = DOMAINS[task.domain] if task is not None else DOMAINS["retail"]
        people = [s.email for s in domain.staff(task.data.tables)] if task is not None and task.data else ["x@example.com"]
        to = [pick(rng, people) for _ in range(int(rng.integers(1, 3)))]
        return {"to": sorted(set(to)), "subject": "Update", "body": f"The figure is {number}."}

    def real_backend(self, url: str, **options: Any) -> Backend:
        from agentrl_envs.backends.smtp import SMTPBackend

        return SMTPBackend(url)

    def render(self, response: ToolResponse) -> str:
        if not response.ok:
            return render_error(self.name, response)
        r = response.result
        rcpt = ", ".join(list(r.get("to", [])) + list(r.get("cc", [])))
        extra = f" with {len(r['attachments'])} attachment(s)" if r.get("attachments") else ""
        return f"smtp ok: message {r.get('message_id')} accepted for {rcpt}{extra}"


def email_matches(sub: SubTask, delivered: dict[str, Any]) -> bool:
    """Whether a delivery went to exactly the sub-task's people, with its attachments, figures and names."""
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
