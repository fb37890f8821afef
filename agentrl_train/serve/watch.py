"""``agentrl-train serve --watch NAME=DIR``: hot-reload the newest adapter a training run writes under DIR.

Every ``--watch-interval-s`` seconds the newest adapter folder under DIR (:func:`latest_adapter`) is
compared with the one last seen; a new one is loaded as a hot reload of NAME, through the same
:meth:`AdapterAdmin.load <agentrl_train.serve.admin.AdapterAdmin.load>` as ``POST /v1/adapters/NAME``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from agentrl_train.serve.admin import AdapterAdmin
from agentrl_train.serve.wire import HTTPError

__all__ = ["Watcher", "latest_adapter"]


class Watcher:
    """The ``--watch`` folders and the task that polls them.

    Args:
        admin: what loads a new version (under its lock).
        folders: NAME -> the folder a run writes NAME's adapters under.
        interval_s: seconds between two polls.
        log: where loads and failures are reported.
    """

    def __init__(self, admin: AdapterAdmin, folders: dict[str, str], interval_s: float, log: Callable[[str], None]) -> None:
        self.admin, self.folders, self.interval_s, self.log = admin, folders, interval_s, log
        self._watched: dict[str, tuple[str, float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Poll in a task of the running loop (none without folders)."""
        if self.folders:
            self._task = asyncio.create_task(self._loop())

    async def poll(self) -> list[str]:
        """Load the newest adapter under each ``--watch`` folder if it changed; returns the new versions."""
        loaded = []
        for name, folder in self.folders.items():
            found = latest_adapter(folder)
            if found is None or self._watched.get(name) == found:
                continue
            self._watched[name] = found
            try:
                shown = f"--watch {name}: {Path(found[0]).relative_to(Path(folder).expanduser()).as_posix()}"
            except ValueError:
                shown = f"--watch {name}"
            try:
                async with self.admin.lock:
                    answer = await self.admin.load(name, self.admin.deployment(name), found[0], False, 0.0, shown)
            except HTTPError as exc:
                self.log(f"serve: --watch {name}={folder}: {found[0]} not loaded: {exc.message}")
                continue
            loaded.append(answer["version"])
        return loaded

    async def _loop(self) -> None:
        for name, folder in self.folders.items():  # what is there at start-up is what --adapter loaded
            self._watched.setdefault(name, latest_adapter(folder) or ("", 0.0))
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
            except Exception as exc:  # the watcher must not die with the server still up
                self.log(f"serve: --watch failed ({type(exc).__name__}: {exc}); retrying")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def latest_adapter(folder: str | Path) -> tuple[str, float] | None:
    """The newest adapter folder under ``folder`` (itself, or up to two levels down) and its weights' mtime.

    A trainer's ``checkpoints/update-N/`` and ``final/`` are renamed into place complete, so a folder
    seen here is whole; names starting with ``.`` (temporary) are skipped.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        return None
    best: tuple[str, float] | None = None
    level = [root]
    for _ in range(3):
        below: list[Path] = []
        for d in level:
            for f in ("adapter_model.safetensors", "trainable.safetensors"):
                if (d / f).is_file():
                    when = (d / f).stat().st_mtime
                    if best is None or when > best[1]:
                        best = (str(d), when)
            try:
                below += [p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")]
            except OSError:
                continue
        level = below
    return best
