"""``--rollout-engine server``: the client's answers to broken, refusing and missing servers, and its options.

Stub servers on 127.0.0.1 answer what each test sets; the live path (``agentrl-train serve``) is
tested in ``test_rollout_live.py``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_envs.testing import free_port
from tests.train.conftest import small_config

# -- failures and bad input ----------------------------------------------------------------------


class _Stub(BaseHTTPRequestHandler):
    """A broken OpenAI-compatible server: its answers are set per test in ``answers`` (route -> (status, body))."""

    answers: ClassVar[dict[str, tuple[int, Any]]] = {}

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        status, body = self.answers.get(self.path, (404, {"error": "no route"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serve_stub() -> Iterator[tuple[str, dict[str, tuple[int, Any]]]]:
    """A stub server on 127.0.0.1 and its answers (set them per route)."""
    answers: dict[str, tuple[int, Any]] = {"/v1/models": (200, {"data": []})}
    handler = type("Handler", (_Stub,), {"answers": answers})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def stub() -> Iterator[tuple[str, dict[str, tuple[int, Any]]]]:
    with _serve_stub() as served:
        yield served


def _stub_engine(url: str, **kw: Any) -> Any:
    from agentrl_train.rollout_engine import ServerEngine

    urls = kw.pop("urls", [url])
    return ServerEngine(urls, prefix="t", stop_ids=[0], stops=lambda ids: ids[-1] == 0, vocab_size=100, **({"retries": 0} | kw))


class _Saver:
    adapter = "exec"

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True)


def test_an_unreachable_server_is_a_clear_error() -> None:
    from agentrl_train.rollout_engine import RolloutServerError

    engine = _stub_engine(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(RolloutServerError, match=r"could not be reached.*is the server running"):
            engine.check()
    finally:
        engine.close()


def test_a_server_without_runtime_lora_names_the_option(stub: Any, tmp_path: Path) -> None:
    from agentrl_train.rollout_engine import RolloutServerError

    url, _ = stub
    engine = _stub_engine(url)
    try:
        with pytest.raises(RolloutServerError, match=r"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.*--adapters-root"):
            engine.sync(_Saver(), tmp_path, 0)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        (
            {"text": "hi", "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-1.0, -1.0]}},
            "no token ids.*return_tokens_as_token_ids",
        ),
        ({"text": "hi", "logprobs": None}, "no token ids"),
        ({"logprobs": {"tokens": ["token_id:5", "token_id:0"]}}, "no per-token log-probs"),
        ({"logprobs": {"tokens": ["token_id:500"], "token_logprobs": [-1.0]}}, "outside this model's vocabulary"),
        ({"logprobs": {"tokens": ["token_id:x"], "token_logprobs": [-1.0]}}, "not a number"),
        ({"logprobs": {"tokens": ["token_id:5"], "token_logprobs": [float("nan")]}}, "not a finite number"),
        ({"logprobs": {"tokens": [], "token_logprobs": []}}, "returned 0 tokens"),
        ({"logprobs": {"tokens": ["token_id:5"] * 99, "token_logprobs": [-1.0] * 99}}, "99 tokens for a budget of 8"),
    ],
)
def test_answers_without_what_the_trainer_needs_are_clear_errors(stub: Any, tmp_path: Path, choice: Any, match: str) -> None:
    from agentrl_train.rollout_engine import RolloutServerError

    url, answers = stub
    answers["/v1/load_lora_adapter"] = (200, "ok")
    answers["/v1/completions"] = (200, {"choices": [choice]})
    engine = _stub_engine(url)
    try:
        engine.sync(_Saver(), tmp_path, 0)
        with pytest.raises(RolloutServerError, match=match):
            engine.sample([[1, 2, 3]], 8, [7])
    finally:
        engine.close()


def test_garbage_and_refusals_from_the_server(stub: Any, tmp_path: Path) -> None:
    from agentrl_train.rollout_engine import RolloutServerError

    url, answers = stub
    answers["/v1/load_lora_adapter"] = (200, "ok")
    engine = _stub_engine(url)
    try:
        engine.sync(_Saver(), tmp_path, 0)
        for status, body, match in [
            (200, "not json at all", "no choices"),
            (200, {"choices": []}, "no choices"),
            (400, {"error": "prompt too long"}, "refused to sample an action \\(400.*prompt too long"),
            (401, {"error": "bad key"}, "AGENTRL_ROLLOUT_API_KEY"),
            (500, {"error": "boom"}, "failed to sample an action \\(500.*abandoned whole"),
        ]:
            answers["/v1/completions"] = (status, body)
            with pytest.raises(RolloutServerError, match=match):
                engine.sample([[1, 2]], 8, [1])
    finally:
        engine.close()


def test_the_action_is_cut_where_the_trainers_sampler_stops(stub: Any, tmp_path: Path) -> None:
    """A server that samples past the end of the action (no stop support) gives the trainer's action, not more."""
    url, answers = stub
    answers["/v1/load_lora_adapter"] = (200, "ok")
    toks = ["token_id:5", "token_id:6", "token_id:0", "token_id:9"]
    answers["/v1/completions"] = (200, {"choices": [{"logprobs": {"tokens": toks, "token_logprobs": [-1.0, -2.0, -3.0, -4.0]}}]})
    engine = _stub_engine(url)
    try:
        engine.sync(_Saver(), tmp_path, 0)
        assert engine.sample([[1]], 8, [None]) == [([5, 6, 0], [-1.0, -2.0, -3.0])]
    finally:
        engine.close()


def test_a_failing_server_is_retried_on_the_next_url(stub: Any, tmp_path: Path) -> None:
    """Two servers, the first failing every completion: each request is retried on the other and answered there."""
    from agentrl_train.rollout_engine import RolloutServerError

    url, answers = stub
    good = {"choices": [{"logprobs": {"tokens": ["token_id:5", "token_id:0"], "token_logprobs": [-1.0, -2.0]}}]}
    with _serve_stub() as (other, other_answers):
        for a in (answers, other_answers):
            a["/v1/load_lora_adapter"] = (200, "ok")
        answers["/v1/completions"] = (500, {"error": "boom"})
        other_answers["/v1/completions"] = (200, good)
        engine = _stub_engine(url, urls=[url, other], retries=1)
        try:
            engine.sync(_Saver(), tmp_path, 0)
            assert engine.sample([[1], [2], [3]], 8, [None, 1, 2]) == [([5, 0], [-1.0, -2.0])] * 3
        finally:
            engine.close()
        engine = _stub_engine(url, urls=[url, other], retries=0)  # no retry: the failure is the run's error
        try:
            engine.sync(_Saver(), tmp_path, 1)
            with pytest.raises(RolloutServerError, match=r"500.*abandoned whole"):
                engine.sample([[1], [2]], 8, [None, None])
        finally:
            engine.close()


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"rollout_engine": "server"}, "needs --rollout-url"),
        ({"rollout_engine": "vllm"}, "use one of local, server"),
        ({"rollout_url": ["http://127.0.0.1:1"]}, "read with --rollout-engine server"),
        ({"async_rollouts": 1}, "read with --rollout-engine server"),
        ({"rollout_engine": "server", "rollout_url": ["http://x"], "async_rollouts": 2}, "use 0 \\(off\\) or 1"),
        ({"rollout_engine": "server", "rollout_url": ["http://x"], "mode": "candidates"}, "candidates mode scores"),
        ({"rollout_engine": "server", "rollout_url": ["http://x"], "add_tool_tokens": True}, "--rollout-engine local"),
        ({"rollout_timeout": 0}, "rollout_timeout|rollout-timeout"),
        ({"rollout_retries": -1}, "rollout-retries"),
    ],
)
def test_bad_rollout_options_are_refused(tmp_path: Path, opts: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        small_config(tmp_path, **({"mode": "generate"} | opts))


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://x", "", "   "])
def test_a_url_without_http_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="rollout-url"):
        _stub_engine(url)


@pytest.mark.parametrize(
    "state",
    [{}, {"transitions": "x"}, {"transitions": [[{"bogus": 1}]]}, {"transitions": [], "times": [1]}, {"transitions": None}],
)
def test_a_damaged_pending_rollout_in_a_checkpoint_is_a_clear_error(state: dict[str, Any]) -> None:
    from agentrl_train.rollout_engine import rollout_from_state

    with pytest.raises(ConfigError, match="pending rollout is damaged"):
        rollout_from_state(state)
