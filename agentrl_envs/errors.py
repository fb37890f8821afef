"""The agentrl exception tree.

::

    AgentRLError
    ├── ActionError          the agent's action could not be parsed or validated (never raised by
    │                        step(): it becomes an error observation and a format penalty)
    ├── ConfigError          a bad make() keyword, profile, backend spec or CLI option
    ├── EpisodeError         step() before reset(), or after the episode ended
    └── BackendError         a tool call could not be carried out by the backend
        ├── TransientError   worth retrying (timeouts, 5xx, 429, connection resets)
        └── PermanentError   retrying will not help (bad URL, 4xx from the service)

Every exception pickles with its message intact: they cross process boundaries in async vector envs.
"""

from __future__ import annotations

__all__ = [
    "ActionError",
    "AgentRLError",
    "BackendError",
    "ConfigError",
    "EpisodeError",
    "PermanentError",
    "TransientError",
]


class AgentRLError(Exception):
    """Base of every agentrl error."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), self.args)


class ActionError(AgentRLError):
    """An action that does not follow the grammar; ``code`` is a short machine-readable reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(AgentRLError, ValueError):
    """A configuration value is wrong; the message says which and what is allowed."""


class EpisodeError(AgentRLError, RuntimeError):
    """The env was used out of order (step before reset, step after the episode ended)."""


class BackendError(AgentRLError):
    """A backend could not carry out a tool call."""


class TransientError(BackendError):
    """A failure that may go away on retry."""


class PermanentError(BackendError):
    """A failure that retrying will not fix."""
