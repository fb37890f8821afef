"""Analysis that drives whole envs with agents: the reward validation report and reward-model data.

These modules sit above the env core (they import :mod:`agentrl_envs.agents` and run episodes), so
nothing in ``rewards``, ``faults``, ``backends`` or ``simulators`` may import them
(``tests/test_layers.py`` checks it). ``import agentrl_envs`` imports none of them.

- :mod:`agentrl_envs.analysis.report`: ``agentrl-envs check-rewards ID``;
- :mod:`agentrl_envs.analysis.counterfactual`: ``agentrl-envs make-rm-data ID``.
"""

from __future__ import annotations

__all__: list[str] = []
