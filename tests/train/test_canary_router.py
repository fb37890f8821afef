"""The canary router on its own (no model): sticky routing within binomial bounds, the rules by hand,
manual decisions, and the proxy mode in front of another OpenAI-compatible server (respx-mocked)."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import Any

import httpx
import pytest
import respx

from agentrl_envs.errors import ConfigError
from agentrl_train.serve.app import ServeApp
from agentrl_train.serve.canary import CanaryRules, Router, Target, sticky_unit


def _router(**rules: Any) -> tuple[Router, list[str]]:
    logs: list[str] = []
    router = Router(CanaryRules(**rules), log=logs.append)
    router.add(Target("p", 1, "slot1", "/runs/a"))
    return router, logs


def test_routing_fraction_within_binomial_bounds_and_sticky() -> None:
    router, _ = _router()
    router.start_canary("p", "slot2", "/runs/b", 0.2)
    n = 4000
    ids = [f"ep-{i}" for i in range(n)]
    first = [router.route("p", i).label for i in ids]
    hits = first.count("p@2")
    sigma = math.sqrt(n * 0.2 * 0.8)
    assert abs(hits - 0.2 * n) < 4 * sigma, hits  # 4 sigma: fails about once in 16,000 runs of a fair router
    assert [router.route("p", i).label for i in ids] == first  # sticky per conversation
    assert 0.0 <= sticky_unit("") < 1.0 and sticky_unit("a") == sticky_unit("a") != sticky_unit("b")
    anonymous = [router.route("p", None).label for _ in range(n)].count("p@2")
    assert abs(anonymous - 0.2 * n) < 4 * sigma


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_fraction_bounds_route_all_or_nothing(fraction: float) -> None:
    router, _ = _router()
    router.start_canary("p", "slot2", None, fraction)
    labels = {router.route("p", f"e{i}").label for i in range(200)}
    assert labels == ({"p@2"} if fraction == 1.0 else {"p@1"})


def _episode(router: Router, conversation: str, *, success: bool, parsed: bool, timeout: float = 0.0) -> str:
    target = router.route("p", conversation)
    feedback_id = router.open_episode(target, conversation)
    router.record(target, ok=True, parsed=parsed, latency_s=0.01)
    router.feedback(feedback_id, {"success": success, "timeout_rate": timeout, "api_error_rate": 0.0})
    return target.label


def _drive(router: Router, candidate: dict[str, Any], baseline: dict[str, Any], limit: int = 400) -> None:
    for i in range(limit):
        conv = uuid.UUID(int=i).hex
        label = router.route("p", conv).label
        if router.get("p").canary is None:
            return
        _episode(router, conv, **(candidate if label.endswith("@2") else baseline))


def test_rules_roll_back_a_worse_candidate_with_the_numbers_logged() -> None:
    router, logs = _router(min_episodes=5, success_margin=0.1)
    router.start_canary("p", "slot2", "/runs/b", 0.3)
    _drive(router, {"success": False, "parsed": True}, {"success": True, "parsed": True})
    dep = router.get("p")
    decision = dep.decisions[-1]
    assert decision.action == "rollback" and decision.reason == "failed: success"
    assert dep.stable.label == "p@1" and dep.canary is None
    assert decision.numbers["candidate"]["success_rate"] == 0.0 and decision.numbers["baseline"]["success_rate"] == 1.0
    # The rules judge as soon as both sides have 5 episodes. Which conversations land on the candidate depends on the
    # router's random hashing key, so either side may be the one past 5; the later one has exactly 5.
    c, b = decision.numbers["candidate"]["episodes"], decision.numbers["baseline"]["episodes"]
    assert min(c, b) == 5
    assert f"rollback p@2 vs p@1 (failed: success): episodes {c}/{b}," in logs[-1] and "success 0.000/1.000" in logs[-1]


@pytest.mark.parametrize(
    ("candidate", "failed"),
    [
        ({"success": True, "parsed": True, "timeout": 0.5}, "failed: timeout"),
        ({"success": True, "parsed": False}, "failed: parse"),
    ],
)
def test_each_rule_can_fail_on_its_own(candidate: dict[str, Any], failed: str) -> None:
    router, _ = _router(min_episodes=3)
    router.start_canary("p", "slot2", None, 0.5)
    _drive(router, candidate, {"success": True, "parsed": True})
    assert router.get("p").decisions[-1].reason == failed


def test_a_candidate_within_the_margins_is_promoted() -> None:
    router, _ = _router(min_episodes=4)
    router.start_canary("p", "slot2", None, 0.5)
    _drive(router, {"success": True, "parsed": True}, {"success": True, "parsed": True})
    dep = router.get("p")
    assert dep.decisions[-1].action == "promote" and dep.stable.label == "p@2" and dep.canary is None
    assert router.route("p", "anyone").label == "p@2"


def test_manual_decisions_and_refusals() -> None:
    router, _ = _router(auto=False, min_episodes=1)
    with pytest.raises(ConfigError, match="no canary"):
        router.decide("p", "promote")
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        router.start_canary("p", "slot2", None, 1.5)
    router.start_canary("p", "slot2", None, 0.5)
    with pytest.raises(ConfigError, match="already has a canary"):
        router.start_canary("p", "slot3", None, 0.5)
    _drive(router, {"success": False, "parsed": False}, {"success": True, "parsed": True}, limit=50)
    assert router.get("p").decisions == []  # auto=False: the rules wait for an operator
    assert router.decide("p", "rollback").reason == "manual"
    with pytest.raises(KeyError):
        router.feedback("never-routed", {"success": True})


def _proxy(token: str | None = None) -> ServeApp:
    return ServeApp(
        upstream="http://upstream.test",
        adapters={"tools": "tools-v1"},
        token=token,
        rules=CanaryRules(min_episodes=3),
        log=lambda s: None,
    )


async def _call(app: ServeApp, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve.test") as client:
        return await client.request(method, path, json=body, headers=headers or {})


def test_proxy_mode_canary_in_front_of_another_server() -> None:
    """The router in front of an upstream (as for vLLM with LoRA): a candidate that writes no call is rolled back."""
    app = _proxy()

    def upstream(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        content = '<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"}}</tool_call>' if model == "tools-v1" else "hmm"
        message = {"role": "assistant", "content": content}
        return httpx.Response(
            200, json={"id": "x", "object": "chat.completion", "model": model, "choices": [{"index": 0, "message": message}]}
        )

    body = {
        "model": "tools",
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"type": "function", "function": {"name": "sql"}}],
    }

    async def scenario() -> list[str]:
        r = await _call(app, "POST", "/v1/adapters/tools/canary", {"model": "tools-v2", "fraction": 0.5})
        assert r.status_code == 200, r.text
        assert (await _call(app, "POST", "/v1/adapters/tools/canary", {"path": "/x", "fraction": 0.5})).status_code == 400
        seen = []
        for i in range(200):
            if app.router.get("tools").canary is None:
                break
            ep = f"ep-{i}"
            r = await _call(app, "POST", "/v1/chat/completions", body, {"x-episode-id": ep})
            assert r.status_code == 200, r.text
            seen.append(r.headers["x-adapter-version"])
            assert r.json()["system_fingerprint"] == seen[-1] and r.json()["model"] == "tools"
            assert r.json()["feedback_id"] == r.headers["x-feedback-id"]
            outcome = {"feedback_id": r.headers["x-feedback-id"], "success": seen[-1] == "tools@1"}
            ok = (await _call(app, "POST", "/v1/feedback", outcome)).status_code
            assert ok == 200
        refused = {"feedback_id": "fb-never-issued", "success": True}
        assert (await _call(app, "POST", "/v1/feedback", refused)).status_code == 404
        metrics = (await _call(app, "GET", "/metrics")).text
        assert f"agentrl_serve_feedback_total {len(seen)}\n" in metrics, "a refused post is not counted"
        await app.aclose()
        return seen

    with respx.mock(assert_all_called=True) as mock:
        mock.post("http://upstream.test/v1/chat/completions").mock(side_effect=upstream)
        seen = asyncio.run(scenario())
    dep = app.router.get("tools")
    assert {"tools@1", "tools@2"} == set(seen)
    assert dep.decisions[-1].action == "rollback" and dep.decisions[-1].reason == "failed: success, parse"
    assert dep.stable.model == "tools-v1"


def test_proxy_upstream_down_is_a_502_and_counted() -> None:
    app = _proxy()
    body = {"model": "tools", "messages": [{"role": "user", "content": "go"}]}
    with respx.mock() as mock:
        mock.post("http://upstream.test/v1/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
        r = asyncio.run(_call(app, "POST", "/v1/chat/completions", body))
    assert r.status_code == 502 and "upstream" in r.json()["error"]["message"]
    assert app.router.get("tools").stats["tools@1"].errors == 1


def test_bearer_token() -> None:
    app = _proxy(token="s3cret-token-0123456789")
    assert asyncio.run(_call(app, "GET", "/health")).status_code == 200
    r = asyncio.run(_call(app, "GET", "/v1/models"))
    assert r.status_code == 401 and "bearer token" in r.json()["error"]["message"]
    assert asyncio.run(_call(app, "GET", "/metrics", headers={"authorization": "Bearer wrong"})).status_code == 401
    r = asyncio.run(_call(app, "GET", "/v1/models", headers={"authorization": "Bearer s3cret-token-0123456789"}))
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["tools"]


def test_cli_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl_train.cli import main

    cases = [
        (["serve", "--adapter", "nodir"], "NAME=DIR"),
        (["serve", "--adapter", "a=x", "--adapter", "a=y"], "twice"),
        (["serve", "--host", "0.0.0.0", "--model", "tiny"], "without a bearer token"),
        (["serve", "--upstream", "http://h:1", "--model", "tiny"], "drop --model"),
        (["serve", "--upstream", "h:1", "--adapter", "a=m"], "server root"),
        (["serve", "--adapter", "a=m"], "needs --model"),
        (["serve", "--upstream", "http://h:1", "--adapter", "a=m", "--watch", "b=/tmp"], "not served"),
        (["serve", "--canary-min-episodes", "0", "--model", "tiny"], "min_episodes"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        assert needle in capsys.readouterr().err, argv


@pytest.mark.parametrize(
    ("status", "content", "needle"),
    [
        (200, b"<html>502 Bad Gateway</html>", "not JSON"),
        (200, b"\xff\xfe\x00garbage", "not JSON"),
        (200, b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (200, b"[1, 2]", "not a JSON object"),
        (200, b'{"id": "x"}', "no choices"),
        (200, b'{"choices": []}', "no choices"),
        (200, b'{"choices": "many"}', "no choices"),
        (200, b'{"choices": [1]}', "choices[0] is not a JSON object"),
        (200, b'{"choices": [{"message": "hi"}]}', "choices[0].message is not a JSON object"),
        (200, b'{"choices": [{"message": ["hi"]}]}', "choices[0].message is not a JSON object"),
        (500, b"Internal Server Error", "'Internal Server Error' (not JSON)"),
        (401, b'{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}', ": Incorrect API key"),
        (404, b'{"error": {"message": "The model tools-v1 does not exist."}}', "answered 404: The model tools-v1 does not"),
        (429, b'{"error": "rate limited"}', "answered 429: rate limited"),
        (503, b'{"detail": "' + b"x" * 5000 + b'"}', "answered 503: {'detail': 'xxx"),
        (400, b"\xff\xfe\x00garbage", "not JSON"),
    ],
)
def test_proxy_upstream_failures_say_what_came_back(status: int, content: bytes, needle: str) -> None:
    app = _proxy()
    body = {"model": "tools", "messages": [{"role": "user", "content": "go"}], "tools": [{"function": {"name": "sql"}}]}
    with respx.mock() as mock:
        mock.post("http://upstream.test/v1/chat/completions").mock(return_value=httpx.Response(status, content=content))
        r = asyncio.run(_call(app, "POST", "/v1/chat/completions", body))
    # 502, the upstream's status in the text (its 401 passed through read as our token being wrong), except
    # what the request itself caused, passed as it is so that a client does not retry it as a 502
    assert r.status_code == (status if status in (400, 413, 422, 429) else 502), r.text
    error = r.json()["error"]
    assert error["type"] == "upstream_error" and f"upstream http://upstream.test answered {status}" in error["message"]
    assert needle in error["message"], error["message"]
    assert len(error["message"]) < 500, error["message"]
    assert app.router.get("tools").stats["tools@1"].errors == 1


def test_proxy_reads_an_upstream_answer_up_to_a_cap() -> None:
    """A huge or endless upstream body is a 502 naming the cap, read no further than the cap (it was read whole)."""
    from agentrl_train.serve.upstream import MAX_UPSTREAM_BYTES

    app = _proxy()
    body = {"model": "tools", "messages": [{"role": "user", "content": "go"}]}
    chunk = b" " * (1 << 20)
    sent = [0]

    async def endless() -> Any:  # no content-length: only counting while reading can stop it
        while True:
            sent[0] += 1
            yield chunk

    declared = httpx.Response(200, content=b"", headers={"content-length": str(MAX_UPSTREAM_BYTES + 1)})
    for answer in (declared, httpx.Response(200, content=endless())):
        with respx.mock() as mock:
            mock.post("http://upstream.test/v1/chat/completions").mock(return_value=answer)
            r = asyncio.run(_call(app, "POST", "/v1/chat/completions", body))
        assert r.status_code == 502, r.text
        assert f"over {MAX_UPSTREAM_BYTES} bytes" in r.json()["error"]["message"], r.text
    assert MAX_UPSTREAM_BYTES // len(chunk) < sent[0] <= MAX_UPSTREAM_BYTES // len(chunk) + 2
    assert app.router.get("tools").stats["tools@1"].errors == 2
    just = b'{"choices": [{"message": {"content": "ok"}}], "pad": "' + b" " * (MAX_UPSTREAM_BYTES - 100) + b'"}'
    with respx.mock() as mock:  # an answer under the cap is still served
        mock.post("http://upstream.test/v1/chat/completions").mock(return_value=httpx.Response(200, content=just))
        r = asyncio.run(_call(app, "POST", "/v1/chat/completions", body))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok", r.text[:300]


def test_proxy_keeps_a_usable_answer_with_odd_optional_fields() -> None:
    """No message at all, or content that is not text, is still an answer: only its shape is checked."""
    app = _proxy()
    body = {"model": "tools", "messages": [{"role": "user", "content": "go"}]}
    for answer in ({"choices": [{"index": 0}]}, {"choices": [{"message": {"content": [{"type": "text"}]}}]}):
        with respx.mock() as mock:
            mock.post("http://upstream.test/v1/chat/completions").mock(return_value=httpx.Response(200, json=answer))
            r = asyncio.run(_call(app, "POST", "/v1/chat/completions", body))
        assert r.status_code == 200 and r.json()["system_fingerprint"] == "tools@1", r.text


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--port", "-1"], "--port"),
        (["--port", "65536"], "--port"),
        (["--port", "http"], "--port"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--max-new-tokens", "-5"], "--max-new-tokens"),
        (["--max-new-tokens", "1000000000"], "--max-new-tokens"),
        (["--watch-interval-s", "0"], "--watch-interval-s"),
        (["--watch-interval-s", "-1"], "--watch-interval-s"),
        (["--watch-interval-s", "nan"], "--watch-interval-s"),
        (["--watch-interval-s", "inf"], "--watch-interval-s"),
        (["--watch-interval-s", "soon"], "--watch-interval-s"),
        (["--threads", "0"], "--threads"),
    ],
)
def test_cli_refuses_bad_numbers_at_parse_time(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl_train.cli import build_parser

    with pytest.raises(SystemExit) as info:  # the parser only: a bad number that got through must not start a server
        build_parser().parse_args(["serve", "--model", "tiny", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and repr(argv[1]) in err, err


def test_cli_port_zero_parses() -> None:
    from agentrl_train.cli import build_parser

    args = build_parser().parse_args(["serve", "--port", "0", "--max-new-tokens", "32768", "--watch-interval-s", "0.01"])
    assert (args.port, args.max_new_tokens, args.watch_interval_s) == (0, 32768, 0.01)


def test_head_answers_like_get_without_a_body() -> None:
    """``HEAD /health`` (a load balancer's probe) was a 404; HEAD is GET without the body, token and all."""
    from agentrl_envs.testing import free_port, serve_in_thread

    app = _proxy(token="s3cret-token-0123456789")
    with serve_in_thread(app, free_port()) as url:  # a real uvicorn: it must accept a bodiless answer to HEAD
        got = httpx.get(url + "/health")
        head = httpx.head(url + "/health")
        assert head.status_code == 200 and head.content == b"", head
        assert head.headers["content-type"] == "application/json"
        # /health's body holds its uptime, whose digits vary between two calls: lengths are compared on /v1/models
        assert int(head.headers["content-length"]) > 0 and got.headers["content-length"] == str(len(got.content))
        assert httpx.head(url + "/v1/models").status_code == 401  # no token: as GET
        auth = {"authorization": "Bearer s3cret-token-0123456789"}
        models = httpx.head(url + "/v1/models", headers=auth)
        assert models.status_code == 200 and models.content == b""
        listed = httpx.get(url + "/v1/models", headers=auth)
        assert models.headers["content-length"] == listed.headers["content-length"] == str(len(listed.content))
        assert httpx.head(url + "/metrics", headers=auth).status_code == 200
        r = httpx.head(url + "/v1/chat/completions", headers=auth)
        assert r.status_code == 405 and r.content == b""
        assert httpx.head(url + "/nowhere", headers=auth).status_code == 404
        assert httpx.get(url + "/health").json()["ok"] is True  # the connection still serves after HEADs
    r = asyncio.run(_call(app, "GET", "/v1/chat/completions", headers={"authorization": "Bearer s3cret-token-0123456789"}))
    assert r.status_code == 405 and r.json()["error"]["message"].startswith("GET /v1/chat/completions is not allowed")


def test_cli_port_zero_prints_the_port_bound() -> None:
    """``--port 0`` printed ``http://127.0.0.1:0``; the banner names the port bound, and it serves there."""
    import subprocess
    import sys

    argv = ["serve", "--upstream", "http://127.0.0.1:9", "--adapter", "a=m", "--port", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_train", *argv], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]  # "serve: a@1 from m", then the banner
        banner = lines[-1]
        assert banner.startswith("agentrl-train serve on http://127.0.0.1:"), banner
        url = banner.split()[3]
        port = int(url.rsplit(":", 1)[1])
        assert port != 0, banner
        r = httpx.get(url + "/health", timeout=60)  # bound before the banner: no wait needed
        assert r.status_code == 200 and r.json()["ok"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_cli_a_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A taken port was uvicorn's own log line and exit 1 (after the model load); now exit 2 naming --port."""
    import socket

    from agentrl_train.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", "--upstream", "http://127.0.0.1:9", "--adapter", "a=m", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: cannot listen there" in err and "0 for a free one" in err, err
