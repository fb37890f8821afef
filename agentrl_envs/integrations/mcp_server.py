"""An agentrl env as an MCP tool server: ``agentrl-envs mcp ENV_ID [--transport stdio|http]``.

::

    agentrl-envs mcp AgentRL/SQL-v0                                  # stdio: one session, one episode at a time
    agentrl-envs mcp AgentRL/Workplace-v1 --transport http --port 8766 --error-profile flaky

What a client sees (the ``mcp`` SDK's low-level :class:`~mcp.server.lowlevel.Server`):

- tools: the env's tools (``sql``, ``python``, ``smtp``, ``http``, ``finish``, as the env has them) with
  the env's own JSON schemas, and ``reset`` (``seed``, ``task_seed``: both optional). Each tool call is
  one ``env.step`` of the canonical call text (:mod:`agentrl_envs.integrations.episode`), so faults,
  the virtual clock and the backend are the env's. The result's text is the observation; its
  ``structuredContent`` holds ``observation``, ``reward``, ``terminated``, ``truncated``, ``done``,
  ``episode_return`` and ``info``; ``isError`` is set when the tool did not answer ``ok`` (a refused
  call, an SQL error, an injected fault). A call the env refuses (unknown tool, wrong argument types,
  an action past 200,000 characters) costs the env's format penalty as in process. A call after the
  episode ended, or a bad ``reset``, is a tool error that steps nothing.
- the task: resource ``agentrl://task`` (the instruction) and prompt ``task`` (the instruction as a
  user message). The first tool call, read or prompt of a session starts its episode with the
  server's ``--seed`` when ``reset`` was not called.

Sessions: stdio serves one. Over HTTP (streamable HTTP at ``/mcp``, JSON responses) each MCP session
id has its own episode; at most ``max_sessions`` are open (one more gets HTTP 503 with a JSON-RPC
error), a session without a request for ``idle_s`` is closed, request bodies past
``max_request_bytes`` get 413, and the server binds 127.0.0.1 unless told otherwise. Episodes live in
sessions, so the HTTP server speaks the protocol versions with the ``initialize`` handshake; a
2026-era request without a session gets a JSON-RPC error, on which the SDK's client (``mode="auto"``)
falls back to the handshake.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import agentrl_envs
from agentrl_envs.errors import AgentRLError, ConfigError
from agentrl_envs.integrations.episode import Episode, check_env_id, tool_result

__all__ = ["MCPLimits", "MCPToolServer", "serve_mcp"]

TASK_URI = "agentrl://task"
_STDIO = "stdio"
_SESSION_HEADER = "mcp-session-id"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

RESET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "seed": {"type": "integer", "minimum": 0, "description": "seed of the episode (as env.reset(seed=...)); optional"},
        "task_seed": {"type": "integer", "minimum": 0, "description": "pick the task directly (same task_seed, same task)"},
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class MCPLimits:
    """What one HTTP server holds at most (stdio serves one session)."""

    max_sessions: int = 64
    """Sessions (episodes) open at once; a new session past it gets HTTP 503."""
    idle_s: float = 900.0
    """A session without a request for this long is closed with its episode."""
    max_request_bytes: int = 1 << 20
    """Largest request body; past it HTTP 413 (an action is at most 200,000 characters)."""


@dataclass
class _Session:
    episode: Episode | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class MCPToolServer:
    """The MCP server of one env id, with one episode per MCP session.

    Args:
        env_id: a registered id.
        make_kwargs: ``gym.make`` keywords of every session's env (the operator's: any keyword).
        seed: seed of a session's first episode when the client does not call ``reset`` first
            (None: a fresh one per session).
        limits: the HTTP server's session limits.
    """

    def __init__(
        self, env_id: str, make_kwargs: dict[str, Any] | None = None, *, seed: int | None = None, limits: MCPLimits | None = None
    ) -> None:
        self.env_id = check_env_id(env_id)
        self.make_kwargs = dict(make_kwargs or {})
        self.seed = seed
        self.limits = limits or MCPLimits()
        probe = Episode(env_id, **self.make_kwargs)  # a bad keyword fails here, before serving
        try:
            self._tools = [
                types.Tool(name=s["name"], description=s["description"], input_schema=s["parameters"]) for s in probe.tools
            ]
        finally:
            probe.close()
        self._tools.append(
            types.Tool(name="reset", description="Start a new episode and return its task.", input_schema=RESET_SCHEMA)
        )
        self.sessions: dict[str, _Session] = {}
        self._pending = 0  # new HTTP sessions admitted whose id is not known yet
        names = ", ".join(t.name for t in self._tools if t.name != "reset")
        self.server: Server[Any] = Server(
            "agentrl",
            version=agentrl_envs.__version__,
            instructions=(
                f"{env_id}: solve the task with the tools ({names}); each call is one step of the episode and "
                f"finish ends it. The task is the resource {TASK_URI} and the prompt 'task'; reset starts a new episode."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
        )

    # -- MCP handlers ---------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self._tools))

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        session = self._session(ctx)
        arguments = params.arguments or {}
        async with session.lock:
            try:
                if params.name == "reset":
                    text, data = await anyio.to_thread.run_sync(self._reset, session, arguments)
                    return types.CallToolResult(content=[_text(text)], structured_content=data)
                episode = await self._started(session)
                observation, step, failed = await anyio.to_thread.run_sync(tool_result, episode, params.name, arguments)
            except AgentRLError as exc:
                return types.CallToolResult(content=[_text(f"error: {exc}")], is_error=True)
            finally:
                session.last_used = time.monotonic()
        return types.CallToolResult(content=[_text(observation)], structured_content=step, is_error=failed)

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        task = types.Resource(name="task", uri=TASK_URI, mime_type="text/plain", description="The current episode's task")
        return types.ListResourcesResult(resources=[task])

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if str(params.uri) != TASK_URI:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {str(params.uri)[:80]!r}; this server has {TASK_URI}")
        text = await self._instruction(self._session(ctx))
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=TASK_URI, mime_type="text/plain", text=text)])

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="task", description="The current episode's task")])

    async def _get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        if params.name != "task":
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name[:80]!r}; this server has 'task'")
        text = await self._instruction(self._session(ctx))
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=_text(text))])

    # -- episodes --------------------------------------------------------------------------------

    def _session(self, ctx: ServerRequestContext[Any]) -> _Session:
        headers = getattr(ctx.request, "headers", None)
        key = (headers.get(_SESSION_HEADER) if headers is not None else None) or _STDIO
        session = self.sessions.get(key)
        if session is None:
            if len(self.sessions) >= self.limits.max_sessions:
                raise MCPError(
                    types.INVALID_REQUEST, f"the server holds {self.limits.max_sessions} sessions; close one or try later"
                )
            session = self.sessions[key] = _Session()
        session.last_used = time.monotonic()
        return session

    def _reset(self, session: _Session, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        unknown = sorted(str(k)[:40] for k in arguments if k not in RESET_SCHEMA["properties"])
        if unknown:
            raise ConfigError(f"reset takes seed and task_seed, not {unknown[:5]}")
        if session.episode is None:
            session.episode = Episode(self.env_id, **self.make_kwargs)
        instruction, info = session.episode.reset(seed=arguments.get("seed"), task_seed=arguments.get("task_seed"))
        return instruction, {"instruction": instruction, "info": info}

    async def _started(self, session: _Session) -> Episode:
        """The session's episode, started with the server's seed at its first use."""
        if session.episode is None or not session.episode.started:
            await anyio.to_thread.run_sync(self._reset, session, {} if self.seed is None else {"seed": self.seed})
        assert session.episode is not None
        return session.episode

    async def _instruction(self, session: _Session) -> str:
        async with session.lock:
            episode = await self._started(session)
        return str(episode.instruction)

    async def close_session(self, key: str) -> None:
        session = self.sessions.pop(key, None)
        if session is not None and session.episode is not None:
            async with session.lock:
                await anyio.to_thread.run_sync(session.episode.close)

    async def _sweep(self) -> None:
        """Close sessions idle past ``limits.idle_s`` (the SDK drops their transports at the same age)."""
        while True:
            await anyio.sleep(min(30.0, self.limits.idle_s / 4))
            cutoff = time.monotonic() - self.limits.idle_s
            for key in [k for k, s in self.sessions.items() if s.last_used < cutoff and not s.lock.locked()]:
                await self.close_session(key)

    # -- transports ------------------------------------------------------------------------------

    async def run_stdio(self) -> None:
        """Serve one session over stdin and stdout until the client closes them."""
        try:
            async with stdio_server() as (read_stream, write_stream):
                await self.server.run(read_stream, write_stream, self.server.create_initialization_options())
        finally:
            await self.close_session(_STDIO)

    def http_app(self, host: str = "127.0.0.1") -> Starlette:
        """The streamable-HTTP app (``/mcp``) with the session limit and idle expiry."""
        security = None
        if host in _LOOPBACK:  # the SDK's DNS-rebinding protection for a loopback server
            security = TransportSecuritySettings(
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=True,
            security_settings=security,
            session_idle_timeout=self.limits.idle_s,
            max_request_body_size=self.limits.max_request_bytes,
        )
        gate = _SessionGate(StreamableHTTPASGIApp(manager), self)

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with manager.run(), anyio.create_task_group() as tasks:
                tasks.start_soon(self._sweep)
                try:
                    yield
                finally:
                    tasks.cancel_scope.cancel()
                    for key in list(self.sessions):
                        await self.close_session(key)

        return Starlette(routes=[Route("/mcp", endpoint=gate)], lifespan=lifespan)


class _SessionGate:
    """ASGI in front of the SDK's session manager: the session limit, the handshake era, DELETE."""

    def __init__(self, app: ASGIApp, owner: MCPToolServer) -> None:
        self.app = app
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            message = (
                f"this server keeps an episode per session: use protocol version {HANDSHAKE_PROTOCOL_VERSIONS[-1]} (initialize)"
            )
            await _jsonrpc_error(400, message, scope, receive, send)
            return
        key = headers.get(_SESSION_HEADER)
        if key is None and scope["method"] == "POST":
            await self._open(scope, receive, send)
            return
        if key is not None and key in self.owner.sessions:
            self.owner.sessions[key].last_used = time.monotonic()
        await self.app(scope, receive, send)
        if key is not None and scope["method"] == "DELETE":
            await self.owner.close_session(key)

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = self.owner
        if len(owner.sessions) + owner._pending >= owner.limits.max_sessions:
            message = f"the server holds {owner.limits.max_sessions} sessions (its limit); close one (DELETE) or try later"
            await _jsonrpc_error(503, message, scope, receive, send)
            return

        async def register(message: Message) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name.lower() == _SESSION_HEADER.encode() and value.decode("latin-1") not in owner.sessions:
                        owner.sessions[value.decode("latin-1")] = _Session()
            await send(message)

        owner._pending += 1
        try:
            await self.app(scope, receive, register)
        finally:
            owner._pending -= 1


async def _jsonrpc_error(status: int, message: str, scope: Scope, receive: Receive, send: Send) -> None:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    await JSONResponse(body, status_code=status)(scope, receive, send)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def serve_mcp(
    env_id: str,
    make_kwargs: dict[str, Any],
    *,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8766,
    seed: int | None = None,
    limits: MCPLimits | None = None,
) -> int:
    """Serve ``env_id`` over ``transport`` ("stdio" or "http") until the client leaves or Ctrl-C."""
    server = MCPToolServer(env_id, make_kwargs, seed=seed, limits=limits)
    if transport == "stdio":
        anyio.run(server.run_stdio)
        return 0
    if transport != "http":
        raise ConfigError(f"transport={transport!r}: use 'stdio' or 'http'")
    import uvicorn

    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    print(f"agentrl MCP server for {env_id} on http://{host}:{bound}/mcp; Ctrl-C stops it", file=sys.stderr, flush=True)
    config = uvicorn.Config(server.http_app(host), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
    return 0
