"""The ``smtp`` tool: send one email through the episode's mail service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.tools.base import Tool, render_error

__all__ = ["SMTPTool"]


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

    def render(self, response: ToolResponse) -> str:
        if not response.ok:
            return render_error(self.name, response)
        r = response.result
        rcpt = ", ".join(list(r.get("to", [])) + list(r.get("cc", [])))
        extra = f" with {len(r['attachments'])} attachment(s)" if r.get("attachments") else ""
        return f"smtp ok: message {r.get('message_id')} accepted for {rcpt}{extra}"
