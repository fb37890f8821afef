"""Hostile actions: every one gets an error observation, never an exception, and the episode survives.

Each case is stepped once on ``AgentRL/SQLPythonSMTP-v1`` (all four tools available) with short
service limits. Two outcomes are expected, decided per case:

- ``FORMAT``: the text is not one well-formed call of an available tool; the env answers
  ``action error [...]`` and adds the format penalty (``reward_components["format"] < 0``);
- ``REFUSED``: a well-formed call that the service refuses or that fails in it; the env answers
  ``<tool> error [...]`` and ``info["tool_result"]["ok"]`` is False.

Either way the observation is printable text within the observation space that says what was
wrong, and the oracle can still finish the same episode successfully.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the env ids
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import format_call
from tests.procs import with_marker

ENV_ID = "AgentRL/SQLPythonSMTP-v1"
FORMAT, REFUSED, EITHER = "format", "refused", "either"

_MAIL = {"to": "ops@example.com", "subject": "Weekly report", "body": "Hello,\nthe figure is 42.\n"}


def call(name: str, **arguments: Any) -> str:
    return format_call(name, arguments)


def mail(**overrides: Any) -> str:
    return format_call("smtp", {**_MAIL, **overrides})


def raw(obj: Any) -> str:
    """A call written with json.dumps (for arguments format_call would never produce)."""
    return "<tool_call>" + json.dumps(obj, ensure_ascii=False) + "</tool_call>"


_CASES: list[tuple[str, str, str, str] | Any] = [
    # -- not a call at all ----------------------------------------------------------------------
    ("empty", "", FORMAT, "no_call"),
    ("whitespace_only", " \t\n\r\n   \t", FORMAT, "no_call"),
    ("huge_5mb_text", "A" * 5_000_000, FORMAT, "too_long"),
    ("huge_5mb_query", call("sql", query="SELECT '" + "x" * 5_000_000 + "'"), FORMAT, "too_long"),
    ("prose_no_call", "I think I should query the orders table first.", FORMAT, "no_call"),
    ("close_tag_only", 'sql</tool_call>{"name": "sql"}', FORMAT, "no_call"),
    ("nul_bytes_text", "\x00" * 64, FORMAT, "no_call"),
    ("lone_surrogate_text", "\ud800", FORMAT, "no_call"),
    ("ansi_escapes_text", "\x1b[2J\x1b[H\x1b[31mrm -rf /\x1b[0m\x07", FORMAT, "no_call"),
    # -- invalid JSON ---------------------------------------------------------------------------
    ("json_truncated", '<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"</tool_call>', FORMAT, "bad_json"),
    ("json_single_quotes", "{'name': 'sql', 'arguments': {'query': 'SELECT 1'}}", FORMAT, "bad_json"),
    ("json_trailing_comma", '{"name": "sql", "arguments": {"query": "SELECT 1",},}', FORMAT, "bad_json"),
    ("json_raw_nul_in_string", '{"name": "sql", "arguments": {"query": "SELECT 1\x00"}}', FORMAT, "bad_json"),
    ("json_huge_int", '{"name": "sql", "arguments": {"query": ' + "9" * 5000 + "}}", FORMAT, "bad_json"),
    ("json_nan_query", '{"name": "sql", "arguments": {"query": NaN}}', FORMAT, "bad_arguments"),
    ("json_array_of_calls", raw([{"name": "sql", "arguments": {"query": "SELECT 1"}}]), FORMAT, "not_an_object"),
    # -- nested 100k deep -------------------------------------------------------------------------
    ("deep_list_100k", "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", FORMAT, "too_long"),
    ("deep_list_100k_unclosed", "<tool_call>" + "[" * 100_000 + "</tool_call>", FORMAT, "too_deep"),
    ("deep_dict_100k", '{"a":' * 100_000 + "1" + "}" * 100_000, FORMAT, "too_long"),
    ("deep_dict_39k_unclosed", "<tool_call>" + '{"a":' * 39_000 + "</tool_call>", FORMAT, "too_deep"),
    ("deep_dict_30k_balanced", "<tool_call>" + '{"a":' * 30_000 + "1" + "}" * 30_000 + "</tool_call>", FORMAT, "too_deep"),
    ("deep_list_in_arguments_string", '{"name": "sql", "arguments": "' + "[" * 100_000 + '"}', FORMAT, "too_deep"),
    # -- unknown tools and malformed calls ------------------------------------------------------
    ("unknown_tool_bash", call("bash", command="rm -rf /"), FORMAT, "unknown_tool"),
    ("unknown_tool_wrong_case", call("SQL", query="SELECT 1"), FORMAT, "unknown_tool"),
    ("unknown_tool_empty_name", call("", query="SELECT 1"), FORMAT, "unknown_tool"),
    ("unknown_tool_huge_name", call("x" * 100_000), FORMAT, "unknown_tool"),
    ("name_not_a_string", raw({"name": 7, "arguments": {}}), FORMAT, "bad_call"),
    ("name_missing", raw({"arguments": {"query": "SELECT 1"}}), FORMAT, "bad_call"),
    ("unexpected_top_level_key", raw({"name": "sql", "arguments": {"query": "SELECT 1"}, "sudo": True}), FORMAT, "bad_call"),
    ("arguments_array", raw({"name": "sql", "arguments": ["SELECT 1"]}), FORMAT, "bad_arguments"),
    ("arguments_bad_json_string", raw({"name": "sql", "arguments": "{query: SELECT 1}"}), FORMAT, "bad_json"),
    # -- wrong argument types, missing and unexpected arguments ---------------------------------
    ("sql_query_int", call("sql", query=1), FORMAT, "bad_arguments"),
    ("sql_query_null", call("sql", query=None), FORMAT, "bad_arguments"),
    ("smtp_to_dict", mail(to={"address": "ops@example.com"}), FORMAT, "bad_arguments"),
    ("smtp_to_list_of_ints", mail(to=[1, 2]), FORMAT, "bad_arguments"),
    ("smtp_attachments_string", mail(attachments="results/q1.csv"), FORMAT, "bad_arguments"),
    ("python_code_list", call("python", code=["print(1)"]), FORMAT, "bad_arguments"),
    ("finish_answer_int", call("finish", answer=42), FORMAT, "bad_arguments"),
    ("sql_missing_query", call("sql"), FORMAT, "bad_arguments"),
    ("python_missing_code", raw({"name": "python"}), FORMAT, "bad_arguments"),
    ("smtp_missing_body", call("smtp", to="ops@example.com", subject="hi"), FORMAT, "bad_arguments"),
    ("finish_missing_answer", call("finish"), FORMAT, "bad_arguments"),
    ("sql_unexpected_arg", call("sql", query="SELECT 1", database="main"), FORMAT, "bad_arguments"),
    ("python_unexpected_arg", call("python", code="print(1)", timeout_s=3600), FORMAT, "bad_arguments"),
    ("smtp_unexpected_arg_from", mail(**{"from": "ceo@example.com"}), FORMAT, "bad_arguments"),
    # -- more than one call ---------------------------------------------------------------------
    ("two_tool_call_blocks", call("sql", query="SELECT 1") + "\n" + call("finish", answer="done"), FORMAT, "multiple_calls"),
    (
        "two_json_objects",
        json.dumps({"name": "sql", "arguments": {"query": "SELECT 1"}})
        + json.dumps({"name": "finish", "arguments": {"answer": "done"}}),
        FORMAT,
        "multiple_calls",
    ),
    # -- SQL the service refuses ----------------------------------------------------------------
    ("sql_insert", call("sql", query="INSERT INTO staff (staff_id, name) VALUES (999, 'mallory')"), REFUSED, "denied"),
    ("sql_update", call("sql", query="UPDATE staff SET email = 'mallory@evil.example'"), REFUSED, "denied"),
    ("sql_delete", call("sql", query="DELETE FROM staff"), REFUSED, "denied"),
    ("sql_drop", call("sql", query="DROP TABLE staff"), REFUSED, "denied"),
    ("sql_create", call("sql", query="CREATE TABLE loot AS SELECT * FROM staff"), REFUSED, "denied"),
    ("sql_attach", call("sql", query="ATTACH DATABASE '/tmp/agentrl-evil.db' AS evil"), REFUSED, "denied"),
    ("sql_pragma_query_only_off", call("sql", query="PRAGMA query_only=0"), REFUSED, "denied"),
    ("sql_pragma_writable_schema", call("sql", query="PRAGMA writable_schema=ON"), REFUSED, "denied"),
    ("sql_load_extension", call("sql", query="SELECT load_extension('/tmp/evil.so')"), REFUSED, "denied"),
    ("sql_vacuum_into", call("sql", query="VACUUM INTO '/tmp/agentrl-evil.db'"), REFUSED, "denied"),
    (
        "sql_runaway_recursive_cte",
        call("sql", query="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"),
        REFUSED,
        "timeout",
    ),
    ("sql_printf_cpu_burn", call("sql", query="SELECT printf('%.*c', 999999999, 'x')"), REFUSED, "denied"),
    ("sql_randomblob_2e9", call("sql", query="SELECT randomblob(2e9)"), REFUSED, "denied"),
    ("sql_zeroblob", call("sql", query="SELECT length(zeroblob(1000000000))"), REFUSED, "denied"),
    ("sql_multi_statement", call("sql", query="SELECT 1; DROP TABLE staff"), REFUSED, "bad_request"),
    ("sql_nul_in_query", call("sql", query="SELECT 1\x00; DROP TABLE staff"), REFUSED, "bad_request"),
    ("sql_empty_query", call("sql", query="   "), REFUSED, "bad_request"),
    ("sql_syntax_error", call("sql", query="SELEC * FORM staff"), REFUSED, "syntax"),
    ("sql_ansi_escapes", call("sql", query="SELECT \x1b[31m* FROM staff"), REFUSED, "error"),
    ("sql_lone_surrogate", call("sql", query="SELECT '\ud800'"), FORMAT, "surrogate"),
    ("sql_escaped_lone_surrogate", '{"name": "sql", "arguments": {"query": "SELECT \'\\ud800\'"}}', FORMAT, "surrogate"),
    # -- Python that fails ----------------------------------------------------------------------
    ("python_infinite_loop", call("python", code="while True:\n    pass\n"), REFUSED, "timeout"),
    ("python_memory_bomb", call("python", code="blob = bytearray(2**40)\n"), REFUSED, "memoryerror"),
    # Grows to the 1 GiB address-space limit (MemoryError) unless the 1 s wall limit stops it first.
    (
        "python_memory_bomb_gradual",
        call("python", code="x = []\nwhile True:\n    x.append(' ' * 10**7)\n"),
        REFUSED,
        "python error",
    ),
    ("python_endless_print", call("python", code="while True:\n    print('x' * 1000)\n"), REFUSED, "output limit"),
    ("python_input", call("python", code="name = input('name? ')\nprint(name)\n"), REFUSED, "eoferror"),
    ("python_sys_exit_3", call("python", code="import sys\nsys.exit(3)\n"), REFUSED, "exit code 3"),
    ("python_raises", call("python", code="raise RuntimeError('boom')\n"), REFUSED, "runtimeerror: boom"),
    ("python_syntax_error", call("python", code="def f(:\n"), REFUSED, "syntaxerror"),
    (
        "python_segfault",
        call("python", code="import ctypes\nctypes.string_at(0)\n"),
        REFUSED,
        "exit code -11",
    ),
    ("python_nul_in_code", call("python", code="print(1)\x00"), REFUSED, "bad_request"),
    (
        "python_ansi_on_stdout",
        call("python", code="print('\\x1b[2J\\x1b[31mred')\nraise SystemExit(1)\n"),
        REFUSED,
        "exit code 1",
    ),
    ("python_lone_surrogate", call("python", code="print('\ud800')"), FORMAT, "surrogate"),
    # -- SMTP the server refuses ----------------------------------------------------------------
    ("smtp_crlf_in_subject", mail(subject="Report\r\nBcc: leak@evil.example"), REFUSED, "header_injection"),
    ("smtp_crlf_in_to", mail(to="ops@example.com\r\nBcc: leak@evil.example"), REFUSED, "header_injection"),
    ("smtp_lf_in_to_list", mail(to=["ops@example.com", "x@example.com\nBcc: leak@evil.example"]), REFUSED, "header_injection"),
    ("smtp_10000_recipients", mail(to=[f"u{i}@x.io" for i in range(10_000)]), REFUSED, "too_many_recipients"),
    ("smtp_bare_lf_dot_smuggling", mail(body="hi\n.\r\nMAIL FROM:<x@y>"), REFUSED, "smuggling"),
    ("smtp_bare_cr_in_body", mail(body="hi\r.\rMAIL FROM:<x@y>"), REFUSED, "smuggling"),
    ("smtp_nul_in_body", mail(body="hi\x00there"), REFUSED, "bad_body"),
    ("smtp_ansi_in_subject", mail(subject="\x1b[31mURGENT\x1b[0m"), REFUSED, "bad_header"),
    ("smtp_attach_dotdot_passwd", mail(attachments=["../../etc/passwd"]), REFUSED, "outside the workspace"),
    ("smtp_attach_absolute_passwd", mail(attachments=["/etc/passwd"]), REFUSED, "outside the workspace"),
    ("smtp_attach_proc_root_symlink", mail(attachments=["/proc/self/root/etc/passwd"]), REFUSED, "outside the workspace"),
    ("smtp_attach_results_dotdot", mail(attachments=["results/../../../../../etc/shadow"]), REFUSED, "outside the workspace"),
    ("smtp_attach_workspace_root", mail(attachments=["."]), REFUSED, "bad_attachment"),
    ("smtp_attach_missing_file", mail(attachments=["results/nothing-here.csv"]), REFUSED, "does not exist"),
    ("smtp_invalid_address", mail(to="not-an-email"), REFUSED, "bad_address"),
    ("smtp_address_without_dot", mail(to="root@localhost"), REFUSED, "bad_address"),
    ("smtp_address_display_name", mail(to="Mallory <mallory@evil.example>"), REFUSED, "bad_address"),
    ("smtp_address_double_at", mail(to="a@@example.com"), REFUSED, "bad_address"),
    ("smtp_empty_recipient_list", mail(to=[]), REFUSED, "bad_address"),
    ("smtp_duplicate_recipient", mail(to=["ops@example.com", "OPS@example.com"], cc=["ops@example.com"]), REFUSED, "twice"),
    ("smtp_huge_subject", mail(subject="s" * 10_000), REFUSED, "too_large"),
    ("smtp_lone_surrogate_subject", mail(subject="\ud800"), FORMAT, "surrogate"),
]


def _params() -> Iterator[Any]:
    for seed, case in enumerate(_CASES):
        if hasattr(case, "marks"):  # a pytest.param carrying marks (itself a namedtuple)
            case_id, action, expect, marker = case.values
            yield pytest.param(action, expect, marker, seed, id=case_id, marks=case.marks)
        else:
            case_id, action, expect, marker = case
            yield pytest.param(action, expect, marker, seed, id=case_id)


@pytest.fixture(scope="module")
def env() -> Iterator[gym.Env[str, str]]:
    e = gym.make(ENV_ID, python_timeout_s=1.0, sql_deadline_s=0.5)
    yield e
    e.close()


def _finish_with_oracle(env: gym.Env[str, str], obs: str, info: dict[str, Any]) -> dict[str, Any]:
    agent = OracleAgent(env)
    for _ in range(100):
        obs, _reward, terminated, truncated, info = env.step(agent.act(obs, info))
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            assert terminated, f"the oracle was truncated: {info.get('task_components')}"
            return info
    raise AssertionError("the oracle did not finish within 100 steps")


def test_corpus_is_large_and_ids_unique() -> None:
    ids = [c.values[0] if hasattr(c, "marks") else c[0] for c in _CASES]
    assert len(ids) >= 45
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("action", "expect", "marker", "seed"), list(_params()))
def test_hostile_action(env: gym.Env[str, str], action: str, expect: str, marker: str, seed: int) -> None:
    _step_hostile(env, action, expect, marker, seed)


def _step_hostile(env: gym.Env[str, str], action: str, expect: str, marker: str, seed: int) -> None:
    obs, info = env.reset(seed=seed)

    obs, reward, terminated, truncated, info = env.step(action)

    assert not terminated and not truncated
    assert isinstance(obs, str) and obs.strip()
    assert env.observation_space.contains(obs), "the observation is not printable text within the space"
    assert "error" in obs.lower(), obs[:300]
    assert marker in obs.lower(), f"expected {marker!r} in the observation: {obs[:300]!r}"
    result = info["tool_result"]
    components = info["reward_components"]
    assert result is not None and result["ok"] is False
    if expect == FORMAT:
        assert components["format"] < 0 and reward < 0, components
        assert info["tool"] is None and result["status"] == 400
        assert obs.startswith("action error [")
    elif expect == REFUSED:
        # The agent's own runaway work is a timeout, which carries the profile's timeout penalty;
        # every other refusal is free of reward terms (the task reward is what it loses).
        timed_out = result.get("error_type") == "timeout" or result.get("timed_out")
        expected_fault = env.unwrapped.profile.penalty("timeout") if timed_out else 0.0
        assert components["format"] == 0.0 and components["fault"] == expected_fault, components
        assert info["fault"] and info["fault"]["origin"] == "agent"
        assert info["tool"] in ("sql", "python", "smtp", "http")
        assert obs.startswith(f"{info['tool']} error")
    else:
        assert reward < 0 or result["ok"] is False

    final = _finish_with_oracle(env, obs, info)
    assert final["success"] is True, final.get("task_components")


def http(method: str, path: str, **extra: Any) -> str:
    return format_call("http", {"method": method, "path": path, **extra})


# The http tool, on AgentRL/HTTP-v0 (tests/envs/test_http_env.py sends them to a real upstream too,
# with a second server standing for every host off the allow-list).
_HTTP_CASES: list[tuple[str, str, str, str]] = [
    ("http_absolute_url", http("GET", "http://169.254.169.254/latest/meta-data/"), FORMAT, "not a url of another host"),
    ("http_scheme_relative", http("GET", "//evil.example/v1/tickets"), FORMAT, "not a url of another host"),
    ("http_no_leading_slash", http("GET", "evil.example/v1"), FORMAT, "start with a single '/'"),
    ("http_traversal", http("GET", "/v1/../../etc/passwd"), FORMAT, "'..' segments"),
    ("http_encoded_traversal", http("GET", "/v1/%2e%2e/%2E%2E/etc/passwd"), FORMAT, "'..' segments"),
    ("http_crlf_in_path", http("GET", "/v1/tickets\r\nHost: evil.example"), FORMAT, "cannot"),
    ("http_encoded_crlf_in_path", http("GET", "/v1/tickets%0d%0aHost:%20evil.example"), FORMAT, "control character"),
    ("http_crlf_in_query", http("GET", "/v1/tickets", query={"status": "open\r\nX-Evil: 1"}), FORMAT, "control characters"),
    ("http_query_in_path", http("GET", "/v1/tickets?status=open"), FORMAT, "query parameters in 'query'"),
    ("http_huge_body", http("POST", "/v1/tickets", body={"title": "x" * 200_000}), FORMAT, "the limit is"),
    ("http_huge_path", http("GET", "/" + "a" * 20_000), FORMAT, "the limit is"),
    ("http_method_put", http("PUT", "/v1/tickets/1"), FORMAT, "method must be one of"),
    ("http_method_connect", http("CONNECT", "evil.example:443"), FORMAT, "method must be one of"),
    ("http_headers_argument", http("GET", "/v1", headers={"Host": "evil.example"}), FORMAT, "unknown argument"),
    ("http_body_on_get", http("GET", "/v1/tickets", body={"status": "open"}), FORMAT, "takes no body"),
    ("http_body_not_object", http("POST", "/v1/tickets", body="[1, 2]"), FORMAT, "must be a object"),
    ("http_unknown_collection", http("GET", "/v1/passwords"), REFUSED, "not_found"),
    ("http_write_read_only", http("DELETE", "/v1/staff/1"), REFUSED, "method_not_allowed"),
    ("http_bad_enum", http("PATCH", "/v1/tickets/1", body={"status": "deleted"}), REFUSED, "validation"),
    ("http_unknown_field", http("PATCH", "/v1/tickets/1", body={"owner": "root"}), REFUSED, "validation"),
    ("http_limit_too_large", http("GET", "/v1/tickets", query={"limit": 10**9}), REFUSED, "bad_parameter"),
]


@pytest.fixture(scope="module")
def http_env() -> Iterator[gym.Env[str, str]]:
    e = gym.make("AgentRL/HTTP-v0", python_sandbox=False)
    yield e
    e.close()


@pytest.mark.parametrize(("action", "expect", "marker"), [pytest.param(*c[1:], id=c[0]) for c in _HTTP_CASES])
def test_hostile_http_action(http_env: gym.Env[str, str], action: str, expect: str, marker: str) -> None:
    _step_hostile(http_env, action, expect, marker.lower(), seed=7)


def test_symlink_planted_in_workspace_is_not_attached(env: gym.Env[str, str]) -> None:
    """A link planted in the workspace does not let mail carry outside files. The sandbox refuses to
    let programs create links at all; here the test plants them directly, as a compromised tool might."""
    obs, info = env.reset(seed=1234)
    plant = call("python", code="import os\nos.symlink('/etc/passwd', 'leak.txt')\n")
    obs, *_, info = env.step(plant)
    assert info["tool_result"]["ok"] is False and "PermissionError" in obs  # Landlock: no links from programs
    workspace = env.unwrapped._backend.app.workspace_of(env.unwrapped._episode_id)  # type: ignore[union-attr]
    os.symlink("/etc/passwd", os.path.join(workspace, "leak.txt"))
    os.symlink("/etc", os.path.join(workspace, "results", "etc"))
    for path in ("leak.txt", "results/etc/passwd"):
        obs, _reward, _terminated, _truncated, info = env.step(mail(attachments=[path]))
        assert info["tool_result"]["ok"] is False and info["tool_result"]["error_type"] == "bad_attachment", obs
        assert "outside the workspace" in obs and env.observation_space.contains(obs)
    final = _finish_with_oracle(env, obs, info)
    assert final["success"] is True


def test_python_daemon_does_not_outlive_the_step(env: gym.Env[str, str]) -> None:
    """A double-forked, setsid'd daemon dies with the program (pid namespace), or at the latest with the run."""
    marker = f"61.{os.getpid()}"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.close(1); os.close(2)\n"
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')\n"
    )
    env.reset(seed=4321)
    *_, info = env.step(call("python", code=code))
    assert "parent done" in info["tool_result"]["stdout"]
    time.sleep(0.3)
    survivors = with_marker(marker)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"the agent's daemon survived the run: {survivors}"


@pytest.mark.parametrize("action", [None, b"bytes", 42, {"name": "finish", "arguments": {"answer": "done"}}], ids=repr)
def test_non_str_action_raises_type_error(env: gym.Env[str, str], action: Any) -> None:
    obs, info = env.reset(seed=99)
    with pytest.raises(TypeError, match="must be a str"):
        env.step(action)
    final = _finish_with_oracle(env, obs, info)
    assert final["success"] is True
