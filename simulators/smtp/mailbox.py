"""A simulated mail server that validates like a strict MTA and records what it delivered.

Messages are built with :class:`email.message.EmailMessage` and the default policy. Addresses and
header values with CR or LF are refused (header injection), as are bare-LF dot lines in the body
(SMTP smuggling), oversize messages and too many recipients. Attachments are files of the episode
workspace; paths that leave it are refused. The env, never the agent, chooses the sender.

The email package decodes RFC 2047 encoded words (``=?utf-8?q?a=0D=0ABcc:_x?=``) when a header is
set, and writes what they decode to: a CR/LF inside one becomes a header line of its own on the
wire. So every value is checked twice, as given and as the email package decodes it (subject,
addresses, attachment names), and the finished message is parsed back from its wire bytes: it must
have exactly the headers that were set, in every part, or it is refused.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import mimetypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

MAX_RECIPIENTS = 20
MAX_SUBJECT_CHARS = 500
MAX_BODY_BYTES = 256 << 10
MAX_MESSAGE_BYTES = 2 << 20
MAX_ATTACHMENTS = 5

# A pragmatic addr-spec: dot-atom local part, a domain with at least one dot, ASCII only.
# Kept over the libraries, measured on this machine: email.headerregistry.Address(addr_spec=...)
# takes 93 us an address against 1.8 us here (51x), and it accepts what a strict MTA refuses
# (``a@localhost``, ``a@-x.com``, ``a@x_y.com``, quoted local parts, domain literals, comments);
# email-validator is not a dependency. tests/simulators/test_smtp.py::test_invalid_addresses lists
# what must be refused. Encoded words still go through the email package below.
_ADDRESS = re.compile(
    r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
    r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
)


class SMTPError(Exception):
    """A message was refused; ``kind`` names why and ``code`` is the SMTP reply code."""

    def __init__(self, kind: str, message: str, code: int = 550) -> None:
        super().__init__(kind, message, code)
        self.kind = kind
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Delivery:
    """A message the server accepted, as the task checker sees it."""

    message_id: str
    sender: str
    to: list[str]
    cc: list[str]
    subject: str
    body: str
    attachments: list[dict[str, Any]]
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "sender": self.sender,
            "to": list(self.to),
            "cc": list(self.cc),
            "subject": self.subject,
            "body": self.body,
            "attachments": [dict(a) for a in self.attachments],
            "size": self.size,
        }


def validate_address(value: Any, field_name: str) -> str:
    """Return a normalized address or raise :class:`SMTPError`."""
    if not isinstance(value, str):
        raise SMTPError("bad_address", f"{field_name}: an address must be a string, got {type(value).__name__}", 501)
    if "\r" in value or "\n" in value:
        raise SMTPError("header_injection", f"{field_name}: CR/LF in an address is refused", 501)
    address = value.strip()
    if len(address) > 254 or not _ADDRESS.match(address):
        shown = address[:80] + ("..." if len(address) > 80 else "")
        raise SMTPError("bad_address", f"{field_name}: {shown!r} is not a valid address (user@example.com)", 501)
    local, _, domain = address.rpartition("@")
    if len(local) > 64:
        raise SMTPError("bad_address", f"{field_name}: local part longer than 64 characters", 501)
    if "=?" in address:
        # The header parser would decode an encoded word here: the To line would then name
        # another address than the envelope, or carry a line break.
        try:
            parsed = [a.addr_spec for a in email.policy.default.header_factory(field_name, address).addresses]
        except (ValueError, TypeError, IndexError) as exc:
            raise SMTPError(
                "header_injection", f"{field_name}: {address[:80]!r} decodes to an invalid header ({exc})", 501
            ) from None
        if parsed != [address]:
            raise SMTPError("bad_address", f"{field_name}: encoded words (=?...?=) are not allowed in an address", 501)
    return f"{local}@{domain.lower()}"


@dataclass
class Mailbox:
    """The server's record of one episode: accepted messages, in order.

    Args:
        sender: the From address (chosen by the env).
        message_prefix: the first part of generated Message-IDs.
        deliver: called with each validated message before it is recorded; a real SMTP backend
            sends it there (and raises :class:`SMTPError` if the server refuses it).
        allowed_domains: recipient domains mail may go to (subdomains included); None allows any.
    """

    sender: str
    message_prefix: str
    deliveries: list[Delivery] = field(default_factory=list)
    deliver: Callable[[EmailMessage, list[str]], None] | None = None
    allowed_domains: tuple[str, ...] | None = None

    def send(
        self,
        workspace: str,
        to: Any,
        subject: Any,
        body: Any,
        cc: Any = None,
        attachments: Any = None,
        files: dict[str, bytes] | None = None,
    ) -> Delivery:
        """Validate and accept one message, or raise :class:`SMTPError`.

        Attachments are read from ``workspace``, or taken from ``files`` (by workspace path)
        when the workspace lives elsewhere.
        """
        to_list = _address_list(to, "to")
        cc_list = _address_list(cc, "cc") if cc is not None else []
        if not to_list:
            raise SMTPError("bad_address", "to: at least one recipient is required", 501)
        recipients = to_list + cc_list
        if len(recipients) > MAX_RECIPIENTS:
            raise SMTPError("too_many_recipients", f"{len(recipients)} recipients; the limit is {MAX_RECIPIENTS}", 452)
        if len(set(recipients)) != len(recipients):
            raise SMTPError("bad_address", "a recipient is listed twice", 501)
        subject_text = _header_text(subject, "subject", MAX_SUBJECT_CHARS)
        body_text = _body_text(body)
        files_data = _attachments(workspace, attachments) if files is None else _given_attachments(files, attachments)

        try:
            msg, meta = self._build(to_list, cc_list, subject_text, body_text, files_data)
            wire = msg.as_bytes()
            check_wire(msg, wire)
        except (ValueError, TypeError, UnicodeError, LookupError) as exc:
            # The checks above should catch everything; the email package has the last word.
            raise SMTPError("bad_message", f"message could not be built: {exc}", 554) from None
        if len(wire) > MAX_MESSAGE_BYTES:
            raise SMTPError("too_large", f"message is {len(wire)} bytes; the limit is {MAX_MESSAGE_BYTES}", 552)
        if self.allowed_domains is not None:
            outside = [r for r in to_list + cc_list if not _domain_allowed(r, self.allowed_domains)]
            if outside:
                allowed = ", ".join(self.allowed_domains) or "none"
                raise SMTPError(
                    "relay_denied", f"relaying to {', '.join(outside[:5])} is not allowed; allowed domains: {allowed}", 550
                )
        if self.deliver is not None:
            self.deliver(msg, to_list + cc_list)
        delivery = Delivery(str(msg["Message-ID"]), self.sender, to_list, cc_list, subject_text, body_text, meta, len(wire))
        self.deliveries.append(delivery)
        return delivery

    def _build(
        self, to_list: list[str], cc_list: list[str], subject_text: str, body_text: str, files: list[tuple[str, bytes]]
    ) -> tuple[EmailMessage, list[dict[str, Any]]]:
        msg = EmailMessage(policy=email.policy.default)
        msg["From"] = self.sender
        msg["To"] = ", ".join(to_list)
        if cc_list:
            msg["Cc"] = ", ".join(cc_list)
        msg["Subject"] = subject_text
        message_id = f"<{self.message_prefix}.{len(self.deliveries) + 1}@agentrl.sim>"
        msg["Message-ID"] = message_id
        msg.set_content(body_text)
        meta = []
        for name, data in files:
            ctype, _ = mimetypes.guess_type(name)
            maintype, subtype = (ctype or "application/octet-stream").split("/", 1)
            msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=os.path.basename(name))
            meta.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        return msg, meta


def _address_list(value: Any, field_name: str) -> list[str]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()] if "," in value else [value]
    if not isinstance(value, list):
        raise SMTPError("bad_address", f"{field_name}: expected an address or a list of addresses", 501)
    if len(value) > MAX_RECIPIENTS:
        raise SMTPError("too_many_recipients", f"{field_name}: {len(value)} recipients; the limit is {MAX_RECIPIENTS}", 452)
    return [validate_address(v, field_name) for v in value]


def _header_text(value: Any, field_name: str, limit: int) -> str:
    if not isinstance(value, str):
        raise SMTPError("bad_header", f"{field_name}: expected a string, got {type(value).__name__}", 501)
    if len(value) > limit:
        raise SMTPError("too_large", f"{field_name}: {len(value)} characters; the limit is {limit}", 552)
    _check_line(value, field_name, "")
    if "=?" in value:
        try:
            decoded = str(email.policy.default.header_factory(field_name, value))
        except (ValueError, TypeError, IndexError, LookupError) as exc:
            raise SMTPError("bad_header", f"{field_name}: could not decode its encoded words ({exc})", 501) from None
        _check_line(decoded, field_name, " (after decoding its =?charset?q/b?...?= encoded words)")
    return value


def _check_line(text: str, field_name: str, where: str) -> None:
    """Refuse line breaks and control characters in one header value (tab allowed)."""
    if "\r" in text or "\n" in text:
        raise SMTPError("header_injection", f"{field_name}: CR/LF in a header is refused{where}", 501)
    if any((ord(c) < 32 and c != "\t") or c == "\x7f" or 0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise SMTPError("bad_header", f"{field_name}: control characters are not allowed{where}", 501)
    if len(text.splitlines()) > 1:
        raise SMTPError("header_injection", f"{field_name}: Unicode line breaks in a header are refused{where}", 501)


def _check_attachment_name(name: str) -> None:
    """An attachment's file name goes into a Content-Disposition header: same rules as a header."""
    base = os.path.basename(name)
    try:
        _header_text(base, f"attachment {name[:80]!r}", 255)
        if "\t" in base:
            raise SMTPError("bad_header", f"attachment {name[:80]!r}: control characters are not allowed", 501)
    except SMTPError as exc:
        raise SMTPError("bad_attachment", f"{exc.message}; rename the file", 501) from None


def check_wire(msg: EmailMessage, wire: bytes) -> None:
    """Refuse ``wire`` unless, read back, it has exactly the headers set on ``msg``, in every part.

    Raises:
        SMTPError: ``header_injection`` (554) naming the headers a value smuggled in.
    """
    parsed = email.message_from_bytes(wire, policy=email.policy.default)
    built_parts, wire_parts = list(msg.walk()), list(parsed.walk())
    if len(built_parts) != len(wire_parts):
        raise SMTPError("header_injection", "the message's MIME structure changed on the wire; refusing it", 554)
    for built, sent in zip(built_parts, wire_parts):
        expected = [k.lower() for k in built.keys()]
        found = [k.lower() for k in sent.keys()]
        if found != expected:
            extra = sorted(set(found) - set(expected)) or found
            raise SMTPError("header_injection", f"a header value would add header(s) {extra[:5]} on the wire; refusing it", 554)


def _body_text(value: Any) -> str:
    if not isinstance(value, str):
        raise SMTPError("bad_body", f"body: expected a string, got {type(value).__name__}", 501)
    encoded = value.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_BODY_BYTES:
        raise SMTPError("too_large", f"body is {len(encoded)} bytes; the limit is {MAX_BODY_BYTES}", 552)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SMTPError("bad_body", "body contains lone surrogates and is not valid Unicode text", 501) from None
    if "\x00" in value:
        raise SMTPError("bad_body", "body contains NUL characters", 501)
    normalized = value.replace("\r\n", "\n")
    if "\r" in normalized:
        raise SMTPError("smuggling", "body contains a bare CR; line ends must be LF or CRLF", 501)
    if re.search(r"(^|\n)\.(\r?\n|$)", value) or "\n.\r" in value:
        raise SMTPError("smuggling", "body contains a line with a single '.', which ends an SMTP message", 501)
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _domain_allowed(address: str, allowed: tuple[str, ...]) -> bool:
    domain = address.rpartition("@")[2].lower()
    return any(domain == d or domain.endswith("." + d) for d in allowed)


def _attachment_names(value: Any) -> list[str]:
    """The attachments argument as a list of names, or SMTPError."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SMTPError("bad_attachment", "attachments: expected a list of workspace paths", 501)
    if len(value) > MAX_ATTACHMENTS:
        raise SMTPError("too_large", f"{len(value)} attachments; the limit is {MAX_ATTACHMENTS}", 552)
    return value


def _given_attachments(files: dict[str, bytes], value: Any) -> list[tuple[str, bytes]]:
    out = []
    for name in _attachment_names(value):
        norm = os.path.normpath(name) if name and "\x00" not in name else ""
        if not norm or norm.startswith("..") or os.path.isabs(norm) or not _encodable(name):
            raise SMTPError("bad_attachment", f"attachment {name[:80]!r} is outside the workspace", 550)
        _check_attachment_name(name)
        if name not in files:
            raise SMTPError("bad_attachment", f"attachment {name[:80]!r} does not exist in the workspace", 550)
        if len(files[name]) > MAX_MESSAGE_BYTES:
            raise SMTPError("too_large", f"attachment {name[:80]!r} is larger than {MAX_MESSAGE_BYTES} bytes", 552)
        out.append((norm, files[name]))
    return out


def _attachments(workspace: str, value: Any) -> list[tuple[str, bytes]]:
    names = _attachment_names(value)
    if not names:
        return []
    root = os.path.realpath(workspace)
    files = []
    for name in names:
        if not name or "\x00" in name or len(name) > 255 or not _encodable(name):
            raise SMTPError("bad_attachment", f"attachment path {name[:80]!r} is not valid", 501)
        _check_attachment_name(name)
        full = os.path.realpath(os.path.join(root, name))
        if os.path.commonpath([root, full]) != root or full == root:
            raise SMTPError("bad_attachment", f"attachment {name[:80]!r} is outside the workspace", 550)
        if not os.path.isfile(full):
            raise SMTPError("bad_attachment", f"attachment {name[:80]!r} does not exist in the workspace", 550)
        if os.path.getsize(full) > MAX_MESSAGE_BYTES:
            raise SMTPError("too_large", f"attachment {name[:80]!r} is larger than {MAX_MESSAGE_BYTES} bytes", 552)
        try:
            with open(full, "rb") as f:
                files.append((os.path.relpath(full, root), f.read()))
        except OSError as exc:  # unreadable: the agent's own doing
            raise SMTPError("bad_attachment", f"attachment {name[:80]!r} could not be read ({exc.strerror})", 550) from None
    return files
