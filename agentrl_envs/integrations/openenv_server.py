"""The agentrl envs as OpenEnv environments: ``agentrl-envs openenv ENV_ID [--port 8000]``.

::

    agentrl-envs openenv AgentRL/SQL-v0 --port 8000 --max-sessions 64

    # a client, with OpenEnv's own GenericEnvClient (WebSocket /ws: one session, one env)
    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=3, error_profile="flaky")          # reset keywords pick the session's env
        result = env.step({"tool": "sql", "arguments": {"query": "SELECT 1"}})

    # the same tools through OpenEnv's MCP client (ListToolsAction / CallToolAction over /ws)
    from openenv.core.mcp_client import MCPToolClient
    with MCPToolClient(base_url="http://127.0.0.1:8000").sync() as env:
        env.reset(seed=3, env_id="AgentRL/SQL-v0")
        tools = env.list_tools()                                     # sql, finish: the env's JSON schemas
        step = env.call_tool("sql", query="SELECT 1")                # observation, reward, done, info, ...

One :func:`make_app` call over OpenEnv's ``create_app``, with a typed :class:`AgentRLEnvironment`
(OpenEnv's ``MCPEnvironment``) whose wire types are pydantic models:

- :class:`AgentRLAction`: ``{"tool": NAME, "arguments": {...}}`` (one tool call), or ``{"text": ...}``
  (a raw text action in any format the env parses, e.g. a model's ``<tool_call>`` output), or
  OpenEnv's MCP actions ``{"type": "list_tools"}`` and ``{"type": "call_tool", "tool_name": NAME,
  "arguments": {...}}`` (what its ``MCPToolClient`` sends);
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

MCP: each session's environment holds a FastMCP server whose tools are its episode's (``sql``,
``python``, ``smtp``, ``http``, ``finish``, as the env has them, with the env's JSON schemas; a reset
to another id swaps them). A tool call is one step of the session's episode, as in
:mod:`agentrl_envs.integrations.mcp_server`: the result's text is the observation, its structured
content holds ``observation``, ``reward``, ``terminated``, ``truncated``, ``done``,
``episode_return`` and ``info``, and it is an error when the tool did not answer ``ok`` (a refused
call, an SQL error, an injected fault); a call before any reset starts an episode with the server's
seed. OpenEnv reaches the tools by

- ``ListToolsAction`` / ``CallToolAction`` steps over ``/ws`` (``MCPToolClient``; the session's
  reset picks the id and the keywords as above): a call's observation also carries the step's
  ``reward`` and ``done``, and an error result sets its ``error`` (``MCPToolClient.call_tool``
  raises it) next to the ``result``;
- JSON-RPC ``tools/list`` and ``tools/call`` at ``POST /mcp`` (the server's default id and keywords;
  ``openenv/session/create`` gives a session, ``session_id`` in the params keeps one episode; an
  error result comes back as a JSON-RPC error), at the WebSocket ``/mcp`` (a session per
  connection) and as ``{"type": "mcp"}`` messages in a ``/ws`` session. ``reset`` is one of
  OpenEnv's reserved tool names: episodes start with OpenEnv's reset, or at the first call.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from functools import partial
from typing import Any, Literal, NamedTuple

import anyio.to_thread
from fastmcp import FastMCP
from fastmcp.tools import Tool as FastMCPTool
from fastmcp.tools.base import ToolResult
from openenv.core.env_server import Action, ConcurrencyConfig, Observation, State, create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from agentrl_envs.errors import ConfigError
from agentrl_envs.integrations.episode import Episode, check_env_id, session_kwargs, tool_result

__all__ = ["AgentRLAction", "AgentRLEnvironment", "AgentRLObservation", "AgentRLState", "make_app", "serve_openenv"]

#: Largest HTTP request body and WebSocket message: an action is at most 200,000 characters.
MAX_MESSAGE_BYTES = 1 << 20


class AgentRLAction(Action):
    """One tool call (``tool`` and ``arguments``), one raw text action (``text``), or an MCP action (``type``)."""

    tool: str | None = Field(default=None, max_length=200, description="the tool to call, e.g. 'sql' or 'finish'")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments (its JSON schema: reset's tools)")
    text: str | None = Field(default=None, description="a raw text action instead, in any tool-call format the env parses")
    type: Literal["list_tools", "call_tool"] | None = Field(
        default=None, description="OpenEnv's MCP actions: 'list_tools', or 'call_tool' with 'tool_name' and 'arguments'"
    )
    tool_name: str | None = Field(default=None, max_length=200, description="with type 'call_tool': the MCP tool to call")

    @model_validator(mode="after")
    def _one_kind(self) -> AgentRLAction:
        # PydanticCustomError, not ValueError: OpenEnv 0.3 sends the errors as JSON, and a ValueError
        # in them cannot be sent: its WebSocket handler then ends the session.
        if [self.tool, self.text, self.type].count(None) != 2:
            raise PydanticCustomError(
                "one_kind", "give one of 'tool' (with 'arguments'), 'text', or an MCP action's 'type', not several or none"
            )
        if self.text is not None and self.arguments:
            raise PydanticCustomError("one_kind", "'arguments' go with 'tool'; a 'text' action holds its own")
        if (self.tool_name is not None) != (self.type == "call_tool"):
            raise PydanticCustomError("one_kind", "'tool_name' goes with type 'call_tool', which needs it")
        if self.type == "list_tools" and self.arguments:
            raise PydanticCustomError("one_kind", "type 'list_tools' takes no 'arguments'")
        return self

    def mcp_action(self) -> ListToolsAction | CallToolAction | None:
        """OpenEnv's own MCP action for an MCP ``type``; None for a tool call or a text action."""
        if self.type == "list_tools":
            return ListToolsAction()
        if self.type == "call_tool":
            return CallToolAction(tool_name=str(self.tool_name), arguments=self.arguments)
        return None


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


class _EpisodeTool(FastMCPTool):
    """One of the env's tools on a session's FastMCP server: a call is one step of the session's episode."""

    call: SkipJsonSchema[Any] = Field(exclude=True)

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        text, data, failed = await anyio.to_thread.run_sync(self.call, self.name, arguments)
        return ToolResult(content=text, structured_content=data, is_error=failed)


class _Listed(NamedTuple):
    """A listed tool, as MCPEnvironment reads one."""

    name: str
    description: str | None
    inputSchema: dict[str, Any]


class AgentRLEnvironment(MCPEnvironment):
    """One session's agentrl env behind OpenEnv's ``Environment`` interface, its tools also as MCP tools.

    Args:
        env_id: the default registered id.
        make_kwargs: the server's ``gym.make`` keywords (any keyword: the operator's); a reset's
            keywords go over them.
        seed: the reset seed when the client gives none (None: a fresh one).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, make_kwargs: dict[str, Any] | None = None, seed: int | None = None) -> None:
        self.env_id = check_env_id(env_id)
        self.make_kwargs = dict(make_kwargs or {})
        self.seed = seed
        self._lock = threading.Lock()  # one call at a time: /ws, /mcp and the MCP tools reach the same episode
        self._episode = Episode(self.env_id, **self.make_kwargs)
        self._episode_id: str | None = None
        super().__init__(FastMCP("agentrl", version=_version()))
        self._tool_names: list[str] = []
        self._set_tools()

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
        with self._lock:
            episode = self._episode
            if episode.env_id != chosen or episode.make_kwargs != make_kwargs:
                fresh = Episode(chosen, **make_kwargs)  # a refused keyword leaves the session's env as it was
                episode.close()
                episode = self._episode = fresh
                self._set_tools()
            instruction, info = episode.reset(seed=self.seed if seed is None else seed, task_seed=task_seed)
            self._episode_id = episode_id or info["task_id"]
        return AgentRLObservation(text=instruction, info=info, tools=episode.tools, reward=0.0, done=False)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        mcp = action.mcp_action() if isinstance(action, AgentRLAction) else None
        return super().step(mcp or action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        mcp = action.mcp_action() if isinstance(action, AgentRLAction) else None
        return await super().step_async(mcp or action, timeout_s=timeout_s, **kwargs)

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> AgentRLObservation:
        if not isinstance(action, AgentRLAction):
            raise ConfigError(f"unexpected action {type(action).__name__}")
        with self._lock:
            if not self._episode.started:
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

    # -- MCP -------------------------------------------------------------------------------------

    def _set_tools(self) -> None:
        """The FastMCP server's tools: the episode's."""
        server = self._require_mcp_server()
        for name in self._tool_names:
            server.local_provider.remove_tool(name)
        schemas = self._episode.tools
        for schema in schemas:
            server.add_tool(
                _EpisodeTool(
                    name=schema["name"], description=schema["description"], parameters=schema["parameters"], call=self._call
                )
            )
        self._tool_names = [schema["name"] for schema in schemas]

    def _call(self, name: str, arguments: Any) -> tuple[str, dict[str, Any] | None, bool]:
        """One MCP tool call (in a worker thread): a step of the episode, started with the server's seed if need be."""
        with self._lock:
            episode = self._episode
            if not episode.started:
                info = episode.reset(seed=self.seed)[1]
                self._episode_id = info["task_id"]
            return tool_result(episode, name, arguments)

    async def _async_list_tools(self) -> list[Any]:
        async with self.mcp_session() as client:
            return [_Listed(t.name, t.description, t.input_schema) for t in await client.list_tools()]

    async def _async_call_tool(self, tool_name: str, arguments: dict[str, Any]) -> Any:
        async with self.mcp_session() as client:
            return await client.call_tool(tool_name, arguments, raise_on_error=False)

    async def _async_handle_call_tool(self, action: CallToolAction, timeout_s: float | None = None) -> CallToolObservation:
        """OpenEnv's call, with the step's reward and done, and an error result as its ``error`` too."""
        observation = await super()._async_handle_call_tool(action, timeout_s=timeout_s)
        result = observation.result
        update: dict[str, Any] = {}
        step = getattr(result, "structured_content", None)
        if isinstance(step, dict) and "reward" in step:
            update.update(reward=step["reward"], done=step["done"])
        if getattr(result, "is_error", False):
            texts = [getattr(block, "text", "") for block in getattr(result, "content", [])]
            known = action.tool_name in self._tool_names
            kind = ToolErrorType.EXECUTION_ERROR if known else ToolErrorType.TOOL_NOT_FOUND
            update["error"] = ToolError(error_type=kind, message="".join(texts))
        return observation.model_copy(update=update) if update else observation

    # -- state -----------------------------------------------------------------------------------

    @property
    def state(self) -> AgentRLState:
        episode = self._episode
        if not episode.started:
            return AgentRLState(env_id=episode.env_id, make_kwargs=_json_safe(episode.make_kwargs))
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
        return EnvironmentMetadata(
            name=self.env_id,
            description=f"agentrl {self.env_id}: a tool-using agent task with faults and a virtual clock",
            version=_version(),
        )

    def close(self) -> None:
        if self.mcp_server is None:  # closed already
            return
        with self._lock:
            self._episode.close()
        super().close()


def _version() -> str:
    import agentrl_envs

    return str(agentrl_envs.__version__)


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
