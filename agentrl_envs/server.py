"""``agentrl-envs serve``: the simulator API over HTTP, optionally with a server-side fault profile.

The stack is uvicorn (with uvloop and httptools when installed) running a plain ASGI callable:
no web framework in between, because every request is a tiny JSON call and framework routing
and validation would cost more than the work. uvicorn is maintained by the Encode team (also
behind httpx and Starlette), is the reference ASGI server, and sets TCP_NODELAY on every
connection (asyncio and uvloop transports both do), so small answers are not held back by
Nagle's algorithm. Handlers run in a thread pool, so a slow Python run in one episode does not
stall the others.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentrl_envs.backends.base import ToolRequest
from agentrl_envs.backends.direct import DirectBackend
from agentrl_envs.backends.wire import AT_HEADER, response_body
from agentrl_envs.faults import ErrorProfile
from agentrl_envs.faults.injector import FaultInjectingBackend
from simulators.app import MAX_REQUEST_BYTES

__all__ = ["SimulatorServer", "serve"]

_TOOLS = ("sql", "python", "smtp")


class SimulatorServer:
    """An ASGI application serving the simulator API.

    Args:
        profile: a fault profile to inject server-side (faults then arrive as HTTP errors).
        sql_deadline_s, python_timeout_s: service limits.
    """

    def __init__(self, profile: ErrorProfile | None = None, sql_deadline_s: float = 2.0, python_timeout_s: float = 5.0) -> None:
        self.direct = DirectBackend(sql_deadline_s=sql_deadline_s, python_timeout_s=python_timeout_s)
        self.faults = FaultInjectingBackend(self.direct, profile) if profile is not None and profile.injects else None

    def dispatch(self, method: str, path: str, body: bytes, at_s: float) -> tuple[int, bytes, dict[str, str]]:
        """Serve one request (runs in a worker thread)."""
        parts = [p for p in path.split("/") if p]
        app = self.direct.app
        if (
            self.faults is not None
            and method == "POST"
            and len(parts) == 4
            and parts[:2] == ["v1", "episodes"]
            and parts[3] in _TOOLS
        ):
            try:
                payload = json.loads(body) if body else {}
            except (ValueError, RecursionError):
                payload = None
            if isinstance(payload, dict):
                response = self.faults.handle(ToolRequest(parts[2], parts[3], payload, at_s=at_s))
                headers = {"content-type": "application/json"}
                if response.fault and "retry_after_s" in response.fault:
                    headers["retry-after"] = str(max(1, round(response.fault["retry_after_s"])))
                return response.status, json.dumps(response_body(response)).encode(), headers
        status, data, headers = app.handle_bytes(method, path, body)
        if self.faults is not None and method == "POST" and parts == ["v1", "episodes"] and status == 201:
            setup = json.loads(body)
            self.faults.start(setup["episode_id"], int(setup.get("seed") or 0))
        if self.faults is not None and method == "DELETE" and len(parts) == 3:
            self.faults.forget(parts[2])
        return status, data, headers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.direct.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= MAX_REQUEST_BYTES + 1:
                chunks.append(chunk)
            more = message.get("more_body", False)
        at_s = 0.0
        for key, value in scope.get("headers", []):
            if key.decode("latin-1").lower() == AT_HEADER.lower():
                try:
                    at_s = float(value)
                except ValueError:
                    at_s = 0.0
        status, data, headers = await asyncio.to_thread(self.dispatch, scope["method"], scope["path"], b"".join(chunks), at_s)
        raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        raw_headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": data})


def serve(host: str = "127.0.0.1", port: int = 8765, profile: ErrorProfile | None = None, **limits: float) -> None:
    """Run the server until interrupted."""
    import uvicorn

    uvicorn.run(SimulatorServer(profile, **limits), host=host, port=port, log_level="warning", access_log=False, lifespan="on")
