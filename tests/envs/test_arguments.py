"""check_arguments: the tools' JSON-schema subset, checked by pydantic, with the agent-facing messages.

The messages are pinned word for word (an agent reads them in its observation, and they are the
ones the hand-written checker gave before the switch); a differential property test holds the
verdicts against jsonschema, an independent implementation of the same schemas.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.errors import ActionError, ConfigError
from agentrl_envs.tools import TOOLS, Tool, base
from agentrl_envs.tools.base import check_arguments

MAIL = {"to": "ops@example.com", "subject": "s", "body": "b"}


def message(tool: str, arguments: Any) -> str:
    with pytest.raises(ActionError) as info:
        TOOLS[tool].validate(arguments)
    assert info.value.code == "bad_arguments"
    return info.value.message


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("sql", {"query": "SELECT 1", "database": "main"}, "sql: unknown argument(s) 'database'; expected ['query']"),
        ("sql", {"query": "x", "b": 1, "a": 2}, "sql: unknown argument(s) 'a', 'b'; expected ['query']"),
        ("sql", {"x" * 100: 1}, f"sql: unknown argument(s) {'x' * 40!r}; expected ['query']"),
        ("sql", {}, "sql: missing required argument(s) ['query']"),
        ("smtp", {"to": "a@b.example"}, "smtp: missing required argument(s) ['subject', 'body']"),
        ("sql", {"query": 1}, "sql: argument 'query' must be a string, got int"),
        ("sql", {"query": None}, "sql: argument 'query' must be a string, got NoneType"),
        ("sql", {"query": True}, "sql: argument 'query' must be a string, got bool"),
        ("sql", {"query": float("nan")}, "sql: argument 'query' must be a string, got float"),
        ("smtp", {**MAIL, "to": [1, 2]}, "smtp: argument 'to' must be a string or a list of strings, got list"),
        ("smtp", {**MAIL, "to": {"a": 1}}, "smtp: argument 'to' must be a string or a list of strings, got dict"),
        ("smtp", {**MAIL, "attachments": "q1.csv"}, "smtp: argument 'attachments' must be a list of strings, got str"),
        ("http", {"method": "POST", "path": "/v1", "body": "[1]"}, "http: argument 'body' must be a object, got str"),
        ("http", {"method": 7, "path": "/v1"}, "http: argument 'method' must be a string, got int"),
        ("http", {"method": "PUT", "path": "/v1"}, "http: method must be one of GET, POST, PATCH, DELETE, got 'PUT'"),
        (
            "sql",
            {"query": "SELECT '\ud800'"},
            "sql: argument 'query' holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
        ),
        (
            "smtp",
            {**MAIL, "cc": ["a@b.example", "\udc80"]},
            "smtp: argument 'cc' holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
        ),
        # Order: unknown names, then missing ones, then each argument in the order it came.
        (
            "smtp",
            {"to": 1, "bcc": "x"},
            "smtp: unknown argument(s) 'bcc'; expected ['attachments', 'body', 'cc', 'subject', 'to']",
        ),
        ("smtp", {"to": 1, "subject": "s"}, "smtp: missing required argument(s) ['body']"),
        (
            "smtp",
            {"subject": "\ud800", "to": 1, "body": "b"},
            "smtp: argument 'subject' holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
        ),
        (
            "smtp",
            {"to": 1, "subject": "\ud800", "body": "b"},
            "smtp: argument 'to' must be a string or a list of strings, got int",
        ),
        # Not a dict, or keys that JSON cannot hold: a clear error (the old checker raised TypeError).
        ("sql", ["SELECT 1"], "sql: the arguments must be a JSON object, got list"),
        ("sql", {1: "SELECT 1"}, "sql: unknown argument(s) 1; expected ['query']"),
        ("sql", {1: "x", "query": "y", "b": 2}, "sql: unknown argument(s) 1, 'b'; expected ['query']"),
    ],
)
def test_messages(tool: str, arguments: Any, expected: str) -> None:
    assert message(tool, arguments) == expected


def test_valid_arguments_come_back_unchanged() -> None:
    body = {"title": "x", "nested": {"deep": [1, None, {"k": "v"}]}}
    arguments = {"method": "POST", "path": "/v1/tickets", "body": body}
    assert check_arguments("http", TOOLS["http"].parameters, arguments) is arguments
    assert arguments["body"] is body
    for arguments in ({**MAIL, "to": []}, {**MAIL, "to": ["a@b.example"], "cc": [], "attachments": ["q1.csv"]}):
        assert TOOLS["smtp"].validate(arguments) == arguments


class _Typed(Tool):
    name: ClassVar[str] = "typed"
    description: ClassVar[str] = "a test-only tool with every type of the subset"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
            "any_list": {"type": "array"},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "either": {"type": ["integer", "string"]},
        },
        "required": [],
    }


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"n": 3, "x": 1.5, "b": False, "any_list": [1, "a", None], "ids": [1, 2], "either": "a"}, None),
        ({"x": 2, "either": 7}, None),  # an integer is a number
        ({"n": True}, "argument 'n' must be an integer, got bool"),
        ({"n": 1.0}, "argument 'n' must be an integer, got float"),
        ({"x": True}, "argument 'x' must be a number, got bool"),
        ({"b": 1}, "argument 'b' must be a boolean, got int"),
        ({"any_list": (1,)}, "argument 'any_list' must be a list, got tuple"),
        ({"ids": [1, "2"]}, "argument 'ids' must be a list of integers, got list"),
        ({"either": 1.5}, "argument 'either' must be an integer or a string, got float"),
    ],
)
def test_every_type_of_the_subset_is_strict(arguments: dict[str, Any], error: str | None) -> None:
    if error is None:
        assert _Typed().validate(arguments) == arguments
    else:
        with pytest.raises(ActionError) as info:
            _Typed().validate(arguments)
        assert info.value.message == f"typed: {error}"


@pytest.mark.parametrize(
    ("parameters", "match"),
    [
        ({"type": "object", "properties": {"q": {"type": "null"}}}, "has type 'null'; use one of"),
        ({"type": "object", "properties": {"q": {"description": "no type"}}}, "has type None"),
        (
            {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["query"]},
            r"\['query'\] are not in 'properties'",
        ),
        ({"type": "array", "items": {"type": "string"}}, "parameters must be"),
        ({"type": "object", "properties": {"q": {"type": "string", "enum": [1, 2]}}}, "use a non-empty list of strings"),
        (
            {"type": "object", "properties": {"q": {"type": "array", "items": {"type": "date"}}}},
            r"argument 'q\[\]' has type 'date'",
        ),
    ],
)
def test_a_schema_outside_the_subset_is_a_config_error(parameters: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_arguments("broken", parameters, {})


# -- hostile sizes: the work is bounded by the schema, not by the call (counted, not timed) -------------


def test_a_huge_list_of_wrong_items_makes_one_error_not_one_per_item() -> None:
    arguments = {**MAIL, "to": [1] * 50_000, "cc": [2] * 50_000}
    error = base._arguments_checker("smtp", TOOLS["smtp"].parameters)(arguments)
    assert error is not None and error.error_count() <= 4  # "to": one per branch of its union; "cc": one
    assert message("smtp", arguments) == "smtp: argument 'to' must be a string or a list of strings, got list"


def test_more_names_than_the_schema_has_are_refused_before_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_called(tool: str, parameters: dict[str, Any]) -> Any:
        raise AssertionError("pydantic was asked to build one error per unknown name")

    monkeypatch.setattr(base, "_arguments_checker", not_called)
    arguments = {"query": "SELECT 1", **{f"k{i}": i for i in range(20_000)}}
    assert message("sql", arguments) == "sql: unknown argument(s) 'k0', 'k1', 'k10', 'k100', 'k1000'; expected ['query']"


# -- verdicts against jsonschema (an independent implementation of the same schemas) -----------------

_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["GET", "POST", "\ud800"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(TOOLS)))
    props = sorted(TOOLS[name].parameters["properties"])
    keys = draw(st.lists(st.sampled_from([*props, "extra"]), unique=True, max_size=len(props) + 1))
    return name, {key: draw(_VALUES) for key in keys}


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    return isinstance(value, list) and any(_has_surrogate(v) for v in value)


@settings(max_examples=300, deadline=None)
@given(_calls())
def test_verdicts_match_jsonschema(call: tuple[str, dict[str, Any]]) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra (pip install -e '.[dev]')")
    name, arguments = call
    schema = {**TOOLS[name].parameters, "additionalProperties": False}
    expected = jsonschema.Draft202012Validator(schema).is_valid(arguments) and not any(map(_has_surrogate, arguments.values()))
    try:
        got = check_arguments(name, TOOLS[name].parameters, arguments) is arguments
    except ActionError as exc:
        assert exc.code == "bad_arguments" and exc.message.startswith(f"{name}: ")
        got = False
    assert got == expected
