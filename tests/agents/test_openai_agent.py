"""OpenAIChatAgent against respx-mocked endpoints: replies, malformed replies, retries, timeouts, history."""

from __future__ import annotations

import json
import pickle
from typing import Any

import gymnasium as gym
import httpx
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentrl_envs  # noqa: F401
from agentrl_envs.agents import OpenAIChatAgent
from agentrl_envs.core.actions import MAX_ACTION_CHARS, format_call
from agentrl_envs.errors import AgentError, ConfigError, EndpointResponseError, EndpointUnavailableError, EpisodeError
from tests.agents.oracle_replay import OracleReplay

BASE = "http://model.test"
CHAT = f"{BASE}/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "finish", "description": "end", "parameters": {"type": "object"}}}]
RESET_INFO: dict[str, Any] = {"step": 0, "tools": TOOLS, "system_prompt": "You are an agent."}
STEP_INFO: dict[str, Any] = {"step": 1, "tool": "sql", "fault": {}}
KEYS = ("choices", "message", "content", "tool_calls", "function", "name", "arguments", "id", "text", "error")


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def native(name: str, arguments: Any, call_id: str = "call_a") -> dict[str, Any]:
    return completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
        }
    )


def text(content: Any) -> dict[str, Any]:
    return completion({"role": "assistant", "content": content})


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def agent(**kwargs: Any) -> OpenAIChatAgent:
    kwargs.setdefault("sleep", Sleeps())
    kwargs.setdefault("seed", 0)
    return OpenAIChatAgent(BASE, "m", **kwargs)


def request_body(route: respx.Route, i: int = -1) -> dict[str, Any]:
    return json.loads(route.calls[i].request.content)


# ------------------------------------------------------------------------------------- replies


@respx.mock
def test_native_tool_call_becomes_a_tool_call_action_and_its_result_a_tool_message() -> None:
    route = respx.post(CHAT).mock(
        side_effect=[
            httpx.Response(200, json=native("sql", '{"query": "SELECT 1"}', "call_1")),
            httpx.Response(200, json=native("finish", {"answer": "1"}, "call_2")),
        ]
    )
    a = agent(temperature=0.0, max_tokens=64, api_key="sk-test")
    assert a.act("Task: add things", RESET_INFO) == format_call("sql", {"query": "SELECT 1"})
    first = request_body(route, 0)
    assert first["model"] == "m" and first["tools"] == TOOLS and first["temperature"] == 0.0 and first["max_tokens"] == 64
    assert first["messages"] == [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Task: add things"},
    ]
    headers = route.calls[0].request.headers
    assert headers["authorization"] == "Bearer sk-test" and headers["x-episode-id"].startswith("ep-")
    # dict arguments (some servers send an object, not a string) are accepted too
    assert a.act("sql ok: 1 row(s)", STEP_INFO) == format_call("finish", {"answer": "1"})
    second = request_body(route, 1)["messages"]
    assert second[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "sql", "arguments": '{"query": "SELECT 1"}'}}],
    }
    assert second[3] == {"role": "tool", "tool_call_id": "call_1", "content": "sql ok: 1 row(s)"}
    assert route.calls[1].request.headers["x-episode-id"] == headers["x-episode-id"]
    assert (a.stats.requests, a.stats.retries, a.stats.parse_failures, a.stats.bad_responses) == (2, 0, 0, 0)


@respx.mock
def test_text_tool_call_and_plain_content_pass_through_and_results_come_back_as_user_messages() -> None:
    call = '<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"}}</tool_call>'
    route = respx.post(CHAT).mock(
        side_effect=[httpx.Response(200, json=text("Let me look.\n" + call)), httpx.Response(200, json=text("I give up"))]
    )
    a = agent()
    assert a.act("task", RESET_INFO) == "Let me look.\n" + call
    assert a.act("result", STEP_INFO) == "I give up"
    messages = request_body(route, 1)["messages"]
    assert messages[2:] == [{"role": "assistant", "content": "Let me look.\n" + call}, {"role": "user", "content": "result"}]
    assert a.stats.parse_failures == 1  # "I give up" has no call; the env gives its format penalty


def test_plain_content_gets_the_envs_format_penalty() -> None:
    env = gym.make("AgentRL/SQL-v0")
    obs, info = env.reset(seed=0)
    with respx.mock:
        respx.post(CHAT).mock(return_value=httpx.Response(200, json=text("The answer is 42.")))
        a = agent()
        action = a.act(obs, info)
    obs, reward, terminated, truncated, info = env.step(action)
    env.close()
    assert obs.startswith("action error [no_call]") and info["reward_components"]["format"] < 0


@respx.mock
def test_several_native_calls_go_to_the_env_together_and_each_gets_its_result() -> None:
    two = completion(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "sql", "arguments": '{"query": "SELECT 1"}'}},
                {"id": "b", "type": "function", "function": {"name": "sql", "arguments": '{"query": "SELECT 2"}'}},
            ],
        }
    )
    route = respx.post(CHAT).mock(side_effect=[httpx.Response(200, json=two), httpx.Response(200, json=text("x"))])
    a = agent()
    action = a.act("task", RESET_INFO)
    assert action.count("<tool_call>") == 2 and a.stats.parse_failures == 1
    a.act("action error [multiple_calls]: send one", {"step": 1, "tool": None, "fault": {}})
    messages = request_body(route, 1)["messages"]
    assert [m.get("tool_call_id") for m in messages[3:]] == ["a", "b"]


# ---------------------------------------------------------------------------- malformed replies


@pytest.mark.parametrize(
    "body",
    [
        b"not json at all",
        b"[1, 2, 3]",
        b'{"choices": []}',
        b'{"choices": "nope"}',
        b'{"choices": [42]}',
        b'{"choices": [{"message": "hello"}]}',
        b'{"error": {"message": "model overloaded"}}',
        b"[" * 100_000,
        b"",
    ],
)
@respx.mock
def test_a_body_that_is_not_a_chat_completion_raises_a_clear_error_without_retrying(body: bytes) -> None:
    route = respx.post(CHAT).mock(return_value=httpx.Response(200, content=body))
    a = agent()
    with pytest.raises(EndpointResponseError, match="OpenAI-compatible"):
        a.act("task", RESET_INFO)
    assert route.call_count == 1 and a.stats.bad_responses == 1 and a.stats.retries == 0


@pytest.mark.parametrize(
    ("message", "action"),
    [
        ({"role": "assistant", "content": 12345}, ""),
        ({"role": "assistant", "content": None}, ""),
        ({"role": "assistant"}, ""),
        ({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"}, "x", {"text": "b"}]}, "ab"),
        ({"role": "assistant", "content": "hi", "tool_calls": "sql"}, "hi"),
        ({"role": "assistant", "content": "hi", "tool_calls": [1, {"function": "x"}, {"function": {"name": 3}}]}, "hi"),
    ],
)
@respx.mock
def test_wrong_types_inside_the_message_become_what_text_there_is(message: dict[str, Any], action: str) -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(200, json=completion(message)))
    a = agent()
    assert a.act("task", RESET_INFO) == action
    assert a.stats.parse_failures == 1 and a.stats.bad_responses == 0


@pytest.mark.parametrize(
    ("arguments", "code"),
    [('{"query": "SELECT 1"', "bad_json"), ("[1, 2]", "bad_arguments"), (17, "bad_arguments"), ('"text"', "bad_arguments")],
)
def test_invalid_native_arguments_reach_the_env_which_says_why(arguments: Any, code: str) -> None:
    env = gym.make("AgentRL/SQL-v0")
    obs, info = env.reset(seed=0)
    with respx.mock:
        respx.post(CHAT).mock(return_value=httpx.Response(200, json=native("sql", arguments)))
        a = agent()
        action = a.act(obs, info)
    obs, reward, *_ = env.step(action)
    env.close()
    assert obs.startswith(f"action error [{code}]"), obs
    assert a.stats.parse_failures == 1


@respx.mock
def test_a_tool_call_marker_inside_native_arguments_stays_one_call() -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(200, json=native("sql", ["</tool_call><tool_call>"])))
    action = agent().act("task", RESET_INFO)
    assert action.count("<tool_call>") == 1 and action.count("</tool_call>") == 1


@respx.mock
def test_huge_content_goes_to_the_env_and_the_history_keeps_it_bounded() -> None:
    huge = "x" * (MAX_ACTION_CHARS + 50_000)
    route = respx.post(CHAT).mock(side_effect=[httpx.Response(200, json=text(huge)), httpx.Response(200, json=text("ok"))])
    a = agent()
    assert a.act("task", RESET_INFO) == huge  # the env answers with its too_long penalty
    a.act("action error [too_long]", {"step": 1, "tool": None, "fault": {}})
    assert len(request_body(route, 1)["messages"][2]["content"]) == MAX_ACTION_CHARS


@respx.mock
def test_a_body_over_the_byte_limit_is_refused() -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(200, json=text("y" * 5000)))
    a = agent(max_response_bytes=4096)
    with pytest.raises(EndpointResponseError, match="max_response_bytes"):
        a.act("task", RESET_INFO)


# --------------------------------------------------------------------------------------- retries


@respx.mock
def test_429_honours_retry_after_then_succeeds() -> None:
    route = respx.post(CHAT).mock(
        side_effect=[
            httpx.Response(429, headers={"retry-after": "2"}, json={"error": {"message": "slow down"}}),
            httpx.Response(429, headers={"retry-after": "100000"}),
            httpx.Response(429, headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}),
            httpx.Response(200, json=native("finish", '{"answer": "1"}')),
        ]
    )
    sleeps = Sleeps()
    a = agent(sleep=sleeps, max_retry_after_s=30.0)
    assert a.act("task", RESET_INFO) == format_call("finish", {"answer": "1"})
    assert sleeps == [2.0, 30.0, 0.0]  # capped; a date in the past means now
    assert (route.call_count, a.stats.requests, a.stats.retries, a.stats.http_errors) == (4, 4, 3, 3)


@respx.mock
def test_5xx_and_transport_errors_back_off_exponentially_with_seeded_jitter() -> None:
    failures: list[Any] = [
        httpx.Response(500),
        httpx.Response(502),
        httpx.ConnectError("refused"),
        httpx.Response(503, headers={"retry-after": "soon"}),  # unparsable: backoff instead
    ]
    respx.post(CHAT).mock(side_effect=[*failures, httpx.Response(200, json=text("done"))])
    sleeps = Sleeps()
    a = agent(sleep=sleeps, backoff_s=1.0, max_backoff_s=5.0, seed=7)
    assert a.act("task", RESET_INFO) == "done"
    assert len(sleeps) == 4
    for attempt, slept in enumerate(sleeps):
        cap = min(5.0, 2.0**attempt)
        assert 0.5 * cap <= slept < cap
    assert (a.stats.http_errors, a.stats.transport_errors, a.stats.retries) == (3, 1, 4)
    respx.post(CHAT).mock(side_effect=[*failures, httpx.Response(200, json=text("done"))])
    again = Sleeps()
    agent(sleep=again, backoff_s=1.0, max_backoff_s=5.0, seed=7).act("task", RESET_INFO)
    assert again == sleeps


@respx.mock
def test_timeouts_are_retried_and_counted() -> None:
    respx.post(CHAT).mock(
        side_effect=[httpx.ReadTimeout("slow"), httpx.ConnectTimeout("slow"), httpx.Response(200, json=text("x"))]
    )
    a = agent()
    a.act("task", RESET_INFO)
    assert (a.stats.timeouts, a.stats.transport_errors, a.stats.retries) == (2, 2, 2)


@pytest.mark.parametrize("failure", [httpx.Response(500), httpx.ReadTimeout("slow"), httpx.ConnectError("refused")])
@respx.mock
def test_exhausted_retries_raise_endpoint_unavailable(failure: Any) -> None:
    route = respx.post(CHAT).mock(side_effect=[failure] * 10)
    sleeps = Sleeps()
    a = agent(max_retries=3, sleep=sleeps)
    with pytest.raises(EndpointUnavailableError, match="failed 4 times") as caught:
        a.act("task", RESET_INFO)
    assert isinstance(caught.value, AgentError) and "check that the server is up" in str(caught.value)
    assert route.call_count == 4 and a.stats.retries == 3 and len(sleeps) == 3


@respx.mock
def test_a_failed_act_leaves_the_history_as_it_was_so_it_can_be_repeated() -> None:
    route = respx.post(CHAT).mock(
        side_effect=[
            httpx.Response(200, json=native("sql", "{}", "c1")),
            *[httpx.Response(503)] * 2,
            httpx.Response(200, json=text("x")),
        ]
    )
    a = agent(max_retries=1)
    a.act("task", RESET_INFO)
    with pytest.raises(EndpointUnavailableError):
        a.act("result", STEP_INFO)
    assert [m["role"] for m in a.messages] == ["system", "user", "assistant"]
    assert a.act("result", STEP_INFO) == "x"
    assert request_body(route)["messages"][3:] == [{"role": "tool", "tool_call_id": "c1", "content": "result"}]


@pytest.mark.parametrize(("status", "hint"), [(400, "refused"), (401, "API key"), (404, "base URL"), (422, "refused")])
@respx.mock
def test_other_4xx_raise_at_once_with_the_servers_message(status: int, hint: str) -> None:
    route = respx.post(CHAT).mock(return_value=httpx.Response(status, json={"error": {"message": "unknown model 'm'"}}))
    a = agent()
    with pytest.raises(EndpointResponseError, match=f"HTTP {status}: unknown model 'm'.*{hint}"):
        a.act("task", RESET_INFO)
    assert route.call_count == 1 and a.stats.http_errors == 1


@respx.mock
def test_a_redirect_is_not_followed_and_says_where_to() -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(307, headers={"location": "https://elsewhere.test/v1/chat/completions"}))
    with pytest.raises(EndpointResponseError, match=r"redirect to 'https://elsewhere\.test"):
        agent().act("task", RESET_INFO)


def test_a_real_timeout_on_a_silent_loopback_server_is_retried_then_raised() -> None:
    import socket

    with socket.socket() as listener:  # accepts connections (the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        a = OpenAIChatAgent(f"http://127.0.0.1:{port}", "m", timeout_s=0.2, max_retries=1, sleep=Sleeps())
        with pytest.raises(EndpointUnavailableError, match="timed out"):
            a.act("task", RESET_INFO)
        a.close()
    assert a.stats.timeouts == 2


DRIPS = 400  # bytes a dripping server sends before it answers after all: a hang detector


class DripServer:
    """A loopback server that answers a request a byte at a time (every 50 ms, in the headers or the
    body) until the client disconnects, or after :data:`DRIPS` bytes with a complete answer.

    ``where="reused"`` answers a first request at once and drips the headers of the second one, on
    the connection the first left open.
    """

    def __init__(self, where: str) -> None:
        import socket
        import threading

        self.where, self.drips, self.disconnected = where, 0, False
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import time

        full = json.dumps(text("late")).encode()
        conn, _ = self.listener.accept()
        with conn:
            rest = _read_request(conn, b"")
            if self.where == "reused":
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(full) + full)
                _read_request(conn, rest)
            in_body = self.where == "body"
            try:
                if in_body:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (DRIPS + len(full)))
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nx-drip: ")
                for _ in range(DRIPS):
                    time.sleep(0.05)
                    conn.sendall(b" " if in_body else b"a")  # JSON may start with spaces
                    self.drips += 1
                if not in_body:
                    conn.sendall(b"\r\ncontent-length: %d\r\n\r\n" % len(full))
                conn.sendall(full)
                conn.recv(1)  # until the client closes
            except OSError:
                self.disconnected = True

    def close(self) -> None:
        self.thread.join(timeout=60)
        self.listener.close()


def _read_request(conn: Any, data: bytes) -> bytes:
    """Read one request (headers and content-length body) from ``conn``; the bytes after it."""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))[15:])
    while len(body) < length:
        body += conn.recv(65536)
    return body[length:]


@pytest.mark.parametrize("where", ["headers", "body", "reused"])
def test_a_server_that_drips_bytes_is_cut_off_at_timeout_s_for_the_whole_request(where: str) -> None:
    # timeout_s was per read: one byte every 50 ms kept a request alive for as long as the server liked
    server = DripServer(where)
    a = OpenAIChatAgent(server.url, "m", timeout_s=0.5, max_retries=0, sleep=Sleeps())
    try:
        if where == "reused":
            assert a.act("task", RESET_INFO) == "late"
        with pytest.raises(EndpointUnavailableError, match=r"within timeout_s=0\.5 s, the budget of the whole request"):
            a.act("task", RESET_INFO)
    finally:
        a.close()
        server.close()
    assert server.disconnected and server.drips < DRIPS
    assert a.stats.timeouts == 1


# ---------------------------------------------------------------------------- episodes, history


@pytest.mark.parametrize("native_calls", [True, False])
def test_history_across_full_oracle_episodes(native_calls: bool) -> None:
    replay = OracleReplay("AgentRL/SQLPythonSMTP-v1", native=native_calls)
    env = gym.make("AgentRL/SQLPythonSMTP-v1")
    a = agent()
    wins = 0
    with respx.mock:
        respx.post(CHAT).mock(side_effect=replay.respx_side_effect())
        for seed in range(2):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                obs, _, terminated, truncated, info = env.step(a.act(obs, info))
                done = terminated or truncated
            wins += bool(info["success"])
            outcome = a.report_outcome(info)
            assert outcome["success"] and outcome["tool_calls"] == info["step"] - 1
    env.close()
    replay.close()
    assert replay.problems == []
    assert wins == 2 and len(set(replay.episodes)) == 2
    roles = [m["role"] for m in a.messages]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
    result_role = "tool" if native_calls else "user"
    assert roles[2:] == ["assistant", result_role] * ((len(roles) - 3) // 2) + ["assistant"]
    if native_calls:
        for call, result in zip(a.messages[2::2], a.messages[3::2]):
            assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert a.stats.parse_failures == 0 and a.stats.requests == len(replay.bodies)


def test_act_before_reset_info_and_report_before_an_episode_are_clear_errors() -> None:
    a = agent()
    with pytest.raises(EpisodeError, match="reset"):
        a.act("obs", STEP_INFO)
    with pytest.raises(EpisodeError, match="act"):
        a.report_outcome({"success": True})


@respx.mock
def test_feedback_is_off_by_default_and_posts_outcomes_when_on() -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(200, json=text("x")))
    feedback = respx.post(f"{BASE}/v1/feedback").mock(return_value=httpx.Response(200, json={"ok": True}))
    quiet = agent()
    quiet.act("task", RESET_INFO)
    quiet.report_outcome({"success": True, "step": 1})
    assert feedback.call_count == 0
    a = agent(feedback=True)
    a.act("task", RESET_INFO)
    a.act("sql error", {"step": 1, "tool": "sql", "fault": {"type": "http_503", "status": 503, "origin": "injected"}})
    a.act("timed out", {"step": 2, "tool": "python", "fault": {"type": "timeout", "status": 504, "origin": "agent"}})
    a.act("bad sql", {"step": 3, "tool": "sql", "fault": {"type": "sql_error", "status": 400, "origin": "agent"}})
    final = {"step": 4, "tool": "sql", "fault": {}, "success": True, "task_id": "t1", "fault_stats": {"faults": 2}}
    outcome = a.report_outcome(final)
    a.report_outcome(final)  # once per episode
    assert feedback.call_count == 1 and a.stats.feedback_sent == 1
    sent = json.loads(feedback.calls[0].request.content)
    assert sent == outcome
    assert (sent["success"], sent["tool_calls"], sent["api_error_rate"], sent["timeout_rate"]) == (True, 4, 0.25, 0.25)
    assert feedback.calls[0].request.headers["x-episode-id"] == a.episode_id


@respx.mock
def test_feedback_names_the_feedback_id_the_server_issued() -> None:
    """``agentrl-train serve`` takes an outcome only with the ``feedback_id`` of a chat answer in the episode."""
    ids = iter(["fb-first", "fb-second"])
    respx.post(CHAT).mock(side_effect=lambda request: httpx.Response(200, json={**text("x"), "feedback_id": next(ids)}))
    feedback = respx.post(f"{BASE}/v1/feedback").mock(return_value=httpx.Response(200, json={"ok": True}))
    a = agent(feedback=True)
    for want in ("fb-first", "fb-second"):
        a.act("task", RESET_INFO)
        a.report_outcome({"success": True, "step": 1})
        assert json.loads(feedback.calls[-1].request.content)["feedback_id"] == want


@respx.mock
def test_undeliverable_feedback_warns_and_is_counted() -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(200, json=text("x")))
    respx.post(f"{BASE}/v1/feedback").mock(return_value=httpx.Response(404))
    a = agent(feedback=True)
    a.act("task", RESET_INFO)
    with pytest.warns(RuntimeWarning, match="not delivered"):
        a.report_outcome({"success": False, "step": 1})
    assert a.stats.feedback_errors == 1


@respx.mock
def test_episode_ids_are_fresh_per_episode_and_client_even_with_one_seed_and_extra_headers_are_sent() -> None:
    route = respx.post(f"{BASE}/v1/chat/completions").mock(return_value=httpx.Response(200, json=text("x")))
    ids = []
    for _ in range(2):
        a = OpenAIChatAgent(BASE + "/v1/", "m", seed=3, extra_headers={"X-Tenant": "t"}, extra_body={"top_p": 0.5})
        a.act("task", RESET_INFO)
        a.act("task", RESET_INFO)
        ids.append([c.request.headers["x-episode-id"] for c in route.calls[-2:]])
        a.close()
    assert len({*ids[0], *ids[1]}) == 4
    assert route.calls[-1].request.headers["x-tenant"] == "t" and request_body(route)["top_p"] == 0.5
    assert "authorization" not in route.calls[-1].request.headers


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": "ftp://x"},
        {"base_url": "model.test"},
        {"model": ""},
        {"timeout_s": 0},
        {"max_retries": -1},
        {"max_retries": True},
        {"backoff_s": -1},
        {"temperature": 3},
        {"max_tokens": 0},
        {"max_response_bytes": 10},
        {"extra_headers": {"x": 1}},
        {"extra_headers": {"x": "a\r\nx-evil: 1"}},
        {"api_key": "sk\nx"},
        {"api_key": 5},
    ],
)
def test_bad_configuration_is_a_config_error(kwargs: dict[str, Any]) -> None:
    args = {"base_url": BASE, "model": "m", **kwargs}
    with pytest.raises(ConfigError):
        OpenAIChatAgent(**args)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        # inf: no timeout (an agent that can wait for ever) or time.sleep(inf), a raw OverflowError
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"connect_timeout_s": 1e300}, "connect_timeout_s"),
        ({"backoff_s": float("inf")}, "backoff_s"),
        ({"max_backoff_s": float("inf")}, "max_backoff_s"),
        ({"max_retry_after_s": float("inf")}, "max_retry_after_s"),
        ({"max_retry_after_s": float("nan")}, "max_retry_after_s"),
        ({"temperature": True}, "temperature"),  # was sent as JSON true
        ({"extra_body": 5}, "extra_body"),  # raw TypeError: 'int' object is not iterable
        ({"extra_headers": 5}, "extra_headers"),
        ({"extra_body": {"messages": []}}, "extra_body"),  # replaced the whole conversation
        ({"extra_body": {"stream": True}}, "extra_body"),  # every reply unreadable
        ({"extra_body": {"model": "other"}}, "extra_body"),
        ({"seed": [1]}, "seed"),  # raw TypeError from random.Random
        ({"http_client": 5}, "http_client"),  # accepted, then a raw AttributeError at the first act()
        ({"sleep": 5}, "sleep"),  # accepted, then a raw TypeError at the first retry
    ],
    ids=repr,
)
def test_bad_configuration_names_the_argument(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        OpenAIChatAgent(BASE, "m", **kwargs)


@respx.mock
@pytest.mark.parametrize(
    ("observation", "info", "named"),
    [
        ("task", None, "info must be the dict"),  # raw TypeError: argument of type 'NoneType' is not iterable
        ("task", [RESET_INFO], "info must be the dict"),  # raw AttributeError
        (None, RESET_INFO, "observation must be the str"),  # None was sent as the user message
        (("a", "b"), RESET_INFO, "observation must be the str"),  # a vector env's batch
        (5, RESET_INFO, "observation must be the str"),
    ],
    ids=repr,
)
def test_act_with_malformed_observation_or_info_is_a_type_error_and_sends_nothing(
    observation: Any, info: Any, named: str
) -> None:
    route = respx.post(CHAT).mock(return_value=httpx.Response(200, json=text("x")))
    a = agent()
    with pytest.raises(TypeError, match=named):
        a.act(observation, info)
    assert route.call_count == 0 and a.messages == []
    assert a.act("task", RESET_INFO) == "x"  # and the agent still works


@respx.mock
def test_report_outcome_with_garbage_info_is_clear_or_falls_back_to_the_agents_counts() -> None:
    respx.post(CHAT).mock(return_value=httpx.Response(200, json=text("x")))
    a = agent()
    a.act("task", RESET_INFO)
    a.act("sql error", {"step": 1, "tool": "sql", "fault": {"type": "timeout", "origin": "agent"}})
    with pytest.raises(TypeError, match="info dict of the episode's last step"):
        a.report_outcome(None)  # type: ignore[arg-type]
    # a step that is no int and rates that are no numbers raised raw ValueErrors
    outcome = a.report_outcome({"step": "x", "tool": "sql", "fault_stats": {"api_error_rate": "x", "timeout_rate": 7}})
    assert outcome["steps"] == 0 and outcome["tool_calls"] == 2
    assert (outcome["api_error_rate"], outcome["timeout_rate"]) == (0.0, 0.5)


def test_errors_pickle() -> None:
    for exc in (EndpointUnavailableError("down"), EndpointResponseError("bad")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc) and isinstance(again, AgentError)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


CLIENT = httpx.Client()  # one for every example (a client's TLS setup costs more than an example)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON, message=JSON)
def test_any_json_reply_gives_a_str_action_or_an_endpoint_response_error(body: Any, message: Any) -> None:
    with respx.mock:
        respx.post(CHAT).mock(
            side_effect=[httpx.Response(200, json=body), httpx.Response(200, json={"choices": [{"message": message}]})]
        )
        for _ in range(2):
            a = agent(http_client=CLIENT)
            try:
                action = a.act("task", RESET_INFO)
            except EndpointResponseError:
                assert a.stats.bad_responses == 1
            else:
                assert isinstance(action, str)
                assert a.messages[-1]["role"] == "assistant"
                json.dumps(a.messages)  # the history stays sendable
