"""``agentrl-envs serve``: the simulator behind HTTP, for ``backend="http://..."``.

- ``simulator``: :class:`~agentrl_envs.server.simulator.SimulatorServer`, one process's app over the simulator;
- ``processes``: several worker processes, one port each, started and watched by a supervisor.
"""
