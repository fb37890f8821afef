"""The simulator's tools: one :class:`~simulators.routes.ToolRoute` per ``simulators/<tool>/route.py``.

Routes are found, not listed: every package ``simulators/<tool>/`` that has a ``route.py`` defining
``ROUTE`` (a :class:`ToolRoute` named ``<tool>``) is a tool of the simulator, so adding one needs no
line here. The app's dispatch and the OpenAPI document are built from :data:`TOOL_ROUTES` (in the
order of the folder names). The env side's registry (:data:`agentrl_envs.tools.TOOLS`) is checked
against it by ``tests/envs/test_tool_contract.py``; the simulator may not import the env side
(``tests/test_layers.py``), so the two meet in that test rather than here.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import simulators
from simulators.routes import ToolRoute

__all__ = ["TOOL_ROUTES", "discover_routes"]


def discover_routes(package: str = "simulators") -> dict[str, ToolRoute]:
    """``{name: route}`` of every ``<package>.<tool>.route`` module's ``ROUTE``, sorted by folder name.

    Args:
        package: the package whose subpackages are searched (a test may point it at its own).

    Raises:
        TypeError: a ``route.py`` defines no ``ROUTE``, or one that is not a :class:`ToolRoute`
            named after its folder (rename one of them, or define ``ROUTE = ToolRoute(name=...)``).
    """
    paths = simulators.__path__ if package == "simulators" else importlib.import_module(package).__path__
    routes: dict[str, ToolRoute] = {}
    for info in sorted(pkgutil.iter_modules(paths), key=lambda m: m.name):
        if not info.ispkg or importlib.util.find_spec(f"{package}.{info.name}.route") is None:
            continue
        module = importlib.import_module(f"{package}.{info.name}.route")
        route = getattr(module, "ROUTE", None)
        if not isinstance(route, ToolRoute) or route.name != info.name:
            raise TypeError(
                f"{module.__name__} must define ROUTE = ToolRoute(name={info.name!r}, ...), the tool served at "
                f"POST /v1/episodes/{{id}}/{info.name}; it defines {type(route).__name__} "
                f"{getattr(route, 'name', '')!r}"
            )
        routes[route.name] = route
    return routes


TOOL_ROUTES: dict[str, ToolRoute] = discover_routes()
