"""``backend={"smtp": "smtp://host:port"}``: mail through a real SMTP server with ``smtplib``.

Messages are validated and built exactly as the simulator does (``email.message.EmailMessage``
with the default policy; CR/LF and bare-LF smuggling refused, in encoded words too; recipient and
size caps), then flattened once with CRLF line ends, checked again as those bytes read back (no
header may appear that was not set), and those same bytes are sent with ``smtplib``. The env chooses the host and the sender; the agent only fills in the message.
A refused recipient or message comes back as a tool error with the server's reply; a server that
cannot be reached or drops the connection comes back as a ``connection_reset`` / ``timeout`` fault.
"""

from __future__ import annotations

import io
import smtplib
from email.generator import BytesGenerator
from email.message import EmailMessage
from urllib.parse import urlsplit

from agentrl_envs.backends.base import EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError
from simulators.smtp import Mailbox, SMTPError, check_wire

__all__ = ["SMTPBackend"]


class _Unreachable(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.kind, self.message = kind, message


class SMTPBackend:
    """Sends the ``smtp`` tool's mail to ``smtp://host:port``.

    Args:
        url: ``smtp://host:port`` (no TLS; put a relay in front for anything else).
        timeout_s: timeout of every network operation.
    """

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        parts = urlsplit(url)
        try:
            port = parts.port or 25
        except ValueError:
            raise ConfigError(f"backend URL {url[:200]!r}: the port is not a number in 0-65535") from None
        if parts.scheme != "smtp" or not parts.hostname:
            raise ConfigError(f"backend URL {url[:200]!r}: expected smtp://host:port")
        self.host, self.port, self.timeout_s = parts.hostname, port, timeout_s
        self._mailboxes: dict[str, Mailbox] = {}

    def open_episode(self, setup: EpisodeSetup) -> None:
        self._mailboxes[setup.episode_id] = Mailbox(setup.sender, "msg", deliver=self._send, allowed_domains=setup.mail_domains)

    def handle(self, request: ToolRequest) -> ToolResponse:
        mailbox = self._mailboxes.get(request.episode_id)
        if request.tool != "smtp":
            return ToolResponse(
                ok=False, status=404, error_type="unknown_tool", error=f"this backend serves smtp, not {request.tool!r}"
            )
        if mailbox is None:
            return ToolResponse(
                ok=False, status=404, error_type="unknown_episode", error=f"no open episode {request.episode_id[:64]!r}"
            )
        args = request.arguments
        unknown = set(args) - {"to", "subject", "body", "cc", "attachments"}
        if unknown:
            return ToolResponse(ok=False, status=422, error_type="bad_arguments", error=f"unknown fields {sorted(unknown)}")
        try:
            delivery = mailbox.send(
                "",
                args.get("to"),
                args.get("subject"),
                args.get("body"),
                cc=args.get("cc"),
                attachments=args.get("attachments"),
                files=request.files or {},
            )
        except SMTPError as exc:
            return ToolResponse(ok=False, status=422, result={"smtp_code": exc.code}, error_type=exc.kind, error=exc.message)
        except _Unreachable as exc:
            status = 504 if exc.kind == "timeout" else 599
            return ToolResponse(
                ok=False,
                status=status,
                error_type=exc.kind,
                error=exc.message,
                fault={"type": exc.kind, "status": status, "origin": "service"},
            )
        return ToolResponse(ok=True, status=200, result=delivery.as_dict())

    def _send(self, message: EmailMessage, recipients: list[str]) -> None:
        where = f"{self.host}:{self.port}"
        # Exactly the bytes that were checked go out (send_message would flatten the message again).
        buffer = io.BytesIO()
        BytesGenerator(buffer, policy=message.policy).flatten(message, linesep="\r\n")
        data = buffer.getvalue()
        check_wire(message, data)
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as client:
                client.sendmail(str(message["From"]), recipients, data)
        except smtplib.SMTPRecipientsRefused as exc:
            refused = ", ".join(f"{a} ({code})" for a, (code, _) in exc.recipients.items())
            raise SMTPError("rejected", f"the mail server refused the recipient(s) {refused}", 550) from None
        except smtplib.SMTPResponseException as exc:
            text = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
            raise SMTPError("rejected", f"the mail server answered {exc.smtp_code}: {text[:300]}", exc.smtp_code) from None
        except TimeoutError:
            raise _Unreachable("timeout", f"no answer from the mail server at {where} within {self.timeout_s:g} s") from None
        except (OSError, smtplib.SMTPException) as exc:
            raise _Unreachable("connection_reset", f"cannot deliver through {where}: {type(exc).__name__}: {exc}") from None

    def close_episode(self, episode_id: str) -> None:
        self._mailboxes.pop(episode_id, None)

    def close(self) -> None:
        self._mailboxes.clear()
