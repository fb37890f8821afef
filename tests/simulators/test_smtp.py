"""The simulated mail service: what it accepts, what it records, and everything it refuses."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators.smtp import Delivery, Mailbox, SMTPError, validate_address
from simulators.smtp.mailbox import MAX_ATTACHMENTS, MAX_BODY_BYTES, MAX_RECIPIENTS, MAX_SUBJECT_CHARS

SENDER = "agent@agentrl.example"


@pytest.fixture
def mailbox() -> Mailbox:
    return Mailbox(SENDER, "ep1")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "results").mkdir(parents=True)
    (ws / "results" / "q1.csv").write_bytes(b"region,total\nnorth,1120.5\n")
    (ws / "report.txt").write_text("Quarterly report\n", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("host secret\n", encoding="utf-8")
    return ws


def _send(mailbox: Mailbox, workspace: Path, **kw: Any) -> Delivery:
    kw.setdefault("to", "bob@example.com")
    kw.setdefault("subject", "Report")
    kw.setdefault("body", "Hello Bob,\nthe total is 1120.5.\n")
    return mailbox.send(str(workspace), **kw)


def _refused(mailbox: Mailbox, workspace: Path, **kw: Any) -> SMTPError:
    before = len(mailbox.deliveries)
    with pytest.raises(SMTPError) as info:
        _send(mailbox, workspace, **kw)
    assert len(mailbox.deliveries) == before, "a refused message must not be recorded"
    return info.value


# -- accepted messages -----------------------------------------------------------------------------


def test_accepted_message_fields(mailbox: Mailbox, workspace: Path) -> None:
    d = _send(
        mailbox,
        workspace,
        to=["Bob@Example.COM", "carol@example.org"],
        cc=["dave@example.net"],
        subject="Q3 totals",
        body="Hi all,\nnorth: 1,120.50\n",
    )
    assert d.message_id == "<ep1.1@agentrl.sim>"
    assert d.sender == SENDER
    assert d.to == ["Bob@example.com", "carol@example.org"]  # domain lower-cased, local part kept
    assert d.cc == ["dave@example.net"]
    assert d.subject == "Q3 totals"
    assert d.body == "Hi all,\nnorth: 1,120.50\n"
    assert d.attachments == []
    assert d.size > len(d.body)
    assert mailbox.deliveries == [d]
    assert d.as_dict() == {
        "message_id": "<ep1.1@agentrl.sim>",
        "sender": SENDER,
        "to": ["Bob@example.com", "carol@example.org"],
        "cc": ["dave@example.net"],
        "subject": "Q3 totals",
        "body": "Hi all,\nnorth: 1,120.50\n",
        "attachments": [],
        "size": d.size,
    }


def test_message_ids_count_up(mailbox: Mailbox, workspace: Path) -> None:
    ids = [_send(mailbox, workspace).message_id for _ in range(3)]
    assert ids == ["<ep1.1@agentrl.sim>", "<ep1.2@agentrl.sim>", "<ep1.3@agentrl.sim>"]


def test_to_as_comma_separated_string(mailbox: Mailbox, workspace: Path) -> None:
    d = _send(mailbox, workspace, to="a@example.com, b@example.com")
    assert d.to == ["a@example.com", "b@example.com"]
    assert _send(mailbox, workspace, to="  c@example.com  ").to == ["c@example.com"]


def test_unicode_subject_and_body(mailbox: Mailbox, workspace: Path) -> None:
    d = _send(mailbox, workspace, subject="Résumé ✅ 売上", body="Grüße 👋\r\nzweite Zeile\n..dots ok\n")
    assert d.subject == "Résumé ✅ 売上"
    assert d.body == "Grüße 👋\r\nzweite Zeile\n..dots ok\n"


def test_limits_are_inclusive(mailbox: Mailbox, workspace: Path) -> None:
    to = [f"u{i}@example.com" for i in range(MAX_RECIPIENTS - 2)]
    cc = ["c1@example.com", "c2@example.com"]
    d = _send(mailbox, workspace, to=to, cc=cc, subject="s" * MAX_SUBJECT_CHARS, body="b" * MAX_BODY_BYTES)
    assert len(d.to) + len(d.cc) == MAX_RECIPIENTS


# -- header injection and smuggling ----------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("to", "bob@example.com\r\nBcc: eve@evil.com"),
        ("to", ["bob@example.com\nBcc: eve@evil.com"]),
        ("to", ["bob@example.com", "x@example.com\r"]),
        ("cc", ["carol@example.com\r\nBcc: eve@evil.com"]),
        ("cc", ["\ncarol@example.com"]),
        ("subject", "Hello\r\nBcc: eve@evil.com"),
        ("subject", "Hello\nX-Injected: 1"),
        ("subject", "Hello\r"),
    ],
)
def test_crlf_in_headers_is_header_injection(mailbox: Mailbox, workspace: Path, field: str, value: Any) -> None:
    err = _refused(mailbox, workspace, **{field: value})
    assert err.kind == "header_injection"
    assert err.code == 501


@pytest.mark.parametrize("subject", ["a\x00b", "a\x1bb", "a\x7fb", "a\x0bb"])
def test_control_characters_in_subject(mailbox: Mailbox, workspace: Path, subject: str) -> None:
    assert _refused(mailbox, workspace, subject=subject).kind == "bad_header"


@pytest.mark.parametrize("subject", ["a\u2028Bcc: eve@evil.com", "a\u2029b", "a\x85b", "a\ud800b"])
def test_unicode_line_breaks_and_surrogates_in_subject_are_refused(mailbox: Mailbox, workspace: Path, subject: str) -> None:
    _refused(mailbox, workspace, subject=subject)


@pytest.mark.parametrize(
    "body",
    [
        "Hi\n.\nMAIL FROM:<eve@evil.com>\n",
        "Hi\r\n.\r\nRCPT TO:<eve@evil.com>",
        "Hi\n.\r\nDATA",
        ".\nstarts with a dot line",
        "ends with a dot line\n.",
        ".",
    ],
)
def test_lone_dot_lines_are_smuggling(mailbox: Mailbox, workspace: Path, body: str) -> None:
    assert _refused(mailbox, workspace, body=body).kind == "smuggling"


@pytest.mark.parametrize("body", ["a\rb", "a\r.\rb", "Hi\r"])
def test_bare_cr_is_smuggling(mailbox: Mailbox, workspace: Path, body: str) -> None:
    assert _refused(mailbox, workspace, body=body).kind == "smuggling"


@pytest.mark.parametrize("body", ["x\n..\ny", "x\n. \ny", "x\n.a\ny", "3.5\n"])
def test_dots_that_are_not_lone_lines_are_fine(mailbox: Mailbox, workspace: Path, body: str) -> None:
    assert _send(mailbox, workspace, body=body).body == body


# -- recipients ------------------------------------------------------------------------------------


def test_too_many_recipients_in_to(mailbox: Mailbox, workspace: Path) -> None:
    err = _refused(mailbox, workspace, to=[f"u{i}@example.com" for i in range(MAX_RECIPIENTS + 1)])
    assert err.kind == "too_many_recipients"
    assert err.code == 452


def test_too_many_recipients_in_to_and_cc(mailbox: Mailbox, workspace: Path) -> None:
    to = [f"u{i}@example.com" for i in range(MAX_RECIPIENTS // 2 + 1)]
    cc = [f"c{i}@example.com" for i in range(MAX_RECIPIENTS // 2)]
    assert _refused(mailbox, workspace, to=to, cc=cc).kind == "too_many_recipients"


@pytest.mark.parametrize(
    "to, cc",
    [
        (["a@example.com", "a@example.com"], None),
        (["a@example.com", "a@EXAMPLE.com"], None),
        (["a@example.com"], ["a@example.com"]),
        ("a@example.com, a@example.com", None),
    ],
)
def test_duplicate_recipient(mailbox: Mailbox, workspace: Path, to: Any, cc: Any) -> None:
    err = _refused(mailbox, workspace, to=to, cc=cc)
    assert err.kind == "bad_address"
    assert "twice" in err.message


@pytest.mark.parametrize("to", [[], "", " , ", ","])
def test_at_least_one_recipient(mailbox: Mailbox, workspace: Path, to: Any) -> None:
    assert _refused(mailbox, workspace, to=to).kind == "bad_address"


@pytest.mark.parametrize(
    "address",
    [
        "",
        "plain",
        "@example.com",
        "bob@",
        "bob@localhost",
        "bob@@example.com",
        "bob smith@example.com",
        "<bob@example.com>",
        "Bob <bob@example.com>",
        "bob@example.com>",
        "bob@-example.com",
        "bob@example-.com",
        "bob@example..com",
        ".bob@example.com",
        "bob.@example.com",
        "bo..b@example.com",
        "böb@example.com",
        "bob@exämple.com",
        "bob@example.com\x00",
        "bob@exa_mple.com",
        '"bob"@example.com',
        "bob@[127.0.0.1]",  # a domain literal: email.headerregistry accepts it, a strict MTA here does not
        "bob@example.com (Bob)",  # a comment: likewise
        "x" * 65 + "@example.com",
        "bob@" + "a" * 250 + ".com",
        "bob@" + "a" * 64 + ".com",
    ],
)
def test_invalid_addresses(mailbox: Mailbox, workspace: Path, address: str) -> None:
    with pytest.raises(SMTPError) as info:
        validate_address(address, "to")
    assert info.value.kind == "bad_address"
    assert info.value.code == 501
    assert _refused(mailbox, workspace, to=[address]).kind == "bad_address"
    assert _refused(mailbox, workspace, cc=[address]).kind == "bad_address"


@pytest.mark.parametrize(
    "address, normalized",
    [
        ("bob@example.com", "bob@example.com"),
        ("Bob.Smith+tag@Mail.Example.CO.UK", "Bob.Smith+tag@mail.example.co.uk"),
        ("  bob@example.com\t", "bob@example.com"),
        ("o'hara@example.ie", "o'hara@example.ie"),
        ("x" * 64 + "@example.com", "x" * 64 + "@example.com"),
    ],
)
def test_valid_addresses(address: str, normalized: str) -> None:
    assert validate_address(address, "to") == normalized


@pytest.mark.parametrize("value", [None, 5, b"bob@example.com", ["bob@example.com"], {"to": "x"}])
def test_address_must_be_a_string(value: Any) -> None:
    with pytest.raises(SMTPError) as info:
        validate_address(value, "to")
    assert info.value.kind == "bad_address"


_LINE_BREAK = st.sampled_from(["\r", "\n", "\r\n", "\n\r"])


@settings(max_examples=200, deadline=None)
@given(before=st.text(max_size=40), brk=_LINE_BREAK, after=st.text(max_size=40))
def test_any_text_with_cr_or_lf_is_refused_as_an_address(before: str, brk: str, after: str) -> None:
    value = before + brk + after
    with pytest.raises(SMTPError) as info:
        validate_address(value, "to")
    assert info.value.kind == "header_injection"


@settings(max_examples=100, deadline=None)
@given(local=st.sampled_from(["bob", "a.b", "x+y"]), brk=_LINE_BREAK, tail=st.sampled_from(["", "Bcc: eve@evil.com", " "]))
def test_crlf_around_a_valid_address_is_still_refused(local: str, brk: str, tail: str, tmp_path_factory: Any) -> None:
    address = f"{local}@example.com{brk}{tail}"
    with pytest.raises(SMTPError) as info:
        validate_address(address, "cc")
    assert info.value.kind == "header_injection"
    mailbox = Mailbox(SENDER, "h")
    with pytest.raises(SMTPError) as info:
        mailbox.send(str(tmp_path_factory.getbasetemp()), [address], "s", "b")
    assert info.value.kind == "header_injection"
    assert mailbox.deliveries == []


# -- attachments -----------------------------------------------------------------------------------


def test_attachment_inside_workspace(mailbox: Mailbox, workspace: Path) -> None:
    data = (workspace / "results" / "q1.csv").read_bytes()
    d = _send(mailbox, workspace, attachments=["results/q1.csv", "./report.txt"])
    assert d.attachments == [
        {"path": "results/q1.csv", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
        {
            "path": "report.txt",
            "size": len(b"Quarterly report\n"),
            "sha256": hashlib.sha256(b"Quarterly report\n").hexdigest(),
        },
    ]
    assert d.size > len(data)


def test_attachment_path_normalized_inside_workspace(mailbox: Mailbox, workspace: Path) -> None:
    d = _send(mailbox, workspace, attachments=["results/../report.txt"])
    assert d.attachments[0]["path"] == "report.txt"


def test_symlink_inside_workspace_is_accepted(mailbox: Mailbox, workspace: Path) -> None:
    os.symlink(workspace / "report.txt", workspace / "link.txt")
    d = _send(mailbox, workspace, attachments=["link.txt"])
    assert d.attachments[0]["path"] == "report.txt"
    assert d.attachments[0]["sha256"] == hashlib.sha256(b"Quarterly report\n").hexdigest()


@pytest.mark.parametrize(
    "path",
    ["../secret.txt", "results/../../secret.txt", "/etc/passwd", "ABSOLUTE", ".", "", "results/.."],
)
def test_attachment_outside_workspace_is_refused(mailbox: Mailbox, workspace: Path, path: str) -> None:
    if path == "ABSOLUTE":
        path = str(workspace.parent / "secret.txt")
    err = _refused(mailbox, workspace, attachments=[path])
    assert err.kind == "bad_attachment"


def test_symlink_pointing_outside_is_refused(mailbox: Mailbox, workspace: Path) -> None:
    os.symlink(workspace.parent / "secret.txt", workspace / "innocent.txt")
    os.symlink(workspace.parent, workspace / "up")
    assert _refused(mailbox, workspace, attachments=["innocent.txt"]).kind == "bad_attachment"
    assert _refused(mailbox, workspace, attachments=["up/secret.txt"]).kind == "bad_attachment"
    err = _refused(mailbox, workspace, attachments=["innocent.txt"])
    assert "outside" in err.message


@pytest.mark.parametrize("path", ["missing.csv", "results", "results/q2.csv", "a\x00b"])
def test_missing_attachment_is_refused(mailbox: Mailbox, workspace: Path, path: str) -> None:
    assert _refused(mailbox, workspace, attachments=[path]).kind == "bad_attachment"


def test_attachment_path_with_lone_surrogate_is_refused(mailbox: Mailbox, workspace: Path) -> None:
    assert _refused(mailbox, workspace, attachments=["report\ud800.txt"]).kind == "bad_attachment"


@pytest.mark.parametrize("attachments", ["report.txt", [1], ["report.txt", None], {"report.txt": 1}])
def test_attachments_must_be_a_list_of_paths(mailbox: Mailbox, workspace: Path, attachments: Any) -> None:
    assert _refused(mailbox, workspace, attachments=attachments).kind == "bad_attachment"


def test_too_many_attachments(mailbox: Mailbox, workspace: Path) -> None:
    err = _refused(mailbox, workspace, attachments=["report.txt"] * (MAX_ATTACHMENTS + 1))
    assert err.kind == "too_large"


# -- body ------------------------------------------------------------------------------------------


def test_oversize_body_is_refused(mailbox: Mailbox, workspace: Path) -> None:
    err = _refused(mailbox, workspace, body="x" * (MAX_BODY_BYTES + 1))
    assert err.kind == "too_large"
    assert err.code == 552
    # The limit is in UTF-8 bytes, not characters.
    assert _refused(mailbox, workspace, body="é" * (MAX_BODY_BYTES // 2 + 1)).kind == "too_large"


def test_oversize_subject_is_refused(mailbox: Mailbox, workspace: Path) -> None:
    assert _refused(mailbox, workspace, subject="s" * (MAX_SUBJECT_CHARS + 1)).kind == "too_large"


@pytest.mark.parametrize("body", ["\ud800", "ok \udfff end", "a\udc80"])
def test_lone_surrogate_body_is_refused(mailbox: Mailbox, workspace: Path, body: str) -> None:
    assert _refused(mailbox, workspace, body=body).kind == "bad_body"


def test_nul_in_body_is_refused(mailbox: Mailbox, workspace: Path) -> None:
    assert _refused(mailbox, workspace, body="a\x00b").kind == "bad_body"


# -- types -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, kind",
    [
        ("to", None, "bad_address"),
        ("to", 5, "bad_address"),
        ("to", {"bob@example.com": 1}, "bad_address"),
        ("to", [["bob@example.com"]], "bad_address"),
        ("to", [None], "bad_address"),
        ("cc", "carol@example.com", None),  # a string cc is accepted like a string to
        ("cc", 5, "bad_address"),
        ("subject", None, "bad_header"),
        ("subject", 5, "bad_header"),
        ("subject", b"hi", "bad_header"),
        ("body", None, "bad_body"),
        ("body", b"hello", "bad_body"),
        ("body", ["hello"], "bad_body"),
    ],
)
def test_non_str_types_are_refused(mailbox: Mailbox, workspace: Path, field: str, value: Any, kind: str | None) -> None:
    if kind is None:
        assert _send(mailbox, workspace, **{field: value}).cc == ["carol@example.com"]
        return
    assert _refused(mailbox, workspace, **{field: value}).kind == kind


def test_smtp_error_carries_kind_message_and_code() -> None:
    err = SMTPError("bad_address", "nope", 501)
    assert str(err) == "nope"
    assert (err.kind, err.message, err.code) == ("bad_address", "nope", 501)
    assert SMTPError("x", "y").code == 550


# -- RFC 2047 encoded words ------------------------------------------------------------------------

_INJECTED = "Reply-To: x@evil.example"
#: (encoded text, what it decodes to) for q and b encodings, upper and lower case, split words.
ENCODED_BREAKS = [
    "=?utf-8?q?Hi=0D=0AReply-To:_x@evil.example=0D=0ABcc:_y@evil.example?=",
    "=?UTF-8?Q?Hi=0D=0AReply-To:_x@evil.example?=",
    "=?Utf-8?q?Hi=0AReply-To:_x@evil.example?=",
    "=?utf-8?q?Hi=0DReply-To:_x@evil.example?=",
    "=?utf-8?b?SGkNClJlcGx5LVRvOiB4QGV2aWwuZXhhbXBsZQ==?=",
    "=?UTF-8?B?SGkKUmVwbHktVG86IHhAZXZpbC5leGFtcGxl?=",
    "=?iso-8859-1?q?Hi=0D=0AReply-To:_x@evil.example?=",
    "Report =?utf-8?q?a?= =?utf-8?q?=0D=0AReply-To:_x@evil.example?=",
    "=?utf-8?q?a=E2=80=A8Reply-To:_x@evil.example?=",  # U+2028 LINE SEPARATOR
    "=?utf-8?q?a=C2=85Reply-To:_x@evil.example?=",  # U+0085 NEXT LINE
    "=?utf-8*en?q?Hi=0D=0AReply-To:_x@evil.example?=",  # RFC 2231 language tag
]
ENCODED_CONTROLS = ["=?utf-8?q?a=00b?=", "=?utf-8?q?a=1Bb?=", "=?utf-8?b?YQdi?=", "=?utf-8?q?a=7Fb?="]


@pytest.mark.parametrize("subject", ENCODED_BREAKS)
def test_encoded_words_that_decode_to_line_breaks_are_refused(mailbox: Mailbox, workspace: Path, subject: str) -> None:
    err = _refused(mailbox, workspace, subject=subject)
    assert err.kind == "header_injection", err.message
    assert "encoded words" in err.message


@pytest.mark.parametrize("subject", ENCODED_CONTROLS)
def test_encoded_words_that_decode_to_control_characters_are_refused(mailbox: Mailbox, workspace: Path, subject: str) -> None:
    assert _refused(mailbox, workspace, subject=subject).kind == "bad_header"


@pytest.mark.parametrize("subject", ["=?utf-8?q?Caf=C3=A9_menu?=", "=?utf-8?b?Q2Fmw6k=?= report", "a =? b ?= c", "=?bogus"])
def test_harmless_encoded_words_are_accepted(mailbox: Mailbox, workspace: Path, subject: str) -> None:
    d = _send(mailbox, workspace, subject=subject)
    assert d.subject == subject


@pytest.mark.parametrize("field", ["to", "cc"])
@pytest.mark.parametrize(
    "address",
    [
        "=?utf-8?q?a=0D=0ABcc=3Ax?=@example.com",
        "=?UTF-8?B?YQ0KQmNjOiB4?=@example.com",
        "=?utf-8?q?a?=@example.com",  # would put a@example.com in the header, another address on the envelope
    ],
)
def test_encoded_words_in_addresses_are_refused(mailbox: Mailbox, workspace: Path, field: str, address: str) -> None:
    kw: dict[str, Any] = {field: [address]}
    if field == "cc":
        kw["to"] = "bob@example.com"
    assert _refused(mailbox, workspace, **kw).kind in ("header_injection", "bad_address")


@pytest.mark.parametrize(
    "name",
    [
        "=?utf-8?q?r=0D=0AX-Evil:_1?=.csv",
        "=?UTF-8?B?cg0KWC1FdmlsOiAx?=.csv",
        "=?utf-8?Q?r=0AX-Evil:_1?=",
        "r\x01.csv",
        "r\x1b[31m.csv",
        "r\t.csv",
        "r\u2028x.csv",
    ],
)
def test_attachment_names_that_would_inject_headers_are_refused(mailbox: Mailbox, workspace: Path, name: str) -> None:
    (workspace / "results" / name).write_bytes(b"a,b\n1,2\n")
    err = _refused(mailbox, workspace, attachments=[f"results/{name}"])
    assert err.kind == "bad_attachment", err.message
    # The same names given as files (a mounted mail backend) are refused the same way.
    err = _refused(mailbox, workspace, attachments=[f"results/{name}"], files={f"results/{name}": b"a,b\n"})
    assert err.kind == "bad_attachment", err.message


def test_wire_check_catches_any_header_the_message_did_not_set() -> None:
    import email.policy
    from email.message import EmailMessage

    from simulators.smtp import check_wire

    msg = EmailMessage(policy=email.policy.default)
    msg["From"], msg["To"], msg["Subject"] = SENDER, "bob@example.com", "ok"
    msg.set_content("hi")
    wire = msg.as_bytes()
    check_wire(msg, wire)
    forged = wire.replace(b"Subject: ok\n", b"Subject: ok\nBcc: x@evil.example\n")
    with pytest.raises(SMTPError) as info:
        check_wire(msg, forged)
    assert info.value.kind == "header_injection" and "bcc" in info.value.message


# -- the same attacks against a real SMTP server ---------------------------------------------------


@pytest.fixture
def real_smtp() -> Any:
    from tests.integration.servers import smtp_server

    with smtp_server() as server:
        yield server


def _headers(envelope: Any) -> list[list[str]]:
    import email as email_pkg
    import email.policy

    parsed = email_pkg.message_from_bytes(envelope.original_content, policy=email.policy.default)
    return [[k.lower() for k in part.keys()] for part in parsed.walk()]


@pytest.mark.integration
def test_real_server_gets_no_injected_headers(real_smtp: tuple[str, list[Any]], tmp_path: Path) -> None:
    import json

    import gymnasium as gym

    import agentrl_envs  # noqa: F401

    url, received = real_smtp
    env = gym.make("AgentRL/SMTP-v0", backend={"default": "sim", "smtp": url}, mail_domains=None, max_steps=40)
    try:
        obs, info = env.reset(seed=0)
        to = "bob@example.com"
        attacks: list[dict[str, Any]] = [{"subject": s} for s in ENCODED_BREAKS]
        attacks += [{"to": ["=?utf-8?q?a=0D=0ABcc=3Ax?=@example.com"]}, {"cc": ["=?utf-8?q?a?=@example.com"]}]
        attacks += [{"attachments": ["results/r\x01.csv"]}, {"attachments": ["results/=?utf-8?q?r=0D=0AX-Evil:_1?=.csv"]}]
        for attack in attacks:
            args = {"to": [to], "subject": "Report", "body": "Hello\n", **attack}
            obs, reward, terminated, truncated, info = env.step(json.dumps({"name": "smtp", "arguments": args}))
            assert obs.startswith("smtp error"), (attack, obs[:300])
            assert not (terminated or truncated)
        # Nothing got through; a clean message does, with exactly the headers the env set.
        assert received == []
        obs, *_ = env.step(
            json.dumps({"name": "smtp", "arguments": {"to": [to], "subject": "=?utf-8?q?Caf=C3=A9?=", "body": "Hi\n"}})
        )
        assert obs.startswith("smtp ok"), obs[:300]
        assert len(received) == 1
        top = _headers(received[0])[0]
        assert sorted(top) == sorted(
            ["from", "to", "subject", "message-id", "content-type", "content-transfer-encoding", "mime-version"]
        )
        assert b"Reply-To" not in received[0].original_content and b"X-Evil" not in received[0].original_content
    finally:
        env.close()
