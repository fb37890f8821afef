"""The ``smtp`` tool's route: send one email, validated like a strict mail server."""

from __future__ import annotations

from typing import Any

from simulators.routes import Reply, ToolRoute, err, ok
from simulators.smtp.server import SMTPError

__all__ = ["ROUTE"]

_FIELDS = {"to", "subject", "body", "cc", "attachments"}


def handle(app: Any, episode: Any, payload: dict[str, Any]) -> Reply:
    """Deliver the message to the episode's mailbox (attachments are read from its workspace)."""
    unknown = set(payload) - _FIELDS
    if unknown:
        return err(422, "bad_arguments", f"unknown fields {sorted(unknown)}")
    try:
        delivery = episode.mailbox.send(
            episode.workspace,
            payload.get("to"),
            payload.get("subject"),
            payload.get("body"),
            cc=payload.get("cc"),
            attachments=payload.get("attachments"),
        )
    except SMTPError as exc:
        return err(422, exc.kind, exc.message, smtp_code=exc.code)
    return ok(delivery.as_dict())


ROUTE = ToolRoute(
    name="smtp",
    summary="send one email (validated like a strict mail server)",
    handler=handle,
    request={
        "type": "object",
        "required": ["to", "subject", "body"],
        "properties": {
            "to": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "cc": {"type": "array", "items": {"type": "string"}},
            "subject": {"type": "string"},
            "body": {"type": "string"},
            "attachments": {"type": "array", "items": {"type": "string"}},
        },
    },
    result={
        "message_id": {"type": "string"},
        "sender": {"type": "string"},
        "to": {"type": "array"},
        "cc": {"type": "array"},
        "subject": {"type": "string"},
        "body": {"type": "string"},
        "attachments": {"type": "array"},
        "size": {"type": "integer"},
    },
    result_name="Delivery",
    errors=(401, 403, 404, 422, 429, 500, 503),
)
