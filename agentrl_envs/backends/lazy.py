"""Episodes that open on the service at their first use, for the in-process backends.

``reset`` opens an episode, and many episodes end (autoreset, a finish in one step) before they
call a tool, or call one tool only. For the in-process simulator the open is pure overhead until
then: :class:`LazyEpisodes` records the :class:`EpisodeSetup` and opens the episode (database copy,
mailbox, owner token) at its first call, file access or never; closing one that never opened costs
nothing. Behaviour is the same either way: the setup, and so the fault seed, is fixed at reset.
Remote backends (``http``, PostgreSQL, SMTP) open eagerly, so an unreachable service is reported by
``reset``.
"""

from __future__ import annotations

from agentrl_envs.backends.base import EpisodeSetup
from agentrl_envs.errors import ConfigError
from simulators.app import EPISODE_ID

__all__ = ["LazyEpisodes"]


class LazyEpisodes:
    """Mixin: :meth:`open_episode` records the setup; :meth:`_ready` opens it with ``_open_now``."""

    def open_episode(self, setup: EpisodeSetup) -> None:
        """Record the episode; it opens on the service at its first use (see the module docstring).

        Raises:
            ConfigError: the episode id is not ``[A-Za-z0-9_.-]{1,64}``.
        """
        if not isinstance(setup.episode_id, str) or not EPISODE_ID.fullmatch(setup.episode_id):
            raise ConfigError(f"episode_id {str(setup.episode_id)[:80]!r}: use 1-64 characters of [A-Za-z0-9_.-]")
        self.__dict__.setdefault("_lazy_pending", {})[setup.episode_id] = setup

    def _open_now(self, setup: EpisodeSetup) -> None:
        raise NotImplementedError

    def _ready(self, episode_id: str) -> None:
        """Open ``episode_id`` on the service if it is still only recorded."""
        setup = self.__dict__.get("_lazy_pending", {}).pop(episode_id, None)
        if setup is not None:
            self._open_now(setup)
            self.__dict__.setdefault("_lazy_opened", set()).add(episode_id)

    def _was_opened(self, episode_id: str) -> bool:
        """Forget ``episode_id`` here; True if it was opened on the service (which must close it too)."""
        self.__dict__.get("_lazy_pending", {}).pop(episode_id, None)
        opened: set[str] = self.__dict__.get("_lazy_opened", set())
        if episode_id in opened:
            opened.discard(episode_id)
            return True
        return False
