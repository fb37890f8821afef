"""The agentrl envs as a verifiers taskset: the Environments Hub package (taskset id ``agentrl-env``).

``vf-eval agentrl-env --env.taskset.env-id AgentRL/SQL-v0 --env.agent.runtime.type subprocess ...``
imports this package and finds the taskset, its task and its harness in ``__all__``; the code lives
in :mod:`agentrl_envs.integrations.verifiers_env`, which documents them.
"""

from agentrl_envs.integrations.verifiers_env import AgentRLHarness, AgentRLTaskset, load_environment

__all__ = ["AgentRLHarness", "AgentRLTaskset", "load_environment"]
