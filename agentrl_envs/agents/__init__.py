"""Agents that drive an env: ``act(observation, info) -> str``.

- ``reference``: :class:`OracleAgent` (the gold plan), :class:`RandomAgent`, :class:`RandomCandidateAgent` and
  :class:`OverlapAgent` (no-model baselines on ``candidates=K``);
- ``openai_chat``: :class:`OpenAIChatAgent`, a model behind an OpenAI-compatible endpoint.
"""

from __future__ import annotations

from agentrl_envs.agents.openai_chat import OpenAIChatAgent
from agentrl_envs.agents.reference import OracleAgent, OverlapAgent, RandomAgent, RandomCandidateAgent

__all__ = ["OpenAIChatAgent", "OracleAgent", "OverlapAgent", "RandomAgent", "RandomCandidateAgent"]
