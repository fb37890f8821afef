"""The agentrl envs as OpenEnv environments: ``agentrl-envs openenv ENV_ID [--port 8000]``.

::

    agentrl-envs openenv AgentRL/SQL-v0 --port 8000 --max-sessions 64

    # a client, with OpenEnv's own GenericEnvClient (WebSocket /ws: one session, one env)
    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=3, error_profile="flaky")          # reset keywords pick the session's env
        result = env.step({"tool": "sql", "arguments": {"query": "SELECT 1"}})

One :func:`make_app` call over OpenEnv's ``create_app``, with a typed :class:`AgentRLEnvironment`
(``openenv.core.env_server.Environment``) whose wire types are pydantic models:

- :class:`AgentRLAction`: ``{"tool": NAME, "arguments": {...}}`` (one tool call), or ``{"text": ...}``
  (a raw text action in any format the env parses, e.g. a model's ``<tool_call>`` output);
- :class:`AgentRLObservation`: ``text`` (the observation), ``terminated``, ``truncated``, ``info`` and, at a
  reset, ``tools`` (the env's JSON schemas); OpenEnv's ``reward`` and ``done`` carry the step's reward
  and the episode's end;
- :class:`AgentRLState`: the episode id, step count, env id, task id, the session's ``gym.make``
  keywords and the return so far.

Every step is ``env.step`` of the canonical call text (:mod:`agentrl_envs.integrations.episode`):
faults, the virtual clock and the backend are the env's, and one seed gives the task and rewards
of ``gym.make``. ``reset(seed=..., task_seed=..., env_id=..., **kwargs)`` takes the session's env:
``env_id`` (any registered id; default the server's) and the keywords of
:data:`~agentrl_envs.integrations.episode.SESSION_KWARGS` (``split``, ``error_profile``, ``backend``
among ``sim`` and ``direct``, ``candidates``, ...), over the server's own. OpenEnv's routes are
``/ws`` (a session per connection; what its clients use), ``/health``, ``/schema``, ``/state``,
``/metadata`` and the one-shot ``/reset`` and ``/step`` (a fresh env per request, OpenEnv's
stateless HTTP mode). At most ``max_sessions`` WebSocket sessions are open at once (OpenEnv answers
one more with its ``CAPACITY_REACHED`` error) and one without a message for ``idle_s`` is closed.
"""

from __future__ import annotations

import contextlib
import socket
from functools import partial
from typing import Any

from openenv.core.env_server import Action, ConcurrencyConfig, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from agentrl_envs.errors import ConfigError
from agentrl_envs.integrations.episode import Episode, check_env_id, session_kwargs

__all__ = ["AgentRLAction", "AgentRLEnvironment", "AgentRLObservation", "AgentRLState", "make_app", "serve_openenv"]

#: Largest HTTP request body and WebSocket message: an action is at most 200,000 characters.
MAX_MESSAGE_BYTES = 1 << 20


class AgentRLAction(Action):
    """One tool call (``tool`` and ``arguments``) or one raw text action (``text``)."""

    tool: str | None = Field(default=None, max_length=200, description="the tool to call, e.g. 'sql' or 'finish'")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments (its JSON schema: reset's tools)")
    text: str | None = Field(default=None, description="a raw text action instead, in any tool-call format the env parses")

    @model_validator(mode="after")
    def _one_kind(self) -> AgentRLAction:
        # PydanticCustomError, not ValueError: OpenEnv 0.3 sends the errors as JSON, and a ValueError
        # in them cannot be sent: its WebSocket handler then ends the session.
        if (self.tool is None) == (self.text is None):
            raise PydanticCustomError("one_kind", "give either 'tool' (with 'arguments') or 'text', not both or neither")
        if self.text is not None and self.arguments:
            raise PydanticCustomError("one_kind", "'arguments' go with 'tool'; a 'text' action holds its own")
        return self


class AgentRLObservation(Observation):
    """What a reset or a step returns (``reward`` and ``done`` are OpenEnv's own fields)."""

    text: str = Field(default="", description="the observation: the task at a reset, the tool's result after a step")
    terminated: bool = Field(default=False, description="the episode ended by finish")
    truncated: bool = Field(default=False, description="the episode ended at the step limit or the time budget")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info (reward components, faults, virtual time)")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="at a reset: the env's tools as JSON schemas")


class AgentRLState(State):
    """The session's episode."""

    env_id: str = Field(default="", description="the registered id the session plays")
    task_id: str | None = Field(default=None, description="the episode's task")
    make_kwargs: dict[str, Any] = Field(default_factory=dict, description="the session's gym.make keywords")
    episode_return: float = Field(default=0.0, description="the sum of the episode's rewards so far")
    done: bool = Field(default=False, description="whether the episode has ended")


class AgentRLEnvironment(Environment[AgentRLAction, AgentRLObservation, AgentRLState]):
    """One session's agentrl env behind OpenEnv's ``Environment`` interface.

    Args:
        env_id: the default registered id.
        make_kwargs: the server's ``gym.make`` keywords (any keyword: the operator's); a reset's
            keywords go over them.
        seed: the reset seed when the client gives none (None: a fresh one).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, make_kwargs: dict[str, Any] | None = None, seed: int | None = None) -> None:
        super().__init__()
        self.env_id = check_env_id(env_id)
        self.make_kwargs = dict(make_kwargs or {})
        self.seed = seed
        self._episode: Episode | None = None
        self._episode_id: str | None = None

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        env_id: str | None = None,
        task_seed: int | None = None,
        **kwargs: Any,
    ) -> AgentRLObservation:
        chosen = check_env_id(env_id or self.env_id)
        make_kwargs = {**self.make_kwargs, **session_kwargs(kwargs)}
        episode = self._episode
        if episode is None or episode.env_id != chosen or episode.make_kwargs != make_kwargs:
            fresh = Episode(chosen, **make_kwargs)  # a refused keyword leaves the session's env as it was
            if episode is not None:
                episode.close()
            episode = self._episode = fresh
        instruction, info = episode.reset(seed=self.seed if seed is None else seed, task_seed=task_seed)
        self._episode_id = episode_id or info["task_id"]
        return AgentRLObservation(text=instruction, info=info, tools=episode.tools, reward=0.0, done=False)

    def step(self, action: AgentRLAction, timeout_s: float | None = None, **kwargs: Any) -> AgentRLObservation:
        if self._episode is None:
            raise ConfigError("no episode in progress: send a reset first")
        if action.text is not None:
            outcome = self._episode.step(action.text)
        else:
            outcome = self._episode.call(str(action.tool), action.arguments)
        return AgentRLObservation(
            text=outcome.observation,
            terminated=outcome.terminated,
            truncated=outcome.truncated,
            info=outcome.info,
            reward=outcome.reward,
            done=outcome.done,
        )

    @property
    def state(self) -> AgentRLState:
        episode = self._episode
        if episode is None:
            return AgentRLState(env_id=self.env_id, make_kwargs=self.make_kwargs)
        return AgentRLState(
            episode_id=self._episode_id,
            step_count=episode.steps,
            env_id=episode.env_id,
            task_id=episode.task_id,
            make_kwargs=_json_safe(episode.make_kwargs),
            episode_return=episode.episode_return,
            done=episode.done,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        import agentrl_envs

        return EnvironmentMetadata(
            name=self.env_id,
            description=f"agentrl {self.env_id}: a tool-using agent task with faults and a virtual clock",
            version=agentrl_envs.__version__,
        )

    def close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None


def _json_safe(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v) for k, v in kwargs.items()}


def make_app(
    env_id: str,
    make_kwargs: dict[str, Any] | None = None,
    *,
    seed: int | None = None,
    max_sessions: int = 64,
    idle_s: float | None = 900.0,
) -> ASGIApp:
    """OpenEnv's app for ``env_id`` (routes as in the module docstring), request bodies limited."""
    Episode(env_id, **(make_kwargs or {})).close()  # a bad keyword fails here, before serving
    factory = partial(AgentRLEnvironment, env_id, make_kwargs, seed)
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_s)
    app = create_app(factory, AgentRLAction, AgentRLObservation, env_name=env_id, concurrency_config=config)
    return _BodyLimit(app, MAX_MESSAGE_BYTES)


class _BodyLimit:
    """HTTP 413 for a request body past ``limit`` bytes (FastAPI reads any size).

    Also keeps a client's closing of ``/ws`` quiet: OpenEnv 0.3's handler closes the socket again
    after the client's close, and Starlette raises ``WebSocketDisconnect`` from that second close.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            with contextlib.suppress(WebSocketDisconnect):
                await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            await PlainTextResponse(f"request body over {self.limit} bytes", status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:  # a chunked body past the limit: the app sees a disconnect
                return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)


def serve_openenv(
    env_id: str,
    make_kwargs: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    seed: int | None = None,
    max_sessions: int = 64,
    idle_s: float = 900.0,
) -> int:
    """Serve ``env_id`` as an OpenEnv environment until Ctrl-C."""
    import uvicorn

    app = make_app(env_id, make_kwargs, seed=seed, max_sessions=max_sessions, idle_s=idle_s)
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    print(f"agentrl OpenEnv server for {env_id} on http://{host}:{bound} (/ws, /schema, /health); Ctrl-C stops it", flush=True)
    config = uvicorn.Config(app, log_level="warning", ws_max_size=MAX_MESSAGE_BYTES)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
