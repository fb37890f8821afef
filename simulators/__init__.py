"""Mock services behind the agentrl tool API.

Each tool has a folder (``sql/``, ``python/``, ``smtp/``, ``http/``) holding a service that turns a request into
a result with no knowledge of Gymnasium, and a ``route.py`` that makes it a tool of the simulator
(found by :mod:`simulators.tools`, with no registration line). :mod:`simulators.app` puts them behind one small REST API,
served in process through an ``httpx.MockTransport`` or over real HTTP.

This package never imports gymnasium, torch or agentrl_envs.
"""

from simulators.app import SimulatorApp

__all__ = ["SimulatorApp"]
