"""An agent that drives the envs through any OpenAI-compatible chat endpoint.

:class:`OpenAIChatAgent` keeps the episode as chat messages and asks ``POST {base_url}/v1/chat/completions``
for each action, so the same envs evaluate a served adapter, a vLLM server or a hosted model. It needs
httpx only (no torch).

What reaches the env, and what is raised instead:

- native ``tool_calls`` become ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` text (several
  calls become several blocks, which the env answers with its ``multiple_calls`` format penalty; invalid
  JSON arguments are passed on as the string the model wrote, which the env answers with ``bad_json``);
- otherwise the message's content goes to the env as it is: ``<tool_call>`` text parses there, and
  anything else gets the env's format penalty. Whatever the model wrote is the model's doing, so it is
  judged by the env, never raised.
- an endpoint that cannot be reached (transport errors, timeouts, 408, 429, 5xx) is retried with capped
  exponential backoff and seeded jitter, honouring ``Retry-After``; after ``max_retries`` retries the agent
  raises :class:`~agentrl_envs.errors.EndpointUnavailableError`. Any other 4xx, a body over
  ``max_response_bytes``, or a body that is not a chat completion (not JSON, no ``choices[0].message``
  object) raises :class:`~agentrl_envs.errors.EndpointResponseError` at once. Both are
  :class:`~agentrl_envs.errors.AgentError`: an agent that cannot reach its model has no action to give,
  and a format penalty would score the endpoint's outage as the model's mistake.

History: after a native tool call the next observation is a ``tool`` message with the call's
``tool_call_id`` (one per call); after text (a ``<tool_call>`` in content, or no call) it is a ``user``
message, because there is no call id to answer.
"""

from __future__ import annotations

import email.utils
import json
import numbers
import random
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from agentrl_envs.backends._deadline import OverBudget, Watchdog
from agentrl_envs.core.actions import MAX_ACTION_CHARS, format_native_call, parse_action
from agentrl_envs.errors import (
    ActionError,
    AgentError,
    ConfigError,
    EndpointResponseError,
    EndpointUnavailableError,
    EpisodeError,
)

__all__ = ["EndpointStats", "OpenAIChatAgent"]

EPISODE_HEADER = "x-episode-id"
#: Timeouts, backoffs and the Retry-After cap at most: a day
MAX_WAIT_S = 86400.0
#: Request keys the agent sets itself, refused in ``extra_body``
_AGENT_BODY_KEYS = frozenset({"model", "messages", "tools", "stream"})
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass
class EndpointStats:
    """Counts over the agent's lifetime (all episodes)."""

    requests: int = 0
    """HTTP requests sent (chat and feedback), retries included."""
    retries: int = 0
    """Requests that repeated a failed one."""
    transport_errors: int = 0
    """Connection failures and timeouts (no HTTP status came back)."""
    timeouts: int = 0
    """The part of ``transport_errors`` that were timeouts."""
    http_errors: int = 0
    """Responses with a 4xx or 5xx status."""
    parse_failures: int = 0
    """Replies whose action the env's grammar rejects (no call, bad JSON, wrong types, several calls)."""
    bad_responses: int = 0
    """Bodies that were not a chat completion (each raised EndpointResponseError)."""
    feedback_sent: int = 0
    """Episode outcomes POSTed to ``/v1/feedback``."""
    feedback_errors: int = 0
    """Outcomes that could not be delivered (a warning, never an exception)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class OpenAIChatAgent:
    """Acts through an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    ``act(observation, info)`` starts a new conversation whenever ``info`` comes from ``reset()``
    (system prompt from ``info["system_prompt"]``, ``info["tools"]`` sent as ``tools``) and sends the
    header ``x-episode-id`` (fresh per episode) so a router can keep an episode on one version.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted too).
        model: the ``model`` field of each request (an adapter name on ``agentrl-train serve``).
        api_key: sent as ``Authorization: Bearer ...`` when given.
        temperature, max_tokens: sent when given (the server's defaults otherwise).
        timeout_s: the budget of one request, from connecting to the answer's last byte (each retry
            gets its own): a server that sends a byte now and then cannot stretch it, as it could a
            per-read timeout. connect_timeout_s: the connection's part of it.
        max_retries: retries of a request after a transport error, timeout, 408, 429 or 5xx.
        backoff_s, max_backoff_s: the first retry waits about ``backoff_s``, doubling up to ``max_backoff_s``
            (times a jitter in [0.5, 1) from the agent's seeded generator).
        max_retry_after_s: cap on a server's ``Retry-After``.
        max_response_bytes: larger bodies are refused (EndpointResponseError).
        extra_headers: added to every request (they may override the defaults).
        extra_body: merged into every chat request (e.g. ``{"top_p": 0.9}``).
        feedback: POST each episode's outcome to ``{base_url}/v1/feedback`` in :meth:`report_outcome`.
        seed: seeds the retry jitter. Episode ids are random (uuid4) whatever the seed, so that two
            clients of one router never share one.
        sleep: how to wait between retries (tests pass a recorder).
        http_client: an httpx.Client to use instead of the agent's own (not closed by :meth:`close`);
            ``timeout_s`` then cuts off a connection it reuses only once the answer's headers are in.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_retry_after_s: float = 30.0,
        max_response_bytes: int = 8 * 1024 * 1024,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        feedback: bool = False,
        seed: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        http_client: httpx.Client | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url={str(base_url)[:80]!r}: use an http:// or https:// URL, e.g. http://127.0.0.1:8000")
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"model={model!r}: use the model (or adapter) name the server serves, e.g. 'tiny'")
        for name, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s), ("max_backoff_s", max_backoff_s)):
            if not _seconds(value) or not value > 0:  # inf: no timeout at all, an agent that can hang for ever
                raise ConfigError(f"{name}={value!r}: use a positive number of seconds, at most {MAX_WAIT_S:g} (a day)")
        for name, value in (("backoff_s", backoff_s), ("max_retry_after_s", max_retry_after_s)):
            if not _seconds(value) or not value >= 0:  # inf: time.sleep(inf) raised a raw OverflowError
                raise ConfigError(f"{name}={value!r}: use a non-negative number of seconds, at most {MAX_WAIT_S:g} (a day)")
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or not 0 <= max_retries <= 100:
            raise ConfigError(f"max_retries={max_retries!r}: use an int in 0-100")
        if not isinstance(max_response_bytes, int) or max_response_bytes < 1024:
            raise ConfigError(f"max_response_bytes={max_response_bytes!r}: use an int >= 1024")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
            raise ConfigError(f"max_tokens={max_tokens!r}: use a positive int or None")
        if temperature is not None and (
            not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2
        ):
            raise ConfigError(f"temperature={temperature!r}: use a number in [0, 2] or None")
        for name, mapping in (("extra_headers", extra_headers), ("extra_body", extra_body)):
            if mapping is not None and not isinstance(mapping, Mapping):  # 5 raised a raw TypeError
                raise ConfigError(f"{name}={mapping!r:.80}: use a dict, e.g. {{'top_p': 0.9}} for extra_body")
        owned = sorted(set(extra_body or {}) & _AGENT_BODY_KEYS)
        if owned:  # "messages" replaced the conversation; "stream" made every reply unreadable
            raise ConfigError(
                f"extra_body sets {owned}: the agent sends model, messages and tools itself and reads one JSON "
                "reply (no stream); pass model= to the constructor and leave these keys out"
            )
        headers = dict(extra_headers or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise ConfigError("extra_headers: use a mapping of str to str")
        if api_key is not None and not isinstance(api_key, str):
            raise ConfigError(f"api_key: use a str, got {type(api_key).__name__}")
        if any(c in text for text in [api_key or "", *headers, *headers.values()] for c in "\r\n\0"):
            raise ConfigError("api_key and extra_headers must not contain CR, LF or NUL (they would split the HTTP header)")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ConfigError(f"seed={seed!r:.80}: use an int, or None")
        if http_client is not None and not isinstance(http_client, httpx.Client):
            raise ConfigError(f"http_client: use an httpx.Client (or None for the agent's own), got {type(http_client).__name__}")
        if not callable(sleep):
            raise ConfigError(f"sleep: use a callable such as time.sleep, got {type(sleep).__name__}")
        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.model = model
        self.timeout_s = float(timeout_s)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, float(backoff_s), float(max_backoff_s)
        self.max_retry_after_s, self.max_response_bytes = float(max_retry_after_s), max_response_bytes
        self.extra_body = dict(extra_body or {})
        self.feedback = feedback
        self.stats = EndpointStats()
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.episode_id: str | None = None
        self._feedback_id: str | None = None  # the server's name for this episode (agentrl-train serve issues one)
        self._headers = {"accept": "application/json", "content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._headers.update({k.lower(): v for k, v in headers.items()})
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._owns_client = http_client is None
        timeout = httpx.Timeout(float(timeout_s), connect=float(connect_timeout_s))
        self._client = http_client if http_client is not None else httpx.Client(timeout=timeout, follow_redirects=False)
        self._pending_ids: list[str] = []
        self._counts = {"tool_calls": 0, "api_errors": 0, "timeouts": 0}
        self._reported: str | None = None
        self._last_stream: Any = None  # the own client's connection, which its next request reuses

    # -- the agent interface ---------------------------------------------------------------------

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """The next action: one chat completion, turned into the env's action text.

        Raises:
            EndpointUnavailableError: the endpoint kept failing after ``max_retries`` retries.
            EndpointResponseError: a 4xx, or a body that is not a chat completion.
            EpisodeError: the first call did not get the ``info`` from ``reset()``.
            TypeError: ``observation`` is not a str or ``info`` not a dict (nothing is sent).

        After an error the history is as it was before the call, so the same call can be made again.
        """
        _check_step_output(observation, info)
        starting = "tools" in info and info.get("step") == 0
        if starting:
            self._start(observation, info)
        elif not self.messages:
            raise EpisodeError(
                "OpenAIChatAgent.act() needs the info from env.reset() first (it holds the system prompt and tools)"
            )
        saved = (len(self.messages), self._pending_ids, dict(self._counts))
        if not starting:
            self._observe(observation, info)
        try:
            message = self._complete()
        except AgentError:
            del self.messages[saved[0] :]
            self._pending_ids, self._counts = saved[1], saved[2]
            raise
        action, reply = self._to_action(message)
        self.messages.append(reply)
        try:
            parse_action(action)
        except ActionError:
            self.stats.parse_failures += 1
        return action

    def report_outcome(self, info: dict[str, Any]) -> dict[str, Any]:
        """The finished episode's outcome; POSTed to ``/v1/feedback`` when ``feedback=True``.

        Call it with the ``info`` of the episode's last step. Rates are per tool call, from the faults
        the agent saw (timeouts count in ``timeout_rate``, injected and service faults in ``api_error_rate``) (``info["fault_stats"]`` values win where it carries them). A failed POST is
        counted in ``stats.feedback_errors`` and warned about, never raised; each episode is sent once.
        """
        if not isinstance(info, Mapping):
            raise TypeError(f"report_outcome(info): use the info dict of the episode's last step, got {type(info).__name__}")
        if self.episode_id is None:
            raise EpisodeError("report_outcome() needs an episode: call act() with the reset info first")
        if self._reported != self.episode_id:
            self._count(info)
        calls = self._counts["tool_calls"]
        raw_stats = info.get("fault_stats")
        fault_stats: dict[str, Any] = raw_stats if isinstance(raw_stats, dict) else {}
        outcome: dict[str, Any] = {
            "episode_id": self.episode_id,
            "model": self.model,
            "task_id": info.get("task_id"),
            "success": bool(info.get("success", False)),
            "steps": _count_of(info.get("step")),
            "tool_calls": calls,
            # the env's rates win where they are numbers; garbage there falls back to the agent's own counts
            "api_error_rate": _rate(fault_stats.get("api_error_rate"), self._counts["api_errors"], calls),
            "timeout_rate": _rate(fault_stats.get("timeout_rate"), self._counts["timeouts"], calls),
            "fault_stats": dict(fault_stats),
        }
        if self.feedback and self._reported != self.episode_id:
            try:
                sent = {**outcome, "feedback_id": self._feedback_id} if self._feedback_id else outcome
                self._post("/v1/feedback", sent)
                self.stats.feedback_sent += 1
            except (EndpointUnavailableError, EndpointResponseError) as exc:
                self.stats.feedback_errors += 1
                warnings.warn(f"episode outcome not delivered: {exc}", RuntimeWarning, stacklevel=2)
        self._reported = self.episode_id
        return outcome

    def close(self) -> None:
        """Close the agent's own HTTP client (a client passed in is left open)."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAIChatAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- conversation ----------------------------------------------------------------------------

    def _start(self, observation: str, info: dict[str, Any]) -> None:
        tools = info.get("tools")
        self.tools = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
        system = info.get("system_prompt")
        self.messages = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
        self.messages.append({"role": "user", "content": observation})
        self.episode_id = f"ep-{uuid.uuid4().hex[:24]}"
        self._feedback_id = None
        self._pending_ids = []
        self._counts = {"tool_calls": 0, "api_errors": 0, "timeouts": 0}

    def _observe(self, observation: str, info: dict[str, Any]) -> None:
        self._count(info)
        if self._pending_ids:
            for call_id in self._pending_ids:
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
        else:
            self.messages.append({"role": "user", "content": observation})
        self._pending_ids = []

    def _count(self, info: dict[str, Any]) -> None:
        """Tally one step's tool call and fault (for the outcome's rates)."""
        tool = info.get("tool")
        if not isinstance(tool, str) or tool == "finish":
            return
        self._counts["tool_calls"] += 1
        fault = info.get("fault")
        if isinstance(fault, dict) and fault:
            if fault.get("type") == "timeout":
                self._counts["timeouts"] += 1
            elif fault.get("origin") in ("injected", "service"):
                self._counts["api_errors"] += 1

    def _complete(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": self.messages}
        if self.tools:
            body["tools"] = self.tools
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        data = self._post("/v1/chat/completions", body)
        if isinstance(data.get("feedback_id"), str):  # the outcome must name it: the server takes no other proof
            self._feedback_id = data["feedback_id"][:200]
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            error = data.get("error")
            detail = f": {str(error.get('message', error) if isinstance(error, dict) else error)[:300]}" if error else ""
            raise self._bad_response(f"the reply has no choices{detail}")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise self._bad_response("choices[0].message is not an object")
        return message

    def _to_action(self, message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The env action for one assistant message, and the message to keep in the history."""
        text = _text(message.get("content"))[:MAX_ACTION_CHARS]
        raw_calls = message.get("tool_calls")
        calls: list[tuple[str, str, Any]] = []
        for i, call in enumerate(raw_calls if isinstance(raw_calls, list) else []):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                continue
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{i}"
            calls.append((str(call_id)[:200], function["name"][:200], function.get("arguments")))
        if not calls:
            return (_text(message.get("content")), {"role": "assistant", "content": text})
        self._pending_ids = [call_id for call_id, _, _ in calls]
        reply: dict[str, Any] = {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments_text(args)}}
                for call_id, name, args in calls
            ],
        }
        return "".join(format_native_call(name, args) for _, name, args in calls), reply

    # -- transport -------------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON with bounded retries; the decoded JSON object of the answer."""
        url = self.base_url + path
        headers = {**self._headers, EPISODE_HEADER: self.episode_id or ""}
        payload = json.dumps(body).encode()
        last, delay = "", 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                self._sleep(delay)
            self.stats.requests += 1
            try:
                status, answer_headers, content = self._send(url, payload, headers)
            except OverBudget:
                self.stats.transport_errors += 1
                self.stats.timeouts += 1
                last = f"timed out: no complete answer within timeout_s={self.timeout_s:g} s, the budget of the whole request"
                delay = self._backoff(attempt)
                continue
            except httpx.TimeoutException as exc:
                self.stats.transport_errors += 1
                self.stats.timeouts += 1
                last, delay = f"timed out ({type(exc).__name__})", self._backoff(attempt)
                continue
            except httpx.TransportError as exc:
                self.stats.transport_errors += 1
                last, delay = f"{type(exc).__name__}: {str(exc)[:200]}", self._backoff(attempt)
                continue
            if status in _RETRY_STATUSES:
                self.stats.http_errors += 1
                wait = _retry_after_s(answer_headers.get("retry-after"))
                last = f"HTTP {status}: {_detail(content)}"
                delay = min(wait, self.max_retry_after_s) if wait is not None else self._backoff(attempt)
                continue
            if 300 <= status < 400:
                self.stats.http_errors += 1
                where = answer_headers.get("location", "")[:200]
                raise EndpointResponseError(
                    f"POST {url} answered HTTP {status} (redirect to {where!r}); use that server as base_url"
                )
            if status >= 400:
                self.stats.http_errors += 1
                raise EndpointResponseError(f"POST {url} answered HTTP {status}: {_detail(content)}; {_hint(status)}")
            try:
                data = json.loads(content)
            except (ValueError, RecursionError):
                raise self._bad_response(f"POST {url}: the body is not JSON ({content[:80]!r})") from None
            if not isinstance(data, dict):
                raise self._bad_response(f"POST {url}: the body is JSON but not an object")
            return data
        raise EndpointUnavailableError(
            f"POST {url} failed {self.max_retries + 1} times (last: {last}); check that the server is up at "
            f"{self.base_url}, or raise max_retries / timeout_s"
        )

    def _send(self, url: str, payload: bytes, headers: dict[str, str]) -> tuple[int, httpx.Headers, bytes]:
        """One request within ``timeout_s``, reading at most ``max_response_bytes`` of the body.

        Raises:
            OverBudget: ``timeout_s`` ran out (the connection was shut down, or a chunk came after it).
        """
        watchdog = Watchdog(self.timeout_s)
        if self._owns_client:  # a reused connection opens nothing the trace would see
            watchdog.watch(self._last_stream)
        try:
            with self._client.stream(
                "POST", url, content=payload, headers=headers, extensions={"trace": watchdog.trace}
            ) as response:
                stream = response.extensions.get("network_stream")
                watchdog.watch(stream)
                if self._owns_client:
                    self._last_stream = stream
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    if watchdog.spent():  # a transport without a socket to shut down
                        raise OverBudget
                    size += len(chunk)
                    if size > self.max_response_bytes:
                        raise self._bad_response(
                            f"POST {url}: the body is over max_response_bytes={self.max_response_bytes}; "
                            "lower max_tokens or raise max_response_bytes"
                        )
                    chunks.append(chunk)
                if watchdog.fired:  # a body that ends at the connection's end looks complete after a shutdown
                    raise OverBudget
                return response.status_code, response.headers, b"".join(chunks)
        except httpx.TransportError:
            if watchdog.fired:
                raise OverBudget from None
            raise
        finally:
            watchdog.cancel()

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2.0**attempt) * (0.5 + 0.5 * self._rng.random())

    def _bad_response(self, message: str) -> EndpointResponseError:
        self.stats.bad_responses += 1
        return EndpointResponseError(f"{message}; is {self.base_url} an OpenAI-compatible server?")


def _check_step_output(observation: Any, info: Any) -> None:
    """TypeError unless ``(observation, info)`` look like what one env's ``reset()`` or ``step()`` returns."""
    if not isinstance(info, Mapping):  # None raised a raw TypeError from "tools" in info
        raise TypeError(
            f"act(observation, info): info must be the dict from env.reset() or env.step(), got {type(info).__name__}"
        )
    if not isinstance(observation, str):  # None went to the server as the user message's content
        raise TypeError(
            f"act(observation, info): observation must be the str from env.reset() or env.step(), "
            f"got {type(observation).__name__} (act on one env at a time, not a vector env's batch)"
        )


def _count_of(value: Any) -> int:
    """A step count from info, 0 when it is no non-negative int."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0 else 0


def _rate(reported: Any, count: int, calls: int) -> float:
    """The env's rate when it is a number in [0, 1]; the agent's own ``count / calls`` otherwise."""
    if isinstance(reported, numbers.Real) and not isinstance(reported, bool) and 0.0 <= float(reported) <= 1.0:
        return float(reported)
    return count / calls if calls else 0.0


def _seconds(value: Any) -> bool:
    """A real number of seconds that is finite and at most :data:`MAX_WAIT_S` (sign checked by the caller)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -MAX_WAIT_S <= value <= MAX_WAIT_S


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps({} if arguments is None else arguments)


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or bad."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if seconds == seconds else None


def _detail(content: bytes) -> str:
    """The server's error message, short."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return content[:200].decode(errors="replace") or "(empty body)"
    error = data.get("error", data) if isinstance(data, dict) else data
    message = error.get("message", error) if isinstance(error, dict) else error
    return str(message)[:300]


def _hint(status: int) -> str:
    if status in (401, 403):
        return "check the API key (--api-key-env)"
    if status == 404:
        return "check the base URL (the server root, without /v1/chat/completions) and the model name"
    if status == 413:
        return "the conversation is too long for the server; lower --max-steps"
    return "the request was refused; fix it rather than retrying"
