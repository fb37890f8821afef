"""The seam every tool call crosses: ``Backend.handle(ToolRequest) -> ToolResponse``.

A backend also opens and closes episodes, because the services hold per-episode state (a private
database copy, a workspace, a mailbox). The env core talks only to this interface and never knows
whether a backend is simulated or real. A new backend is one small file implementing it plus one
entry in :func:`agentrl_envs.backends.make_backend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Backend", "DatabaseSpec", "EpisodeSetup", "ToolRequest", "ToolResponse"]


@dataclass(frozen=True)
class DatabaseSpec:
    """The data of an episode's database.

    Attributes:
        fingerprint: content key; a backend that already holds it does not need ``tables`` again.
        tables: ``{name: {"columns": [[name, "INTEGER"|"REAL"|"TEXT"], ...], "rows": [[...], ...]}}``.
    """

    fingerprint: str
    tables: dict[str, dict[str, Any]] = field(repr=False, compare=False)


@dataclass(frozen=True)
class EpisodeSetup:
    """What a backend needs to start an episode.

    Attributes:
        episode_id: unique id of the episode (``[A-Za-z0-9_.-]{1,64}``).
        database: the episode's data, or None for tools without a database.
        files: text files to place in the workspace, by relative path.
        sender: the From address of mail the agent sends (the env, not the agent, chooses it).
        seed: the episode's seed; backends that draw random numbers (fault injection) derive
            their generator from it, so the same seed gives the same faults.
        mail_domains: recipient domains mail may go to (subdomains included); None allows any.
    """

    episode_id: str
    database: DatabaseSpec | None
    files: dict[str, str] = field(default_factory=dict, repr=False)
    sender: str = "agent@agentrl.example"
    seed: int = 0
    mail_domains: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ToolRequest:
    """One tool call: ``tool`` is a service tool of the registry (``sql``, ``python``, ``smtp``, ``http``); ``arguments`` its JSON arguments;
    ``at_s`` the episode's virtual time when the call goes out (the env owns the clock);
    ``files`` workspace files the call needs, when the backend does not hold the workspace
    itself (attachments of an ``smtp`` call to a real mail server)."""

    episode_id: str
    tool: str
    arguments: dict[str, Any]
    at_s: float = 0.0
    files: dict[str, bytes] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ToolResponse:
    """The outcome of one tool call.

    Attributes:
        ok: the service carried out the call.
        status: HTTP-style status (200 on success; 4xx the call's fault; 5xx the service's).
        result: tool-specific fields on success (rows, stdout, message id, ...).
        error_type: short machine-readable reason on failure (``syntax``, ``timeout``, ...).
        error: human-readable message on failure.
        latency_s: time the call took, in (virtual) seconds.
        fault: set when the call failed because of a fault rather than the call itself:
            ``{"type", "status", "origin"}`` with origin ``injected`` (an error profile),
            ``service`` (a real service answered 5xx/401/403/429) or ``agent`` (the agent's own
            work ran past the timeout); ``retry_after_s`` for 429s.
    """

    ok: bool
    status: int
    result: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    fault: dict[str, Any] | None = None


@runtime_checkable
class Backend(Protocol):
    """Carries tool calls to services, simulated or real."""

    def open_episode(self, setup: EpisodeSetup) -> None:
        """Prepare per-episode state (database copy, workspace, mailbox)."""

    def handle(self, request: ToolRequest) -> ToolResponse:
        """Carry out one call. Failures of the call are responses, not exceptions."""

    def close_episode(self, episode_id: str) -> None:
        """Release per-episode state; closing an unknown episode is not an error."""

    def close(self) -> None:
        """Release everything the backend holds."""
