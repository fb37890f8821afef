"""The simulator's tools: one :class:`~simulators.routes.ToolRoute` per ``simulators/<tool>/route.py``.

Adding a tool to the simulator: its folder with a ``route.py``, and one line here. The app's
dispatch and the OpenAPI document are built from this table.
"""

from __future__ import annotations

from simulators.python.route import ROUTE as PYTHON
from simulators.routes import ToolRoute
from simulators.smtp.route import ROUTE as SMTP
from simulators.sql.route import ROUTE as SQL

__all__ = ["TOOL_ROUTES"]

TOOL_ROUTES: dict[str, ToolRoute] = {r.name: r for r in (SQL, PYTHON, SMTP)}
