"""The admin routes of ``agentrl-train serve``: hot reloads, canaries, decisions and vLLM's runtime LoRA routes.

- ``POST /v1/adapters/NAME {"path": DIR}``: a hot reload (see :mod:`agentrl_train.serve.engine`);
  ``POST /v1/adapters/NAME/canary {"path": DIR, "fraction": f}``, ``.../promote``, ``.../rollback``.
- ``POST /v1/load_lora_adapter {"lora_name": NAME, "lora_path": DIR}`` (a new name) and
  ``POST /v1/unload_lora_adapter {"lora_name": NAME}``, answered in plain text as vLLM does.

Every version served is one :class:`~agentrl_train.serve.canary.Target` of the router: its label, where
it came from, what clients are shown and the engine slot that holds it (``model``). Loads run one at a
time (:attr:`AdapterAdmin.lock`). ``DIR`` is a folder under ``--adapters-root``; error messages name it as
the client wrote it, never the server's paths.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl_envs.errors import ConfigError
from agentrl_train.serve.canary import Deployment, Router, Target, check_fraction
from agentrl_train.serve.completions import LoraLoad, LoraUnload
from agentrl_train.serve.limits import ServeLimits
from agentrl_train.serve.status import BASE_NAMES, Counters, served_names
from agentrl_train.serve.wire import HTTPError, parse_body

__all__ = ["AdapterAdmin", "check_name", "hide_paths"]


class _Load(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    fraction: Any = None  # checked by check_fraction (a bool or a string is refused, not coerced)


class AdapterAdmin:
    """Loads, swaps and unloads the served adapters (a local engine), or names upstream models (``--upstream``).

    Args:
        engine: the local model; None with ``upstream``.
        upstream: the upstream's URL, for messages; None with ``engine``.
        router: the served names and versions.
        adapters_root: the folder adapters are loaded from over HTTP; None: such loads are refused.
        limits: the cap on adapter names (:attr:`ServeLimits.max_adapters`).
        counters: where refused loads are counted.
        watched: the names ``--watch`` keeps loading (they cannot be unloaded).
        log: where loads, swaps and refusals are reported.
    """

    def __init__(
        self,
        engine: Any,
        upstream: str | None,
        router: Router,
        adapters_root: Path | None,
        limits: ServeLimits,
        counters: Counters,
        watched: Collection[str],
        log: Callable[[str], None],
    ) -> None:
        self.engine, self.upstream, self.router, self.adapters_root = engine, upstream, router, adapters_root
        self.limits, self.counters, self.watched, self.log = limits, counters, watched, log
        self.lock = asyncio.Lock()  #: held by every load, swap and unload

    def serve_first(self, name: str, where: str) -> None:
        """Serve ``where`` as the first version of ``name`` (``--adapter NAME=DIR``, at start-up)."""
        check_name(name)
        engine = self.engine
        if engine is not None and name == engine.model_name:
            raise ConfigError(
                f"--adapter {name}={where}: {name!r} is the base model's name (--model {engine.model_name}), and "
                f"requests for {name!r} get the base without adapters; serve the adapter under another name"
            )
        if engine is not None:
            slot = engine.add_family(name, engine.prepare(None, where))
            target = Target(name, 1, slot, where, f"--adapter {name}")
        else:
            target = Target(name, 1, where, None, where)
        self.router.add(target)
        self.log(f"serve: {target.label} from {where}")

    async def load_lora(self, body: bytes) -> str:
        """``POST /v1/load_lora_adapter``: serve the adapter folder ``lora_path`` under the new name ``lora_name``."""
        if self.engine is None:
            raise HTTPError(400, f"this server proxies {self.upstream}; load adapters on it (its /v1/load_lora_adapter)")
        req = parse_body(LoraLoad, body)
        name = req.lora_name
        try:
            check_name(name)
        except ConfigError as exc:
            raise HTTPError(400, f"lora_name: {exc}") from None
        if name == self.engine.model_name:
            raise HTTPError(400, f"lora_name {name!r} is the base model's name; load the adapter under another name")
        where, shown = self.under_root(req.lora_path)
        async with self.lock:
            if name in self.router.deployments:
                raise HTTPError(
                    400, f"The lora adapter {name!r} has already been loaded; unload it first (POST /v1/unload_lora_adapter)"
                )
            if len(self.router.deployments) >= self.limits.max_adapters:
                raise HTTPError(
                    400, f"this server holds {len(self.router.deployments)} adapters, its limit (max_adapters): unload one first"
                )
            loop = asyncio.get_running_loop()
            t0 = time.perf_counter()
            try:
                prepared = await loop.run_in_executor(None, self.engine.prepare, None, where)
                slot = await asyncio.wrap_future(self.engine.load_family(name, prepared))
            except ConfigError as exc:
                self.counters.refused_loads += 1
                self.log(f"serve: refused {name} from {where}: {exc}")
                raise HTTPError(400, hide_paths(str(exc), where, shown, self.adapters_root)) from None
            target = Target(name, 1, slot, where, shown)
            self.router.add(target)
        self.log(f"serve: loaded {target.label} from {where} in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_lora(self, body: bytes) -> str:
        """``POST /v1/unload_lora_adapter``: stop serving ``lora_name`` and free its slots."""
        if self.engine is None:
            raise HTTPError(400, f"this server proxies {self.upstream}; unload adapters on it (its /v1/unload_lora_adapter)")
        name = parse_body(LoraUnload, body).lora_name
        async with self.lock:
            if name not in self.router.deployments:
                raise HTTPError(404, f"The lora adapter {name[:100]!r} cannot be found.", "not_found_error")
            if name in self.watched:
                raise HTTPError(400, f"{name!r} is watched (--watch {name}=DIR); restart the server without it to unload it")
            dep = self.router.remove(name)
            served = sorted([dep.stable, *([dep.canary] if dep.canary is not None else [])], key=lambda t: t.version)
            slots = [t.model for t in served]
            await asyncio.wrap_future(self.engine.drop_family(name, slots))
        self.log(f"serve: unloaded {name}")
        return f"Success: LoRA adapter '{name}' removed successfully."

    async def change(self, name: str, action: str | None, body: bytes) -> dict[str, Any]:
        """``POST /v1/adapters/NAME[/canary|promote|rollback]``: a hot reload, a canary, or a decision on one."""
        dep = self.deployment(name)
        if action in ("promote", "rollback"):
            try:
                decision = self.router.decide(name, action)
            except ConfigError as exc:
                raise HTTPError(409, str(exc), "conflict_error") from None
            return {"decision": decision.as_dict(), **dep.describe()}
        if action not in (None, "canary"):
            raise HTTPError(404, f"no route POST /v1/adapters/{name}/{action[:50]}; use canary, promote or rollback")
        req = parse_body(_Load, body)
        if action == "canary":
            if req.fraction is None:
                raise HTTPError(400, 'a canary needs "fraction" in [0, 1], e.g. {"path": DIR, "fraction": 0.05}')
            try:
                check_fraction(req.fraction)
            except ConfigError as exc:
                raise HTTPError(400, str(exc)) from None
        elif req.fraction is not None:
            raise HTTPError(400, f'"fraction" is for POST /v1/adapters/{name}/canary; a hot reload takes {{"path": DIR}}')
        where = req.path if self.engine is not None else req.model
        if not where:
            need = '{"path": DIR}' if self.engine is not None else '{"model": UPSTREAM_MODEL_NAME}'
            raise HTTPError(
                400, f"send {need} (this server {'loads adapters itself' if self.engine else 'proxies ' + str(self.upstream)})"
            )
        shown = where
        if self.engine is not None:
            where, shown = self.under_root(where)
        async with self.lock:
            if action == "canary" and dep.canary is not None:
                raise HTTPError(
                    409, f"{name} already has a canary ({dep.canary.label}); promote or roll it back first", "conflict_error"
                )
            if self.engine is None:
                target = (
                    self.router.start_canary(name, where, None, req.fraction or 0.0, where)
                    if action == "canary"
                    else self.router.replace_stable(name, where, None, where)
                )
                return {"version": target.label, **dep.describe()}
            return await self.load(name, dep, where, action == "canary", req.fraction or 0.0, shown)

    def under_root(self, asked: str) -> tuple[str, str]:
        """The folder ``asked`` names under :attr:`adapters_root` (symlinks resolved) and how to show it.

        Raises:
            HTTPError: 403 without a root, or for a folder outside it (named as the client wrote it).
        """
        if self.adapters_root is None:
            raise HTTPError(
                403,
                "this server loads no adapters over HTTP: start it with --adapters-root DIR and send a folder under DIR",
                "permission_error",
            )
        try:
            where = (self.adapters_root / asked).resolve()  # an absolute `asked` stays itself, then must be inside
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            where = None
        if where is None or not where.is_relative_to(self.adapters_root):
            raise HTTPError(
                403,
                f"path {asked[:200]!r} is outside the adapters root; send a folder under --adapters-root "
                "(relative to it, e.g. runs/ppo/final)",
                "permission_error",
            )
        return str(where), where.relative_to(self.adapters_root).as_posix() or "."

    async def load(self, name: str, dep: Deployment, path: str, canary: bool, fraction: float, shown: str) -> dict[str, Any]:
        """Read, check and swap in the adapter at ``path``; ``shown`` is what clients see instead of it."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            prepared = await loop.run_in_executor(None, self.engine.prepare, name, path)
        except ConfigError as exc:
            self.counters.refused_loads += 1
            self.log(f"serve: refused {name} from {path}: {exc}")
            raise HTTPError(422, hide_paths(str(exc), path, shown, self.adapters_root)) from None
        read_s = time.perf_counter() - t0
        if canary:
            slot = await loop.run_in_executor(None, self.engine.spare_slot, name)
        else:
            slot = dep.stable.model
        # The copy is queued behind the requests already admitted and runs before any later one: the
        # router must point at the new version from the moment the copy is queued.
        future = self.engine.install(slot, prepared)
        if canary:
            target = self.router.start_canary(name, slot, path, fraction, shown)
        else:
            target = self.router.replace_stable(name, slot, path, shown)
        swap_s = await asyncio.wrap_future(future)
        del prepared
        self.log(
            f"serve: {'canary' if canary else 'swapped in'} {target.label} from {path}: read+check {read_s * 1e3:.1f} ms, swap {swap_s * 1e3:.2f} ms"
        )
        return {"version": target.label, "swap_ms": round(swap_s * 1e3, 3), "read_ms": round(read_s * 1e3, 3), **dep.describe()}

    def deployment(self, name: str) -> Deployment:
        """``name``'s deployment; a 404 that lists the served names when there is none."""
        try:
            return self.router.get(name)
        except KeyError:
            served = served_names(self.router, self.engine is not None)
            raise HTTPError(
                404,
                f"unknown adapter {name[:100]!r}; served: {served} (start the server with --adapter {name}=DIR)",
                "not_found_error",
            ) from None


def check_name(name: str) -> None:
    """Refuse an adapter name a URL or a log line could not carry (or the base's name, ``base``)."""
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum() or name in BASE_NAMES or len(name) > 100:
        raise ConfigError(f"adapter name {name[:100]!r}: use letters, digits, '-', '_' or '.' (and not 'base')")


def hide_paths(message: str, path: str, shown: str, root: Path | None) -> str:
    """``message`` with the server's folder names replaced by what the client sent."""
    message = message.replace(path, shown)
    if root is not None:
        message = message.replace(str(root), "<adapters-root>")
    return message.replace(os.path.expanduser("~"), "~")
