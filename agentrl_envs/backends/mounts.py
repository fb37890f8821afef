"""Per-tool backends composed like httpx mounts: ``{"default": "sim", "sql": "postgresql://..."}``.

One backend may hold the episode's workspace (the one serving the tool marked ``hosts_workspace``,
``python``; else the first that has one): when another backend answers a call with a CSV (``sql``),
the CSV is written into that workspace, and when another backend serves a tool with a
``file_argument`` (``smtp``'s attachments), the files are read from it. So the Python tool always finds
the query results and mail can carry workspace files, whatever mix of simulated and real services
is in use.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl_envs.backends.base import Backend, EpisodeSetup, ToolRequest, ToolResponse
from agentrl_envs.errors import ConfigError

__all__ = ["MountedBackend", "make_mounted"]


def make_mounted(spec: dict[str, Any], **options: Any) -> Backend:
    """A :class:`MountedBackend` from ``{"default"?: ..., "<tool>"?: ...}`` over the registry's tools.

    Values: ``"sim"``, ``"direct"``, ``"http://host:port"`` (any tool), a URL of one of a tool's
    ``backend_schemes`` (that tool only: ``"postgresql://..."`` for ``sql``, ``"smtp://host:port"``
    for ``smtp``), or a Backend. A missing tool uses ``default``, which itself defaults to ``"sim"``.
    """
    from agentrl_envs.backends import _single
    from agentrl_envs.tools import TOOLS, service_tools

    tools = service_tools()
    unknown = set(spec) - {"default", *tools}
    if unknown:
        keys = ", ".join(repr(k) for k in ("default", *tools))
        raise ConfigError(f"backend dict: unknown key(s) {sorted(map(str, unknown))}; use {keys}")
    built: dict[str, Backend] = {}

    def build(value: Any, tool: str | None) -> Backend:
        if not isinstance(value, str):
            if isinstance(value, Backend):
                return value
            raise ConfigError(f"backend[{tool or 'default'!r}]={value!r}: expected a URL string or a Backend")
        if value in built:
            return built[value]
        owner = next((name for name in tools if value.startswith(TOOLS[name].backend_schemes)), None)
        if owner is not None:
            if tool != owner:
                raise ConfigError(f"backend[{tool or 'default'!r}]={value[:80]!r}: this URL can only serve {owner!r}")
            backend: Backend = TOOLS[owner].real_backend(value, **options)
        else:
            backend = _single(value, **options)
        built[value] = backend
        return backend

    default_spec = spec.get("default", "sim")
    routes = {tool: build(spec.get(tool, default_spec), tool) for tool in tools}
    return MountedBackend(routes)


class MountedBackend:
    """Routes each tool to its own backend; see the module docstring for the workspace rules."""

    def __init__(self, routes: dict[str, Backend]) -> None:
        from agentrl_envs.tools import service_tools

        missing = set(service_tools()) - set(routes)
        if missing:
            raise ConfigError(f"no backend for tool(s) {sorted(missing)}")
        from agentrl_envs.tools import TOOLS

        self.routes = routes
        self._files = {name: TOOLS[name].file_argument for name in routes if name in TOOLS and TOOLS[name].file_argument}
        self._distinct: list[Backend] = []
        for backend in routes.values():
            if all(backend is not b for b in self._distinct):
                self._distinct.append(backend)
        hosts = [routes[name] for name in routes if name in TOOLS and TOOLS[name].hosts_workspace]
        self._runner: Backend | None = hosts[0] if hosts else None
        self.workspace = next((b for b in (*hosts, *self._distinct) if hasattr(b, "put_file")), None)

    @property
    def sandbox_tier(self) -> str | None:
        """The tier of the backend that runs programs, when it says."""
        return getattr(self._runner, "sandbox_tier", None)

    @property
    def numpy_available(self) -> bool:
        """Whether the backend that runs programs offers numpy, when it says."""
        return bool(getattr(self._runner, "numpy_available", False))

    def open_episode(self, setup: EpisodeSetup) -> None:
        opened: list[Backend] = []
        try:
            for backend in self._distinct:
                backend.open_episode(setup)
                opened.append(backend)
        except Exception:
            for backend in opened:
                backend.close_episode(setup.episode_id)
            raise

    def handle(self, request: ToolRequest) -> ToolResponse:
        backend = self.routes.get(request.tool)
        if backend is None:
            return ToolResponse(ok=False, status=404, error_type="unknown_tool", error=f"no backend for {request.tool!r}")
        host = self.workspace
        file_argument = self._files.get(request.tool)
        if file_argument is not None and backend is not host and host is not None and request.files is None:
            names = request.arguments.get(file_argument)
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                files = {}
                for name in names:
                    data = host.get_file(request.episode_id, name)  # type: ignore[attr-defined]
                    if data is not None:
                        files[name] = data
                request = replace(request, files=files)
        response = backend.handle(request)
        csv_text = response.result.get("csv_text") if response.ok else None
        if isinstance(csv_text, str):
            result = {k: v for k, v in response.result.items() if k != "csv_text"}
            if host is not None and backend is not host:
                host.put_file(request.episode_id, str(result["csv_path"]), csv_text.encode())  # type: ignore[attr-defined]
            response = replace(response, result=result)
        return response

    def close_episode(self, episode_id: str) -> None:
        for backend in self._distinct:
            backend.close_episode(episode_id)

    def close(self) -> None:
        for backend in self._distinct:
            backend.close()
