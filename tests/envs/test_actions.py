"""parse_action: the accepted forms, every ActionError code, and properties over arbitrary text."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentrl_envs.core.actions import MAX_ACTION_CHARS, ToolCall, format_call, parse_action
from agentrl_envs.errors import ActionError
from agentrl_envs.tools import TOOLS

SQL_CALL = '{"name": "sql", "arguments": {"query": "SELECT 1"}}'
SQL = ToolCall("sql", {"query": "SELECT 1"})


def _code(action: str, **kw: Any) -> str:
    with pytest.raises(ActionError) as info:
        parse_action(action, **kw)
    assert isinstance(info.value.message, str) and info.value.message
    assert str(info.value) == info.value.message
    return info.value.code


# -- accepted forms --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        f"<tool_call>{SQL_CALL}</tool_call>",
        f"I will query the table.\n<tool_call>\n{SQL_CALL}\n</tool_call>\nThen I will look at it.",
        f"<think>plan: count rows</think><tool_call>{SQL_CALL}</tool_call>",
        f"text <tool_call>{SQL_CALL}",  # unterminated block: the rest of the text is the call
        SQL_CALL,
        f"  \n{SQL_CALL}\n\t",
        f"```json\n{SQL_CALL}\n```",
        f"```\n{SQL_CALL}\n```",
        f"```{SQL_CALL}```",
        f"  ```JSON\n{SQL_CALL}\n```  ",
        '{"name": "sql", "arguments": "{\\"query\\": \\"SELECT 1\\"}"}',
        '<tool_call>{"name": "sql", "arguments": "{\\"query\\": \\"SELECT 1\\"}"}</tool_call>',
        '{"name": "sql", "arguments": {"query": "SELECT 1"}, "id": "call_1", "type": "function"}',
    ],
)
def test_accepted_forms(action: str) -> None:
    assert parse_action(action) == SQL


def test_every_tool_parses() -> None:
    assert parse_action(format_call("python", {"code": "print(1)"})) == ToolCall("python", {"code": "print(1)"})
    assert parse_action(format_call("finish", {"answer": "42"})) == ToolCall("finish", {"answer": "42"})
    smtp = {"to": ["a@example.com"], "subject": "s", "body": "b", "cc": ["c@example.com"], "attachments": ["results/q1.csv"]}
    assert parse_action(format_call("smtp", smtp)) == ToolCall("smtp", smtp)
    assert (
        parse_action(format_call("smtp", {"to": "a@example.com", "subject": "s", "body": "b"})).arguments["to"] == "a@example.com"
    )


def test_missing_arguments_means_empty_object() -> None:
    assert _code('{"name": "finish"}') == "bad_arguments"  # 'answer' is required
    assert _code('{"name": "finish", "arguments": ""}') == "bad_arguments"
    assert _code('{"name": "finish", "arguments": "   "}') == "bad_arguments"


def test_format_call_is_hermes_json() -> None:
    text = format_call("finish", {"answer": "Chloé 👋"})
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert json.loads(text[len("<tool_call>") : -len("</tool_call>")]) == {"name": "finish", "arguments": {"answer": "Chloé 👋"}}
    assert "Chloé 👋" in text  # not ASCII-escaped


def test_tools_mapping_restricts_the_available_tools() -> None:
    only_sql = {"sql": TOOLS["sql"]}
    assert parse_action(SQL_CALL, only_sql) == SQL
    assert _code(format_call("finish", {"answer": "x"}), tools=only_sql) == "unknown_tool"
    assert _code(SQL_CALL, tools={}) == "unknown_tool"


# -- every ActionError code ------------------------------------------------------------------------


def test_too_long() -> None:
    assert _code("x" * (MAX_ACTION_CHARS + 1)) == "too_long"
    padded = SQL_CALL + " " * (MAX_ACTION_CHARS - len(SQL_CALL))
    assert len(padded) == MAX_ACTION_CHARS
    assert parse_action(padded) == SQL


@pytest.mark.parametrize(
    "action",
    [
        f"<tool_call>{SQL_CALL}</tool_call><tool_call>{SQL_CALL}</tool_call>",
        f"<tool_call>{SQL_CALL}</tool_call> and <tool_call>",
        f"{SQL_CALL} {SQL_CALL}",
        f"<tool_call>{SQL_CALL} {SQL_CALL}</tool_call>",
        f"{SQL_CALL} trailing words",
    ],
)
def test_multiple_calls(action: str) -> None:
    assert _code(action) == "multiple_calls"


@pytest.mark.parametrize(
    "action",
    ["", "   \n\t", "I am done.", "SELECT 1", f"</tool_call>{SQL_CALL}", f"{SQL_CALL}</tool_call>", "```\n```", "[1, 2]"],
)
def test_no_call(action: str) -> None:
    assert _code(action) == "no_call"


@pytest.mark.parametrize(
    "action",
    [
        "<tool_call></tool_call>",
        '<tool_call>{"name": "sql", "arguments": </tool_call>',
        "{'name': 'sql', 'arguments': {}}",
        '{"name": "sql", "arguments": {"query": "SELECT 1"}',
        '{"name": "sql", "arguments": {"query": "SELECT 1",}}',
        '{"name": "sql", "arguments": "{not json"}',
        '<tool_call>{"name": "finish", "arguments": {"answer": ' + "9" * 5000 + "}}</tool_call>",
    ],
)
def test_bad_json(action: str) -> None:
    assert _code(action) == "bad_json"


@pytest.mark.parametrize(
    "action",
    [
        "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>",
        '<tool_call>{"name": "sql", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5001 + "</tool_call>",
        '{"name": "sql", "arguments": "' + "[" * 5000 + "]" * 5000 + '"}',
    ],
)
def test_too_deep(action: str) -> None:
    assert _code(action) == "too_deep"


@pytest.mark.parametrize("payload", ["[1]", '"sql"', "1", "null", "true", '["sql", {}]'])
def test_not_an_object(payload: str) -> None:
    assert _code(f"<tool_call>{payload}</tool_call>") == "not_an_object"


@pytest.mark.parametrize(
    "action",
    [
        '{"name": "sql", "arguments": {"query": "SELECT 1"}, "extra": 1}',
        '{"tool": "sql", "arguments": {}}',
        '{"arguments": {"query": "SELECT 1"}}',
        '{"name": 5, "arguments": {}}',
        '{"name": null, "arguments": {}}',
        '{"name": ["sql"], "arguments": {}}',
        "{}",
    ],
)
def test_bad_call(action: str) -> None:
    assert _code(action) == "bad_call"


@pytest.mark.parametrize("name", ["rm", "SQL", "sql ", "", "bash", "x" * 500])
def test_unknown_tool(name: str) -> None:
    err_code = _code(json.dumps({"name": name, "arguments": {}}))
    assert err_code == "unknown_tool"


@pytest.mark.parametrize(
    "action",
    [
        '{"name": "sql", "arguments": [1]}',
        '{"name": "sql", "arguments": 5}',
        '{"name": "sql", "arguments": null}',
        '{"name": "sql", "arguments": "[1]"}',
        '{"name": "sql", "arguments": "\\"SELECT 1\\""}',
        '{"name": "sql", "arguments": {}}',
        '{"name": "sql", "arguments": {"query": 1}}',
        '{"name": "sql", "arguments": {"query": null}}',
        '{"name": "sql", "arguments": {"query": "SELECT 1", "limit": 5}}',
        '{"name": "sql", "arguments": {"sql": "SELECT 1"}}',
        '{"name": "smtp", "arguments": {"to": [1], "subject": "s", "body": "b"}}',
        '{"name": "smtp", "arguments": {"to": "a@example.com", "subject": "s"}}',
        '{"name": "smtp", "arguments": {"to": "a@example.com", "subject": "s", "body": "b", "cc": "c@example.com"}}',
        '{"name": "smtp", "arguments": {"to": "a@example.com", "subject": "s", "body": "b", "bcc": []}}',
        '{"name": "python", "arguments": {"code": ["print(1)"]}}',
        '{"name": "finish", "arguments": {"answer": 42}}',
    ],
)
def test_bad_arguments(action: str) -> None:
    assert _code(action) == "bad_arguments"


@pytest.mark.parametrize("action", [None, b"<tool_call>{}</tool_call>", 5, ["x"], {"name": "sql"}])
def test_non_str_is_a_type_error(action: Any) -> None:
    with pytest.raises(TypeError):
        parse_action(action)


def test_action_error_pickles() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ActionError("bad_json", "invalid JSON")))
    assert (err.code, err.message) == ("bad_json", "invalid JSON")


def test_unterminated_code_fence_is_parsed_in_linear_time() -> None:
    # A quadratic parser needs minutes for this (it needed 1.8 s at 16,000); a linear one, microseconds.
    action = "```" + "a" * 190_000
    start = time.perf_counter()
    assert _code(action) == "no_call"
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize("answer", ["<tool_call>", "see </tool_call> here"])
def test_round_trip_with_tool_call_markers_in_arguments(answer: str) -> None:
    assert parse_action(format_call("finish", {"answer": answer})) == ToolCall("finish", {"answer": answer})


# -- properties ------------------------------------------------------------------------------------

# Any code point, lone surrogates included.
_ANY_CHAR = st.one_of(
    st.characters(codec=None, exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
)
_FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "```",
        "```json\n",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        '"sql"',
        '"finish"',
        '"smtp"',
        '"query"',
        '"answer"',
        '"to"',
        ":",
        ",",
        '"',
        "\\",
        "\\u",
        "\\ud800",
        "null",
        "1e999",
        "NaN",
        " ",
        "\n",
    ]
)
_ACTION_TEXT = st.one_of(
    st.text(_ANY_CHAR, max_size=200),
    st.lists(st.one_of(_FRAGMENTS, st.text(_ANY_CHAR, max_size=5)), max_size=30).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(_ACTION_TEXT)
@example("\ud800")
@example('{"name": "finish", "arguments": {"answer": "\\ud800"}}')
@example('<tool_call>{"name": "sql", "arguments": "{\\"query\\": 1e999}"}</tool_call>')
@example("```json\n```")
def test_arbitrary_text_parses_or_raises_action_error(action: str) -> None:
    try:
        call = parse_action(action)
    except ActionError as exc:
        assert isinstance(exc.code, str) and exc.code
        assert isinstance(exc.message, str)
        return
    assert isinstance(call, ToolCall)
    assert call.name in TOOLS
    assert isinstance(call.arguments, dict)


# Argument text: any valid Unicode text, the tool-call markers included (format_call escapes them).
# Lone surrogates are not text: the tools refuse them (see test_lone_surrogate_arguments_are_refused).
_ARG_TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.sampled_from(["<tool_call>", "</tool_call>", "a <tool_call>{}</tool_call> b"]),
)
_ADDRESSES = st.lists(_ARG_TEXT, max_size=3)


@st.composite
def _valid_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(TOOLS)))
    if name == "sql":
        return name, {"query": draw(_ARG_TEXT)}
    if name == "python":
        return name, {"code": draw(_ARG_TEXT)}
    if name == "finish":
        return name, {"answer": draw(_ARG_TEXT)}
    if name == "http":
        segment = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
        call: dict[str, Any] = {
            "method": draw(st.sampled_from(["GET", "DELETE"])),
            "path": "/" + "/".join(draw(st.lists(segment, max_size=3))),
        }
        if draw(st.booleans()):
            call["query"] = draw(
                st.dictionaries(st.sampled_from(["limit", "status", "name"]), _ARG_TEXT.filter(str.isprintable), max_size=2)
            )
        if draw(st.booleans()):
            call = {**call, "method": draw(st.sampled_from(["POST", "PATCH"])), "body": {"title": draw(_ARG_TEXT)}}
        return name, call
    args: dict[str, Any] = {
        "to": draw(st.one_of(_ARG_TEXT, _ADDRESSES)),
        "subject": draw(_ARG_TEXT),
        "body": draw(_ARG_TEXT),
    }
    if draw(st.booleans()):
        args["cc"] = draw(_ADDRESSES)
    if draw(st.booleans()):
        args["attachments"] = draw(_ADDRESSES)
    return name, args


@settings(max_examples=300, deadline=None)
@given(_valid_calls())
@example(("finish", {"answer": ""}))
@example(("finish", {"answer": "\U0001f600 \x00 \u2028 ```"}))
@example(("smtp", {"to": [], "subject": "", "body": "", "cc": [], "attachments": []}))
def test_format_call_round_trips(call: tuple[str, dict[str, Any]]) -> None:
    name, arguments = call
    assert parse_action(format_call(name, arguments)) == ToolCall(name, arguments)


@pytest.mark.parametrize("value", ["\ud800", "ok \udfff", ["a@b.example", "\udc80"]])
def test_lone_surrogate_arguments_are_refused(value: object) -> None:
    key = "to" if isinstance(value, list) else "query"
    name = "smtp" if key == "to" else "sql"
    args: dict[str, Any] = {key: value} if name == "sql" else {"to": value, "subject": "s", "body": "b"}
    with pytest.raises(ActionError, match="surrogate"):
        parse_action(format_call(name, args))


@pytest.mark.parametrize(
    "args",
    [
        {"method": "POST", "path": "/v1/tickets", "body": {"title": "a\ud800b"}},
        {"method": "POST", "path": "/v1/tickets", "body": {"ti\udc00tle": "x"}},
        {"method": "POST", "path": "/v1/tickets", "body": {"tags": [{"name": ["\udfff"]}]}},
        {"method": "GET", "path": "/v1/tickets", "query": {"q\ud800": "x"}},
    ],
)
def test_lone_surrogates_inside_http_body_and_query_are_refused(args: dict[str, Any]) -> None:
    with pytest.raises(ActionError, match="surrogate"):
        parse_action(format_call("http", args))


# -- call conventions (OpenAI, Llama 3, Hermes) ----------------------------------------------------


def _dumps(value: Any) -> str:
    # Escape '<' as JSON allows, so a '<tool_call>' inside an argument is not read as a second block.
    return json.dumps(value).replace("<", "\\u003c")


def _openai(name: str, arguments: Any, as_string: bool) -> str:
    args = _dumps(arguments) if as_string else arguments
    return _dumps({"type": "function", "id": "call_1", "function": {"name": name, "arguments": args}})


def _llama3(name: str, arguments: Any) -> str:
    return _dumps({"name": name, "parameters": arguments})


@settings(max_examples=150, deadline=None)
@given(_valid_calls(), st.sampled_from(["hermes", "json", "openai", "openai-str", "llama3", "llama3-tag", "hermes-openai"]))
def test_every_convention_parses_to_the_same_call(call: tuple[str, dict[str, Any]], convention: str) -> None:
    name, arguments = call
    text = {
        "hermes": lambda: "<tool_call>\n" + _dumps({"name": name, "arguments": arguments}) + "\n</tool_call>",
        "json": lambda: _dumps({"name": name, "arguments": arguments}),
        "openai": lambda: _openai(name, arguments, as_string=False),
        "openai-str": lambda: _openai(name, arguments, as_string=True),
        "llama3": lambda: _llama3(name, arguments),
        "llama3-tag": lambda: "<|python_tag|>" + _llama3(name, arguments),
        "hermes-openai": lambda: f"<tool_call>{_openai(name, arguments, as_string=True)}</tool_call>",
    }[convention]()
    parsed = parse_action(text)
    assert parsed == ToolCall(name, arguments)
    expected = {"hermes-openai": "openai", "openai-str": "openai", "llama3-tag": "llama3"}.get(convention, convention)
    assert parsed.form == expected


@pytest.mark.parametrize(
    ("action", "code"),
    [
        ('{"type": "function", "function": "sql"}', "bad_call"),
        ('{"type": "function", "function": ["sql"]}', "bad_call"),
        ('{"type": "tool", "function": {"name": "sql", "arguments": {"query": "SELECT 1"}}}', "bad_call"),
        ('{"type": "function", "function": {"name": "sql", "arguments": {"query": "SELECT 1"}, "x": 1}}', "bad_call"),
        ('{"type": "function", "function": {"name": 5, "arguments": {}}}', "bad_call"),
        ('{"type": "function", "function": {"arguments": {"query": "SELECT 1"}}}', "bad_call"),
        ('{"function": {"name": "sql", "arguments": "[1]"}}', "bad_arguments"),
        ('{"function": {"name": "sql", "arguments": "{oops"}}', "bad_json"),
        ('{"function": {"name": "sql", "arguments": {"query": 1}}}', "bad_arguments"),
        ('{"function": {"function": {"name": "sql", "arguments": {}}}}', "bad_call"),
        ('{"function": {"name": "rm", "arguments": {}}}', "unknown_tool"),
        ('{"name": "sql", "parameters": [1]}', "bad_arguments"),
        ('{"name": "sql", "parameters": {"query": 1}}', "bad_arguments"),
        ('{"name": "sql", "parameters": {}, "arguments": {}}', "bad_call"),
        ('{"name": "sql", "parameters": {"query": "SELECT 1"}, "type": "builtin"}', "bad_call"),
        ('{"name": ["sql"], "parameters": {}}', "bad_call"),
        ('{"name": "sql", "parameters": ' + '{"a": ' * 5000 + "1" + "}" * 5001, "too_deep"),
        ('{"function": {"name": "sql", "arguments": "' + "[" * 5000 + "]" * 5000 + '"}}', "too_deep"),
        ("<|python_tag|>", "no_call"),
        ("<|python_tag|>not json", "no_call"),
    ],
)
def test_hostile_variants_of_each_convention(action: str, code: str) -> None:
    assert _code(action) == code


def test_huge_calls_in_every_convention_are_too_long() -> None:
    big = "x" * MAX_ACTION_CHARS
    for text in (_openai("sql", {"query": big}, True), _llama3("sql", {"query": big}), format_call("sql", {"query": big})):
        assert _code(text) == "too_long"


@pytest.mark.parametrize(
    "action",
    [
        json.dumps([{"name": "sql", "arguments": {"query": "SELECT 1"}}, {"name": "finish", "arguments": {"answer": "1"}}]),
        "<tool_call>"
        + json.dumps(
            [json.loads(_openai("sql", {"query": "SELECT 1"}, True)), json.loads(_openai("sql", {"query": "SELECT 2"}, True))]
        )
        + "</tool_call>",
        "<tool_call>\n"
        + json.dumps([json.loads(_openai("sql", {"query": "SELECT 1"}, False)), json.loads(_llama3("finish", {"answer": "1"}))])
        + "\n</tool_call>",
        f"<tool_call>\n{SQL_CALL}\n</tool_call>\n<tool_call>\n{SQL_CALL}\n</tool_call>",
        _llama3("sql", {"query": "SELECT 1"}) + "; " + _llama3("sql", {"query": "SELECT 2"}),
    ],
)
def test_several_calls_in_one_turn_are_refused(action: str) -> None:
    with pytest.raises(ActionError, match="one call per") as info:
        parse_action(action)
    assert info.value.code == "multiple_calls"


def test_env_reports_the_call_format_and_penalizes_hostile_forms() -> None:
    import gymnasium as gym

    import agentrl_envs  # noqa: F401

    env = gym.make("AgentRL/SQL-v0")
    try:
        _, info = env.reset(seed=0)
        assert info["call_format"] == "none"
        prompt = info["system_prompt"]
        assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in prompt
        assert "one tool call" in prompt and "Several calls in one turn are refused" in prompt
        for text, form in [
            (_openai("sql", {"query": "SELECT 1"}, True), "openai"),
            (_llama3("sql", {"query": "SELECT 1"}), "llama3"),
            (format_call("sql", {"query": "SELECT 1"}), "hermes"),
            (SQL_CALL, "json"),
        ]:
            _, reward, _, _, info = env.step(text)
            assert info["call_format"] == form and info["reward_components"]["format"] == 0.0
        observation, reward, _, _, info = env.step('{"type": "function", "function": {"name": "sql", "arguments": [1]}}')
        assert info["call_format"] == "none" and info["reward_components"]["format"] == -0.1
        assert observation.startswith("action error [bad_arguments]")
    finally:
        env.close()


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["openai", "llama3", "hermes"]),
    st.one_of(_JSON, st.sampled_from(sorted(TOOLS))),
    _JSON,
    st.one_of(st.none(), _JSON),
)
def test_hostile_values_in_every_convention_parse_or_raise_action_error(
    convention: str, name: Any, args: Any, extra: Any
) -> None:
    if convention == "openai":
        obj: Any = {"type": "function", "function": {"name": name, "arguments": args}}
        if extra is not None:
            obj["function"]["extra"] = extra
    elif convention == "llama3":
        obj = {"name": name, "parameters": args}
        if extra is not None:
            obj["type"] = extra
    else:
        obj = {"name": name, "arguments": json.dumps(args) if extra is None else args}
    try:
        call = parse_action("<tool_call>" + _dumps(obj) + "</tool_call>")
    except ActionError as exc:
        assert exc.code and exc.message
        return
    assert call.name in TOOLS and isinstance(call.arguments, dict) and call.form in ("openai", "llama3", "hermes")
