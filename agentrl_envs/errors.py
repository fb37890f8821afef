"""The agentrl exception tree.

::

    AgentRLError
    ├── ActionError          the agent's action could not be parsed or validated (never raised by
    │                        step(): it becomes an error observation and a format penalty)
    ├── ConfigError          a bad make() keyword, profile, backend spec or CLI option
    ├── EpisodeError         step() before reset(), or after the episode ended
    ├── AgentError           an agent could not produce an action (its model endpoint failed)
    │   ├── EndpointUnavailableError  still failing after bounded retries (transport, timeout, 429, 5xx)
    │   └── EndpointResponseError     an answer that retrying will not fix (4xx, not a chat completion)
    └── BackendError         a tool call could not be carried out by the backend
        ├── TransientError   worth retrying (timeouts, 5xx, 429, connection resets)
        └── PermanentError   retrying will not help (bad URL, 4xx from the service)

Every exception pickles with its message intact: they cross process boundaries in async vector envs.
"""

from __future__ import annotations

__all__ = [
    "ActionError",
    "AgentError",
    "AgentRLError",
    "BackendError",
    "ConfigError",
    "EndpointResponseError",
    "EndpointUnavailableError",
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


class AgentError(AgentRLError, RuntimeError):
    """An agent could not produce an action; the episode cannot go on with this agent."""


class EndpointUnavailableError(AgentError):
    """The model endpoint kept failing (transport errors, timeouts, 429, 5xx) after bounded retries."""


class EndpointResponseError(AgentError):
    """The model endpoint answered, but with a 4xx or a body that is not a chat completion."""


class BackendError(AgentRLError):
    """A backend could not carry out a tool call."""


class TransientError(BackendError):
    """A failure that may go away on retry."""


class PermanentError(BackendError):
    """A failure that retrying will not fix."""
