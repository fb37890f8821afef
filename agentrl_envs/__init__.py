"""agentrl_envs: Gymnasium environments for tool-using LLM agents.

``import agentrl_envs`` registers ``AgentRL/SQL-v0``, ``AgentRL/Python-v0``, ``AgentRL/SMTP-v0``,
``AgentRL/SQLPythonSMTP-v1``, ``AgentRL/HTTP-v0`` and ``AgentRL/Workplace-v1`` (:data:`ENV_IDS`), and
the earlier versions of :data:`EARLIER_IDS`. It never imports torch, transformers or peft.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from agentrl_envs.errors import (
    ActionError,
    AgentRLError,
    BackendError,
    ConfigError,
    EpisodeError,
    PermanentError,
    TransientError,
)

__version__ = "0.1.0"

ENV_IDS: dict[str, str] = {
    "AgentRL/SQL-v0": "agentrl_envs.core.registered_envs:SQLEnv",
    "AgentRL/Python-v0": "agentrl_envs.core.registered_envs:PythonEnv",
    "AgentRL/SMTP-v0": "agentrl_envs.core.registered_envs:SMTPEnv",
    "AgentRL/SQLPythonSMTP-v1": "agentrl_envs.core.registered_envs:SQLPythonSMTPEnv",
    "AgentRL/HTTP-v0": "agentrl_envs.core.registered_envs:HTTPEnv",
    "AgentRL/Workplace-v1": "agentrl_envs.core.registered_envs:WorkplaceEnv",
}

#: Earlier versions, still registered so that results measured on them can be reproduced (each
#: card's Version History says what changed). ``gym.make``, the CLI and the integrations take them; the
#: GEM and SkyRL-Gym registries list the current ids only.
EARLIER_IDS: dict[str, str] = {
    "AgentRL/SQLPythonSMTP-v0": "agentrl_envs.core.registered_envs:SQLPythonSMTPEnvV0",
    "AgentRL/Workplace-v0": "agentrl_envs.core.registered_envs:WorkplaceEnvV0",
}

#: Every id registered: the current ones, then the earlier versions.
ALL_IDS: dict[str, str] = {**ENV_IDS, **EARLIER_IDS}

for _env_id, _entry_point in ALL_IDS.items():
    if _env_id not in registry:
        # No max_episode_steps: the env truncates itself at max_steps, so a TimeLimit wrapper
        # would only disagree with it.
        register(id=_env_id, entry_point=_entry_point, disable_env_checker=False)

__all__ = [
    "ALL_IDS",
    "EARLIER_IDS",
    "ENV_IDS",
    "ActionError",
    "AgentRLError",
    "BackendError",
    "ConfigError",
    "EpisodeError",
    "PermanentError",
    "TransientError",
    "__version__",
]
