"""A lazy ``np_random``: ``reset(seed=n)`` stores the seed and builds the Generator only when read.

Gymnasium's ``Env.reset(seed=n)`` builds ``np.random.Generator(PCG64(SeedSequence(n)))`` on every
call (~20 us, a third of an agentrl reset), and the env core then draws two integers from it (the
task seed and the fault seed, ~3 us each). Both draws are a pure function of ``n``, so
:class:`LazyNpRandom` keeps them in a process-wide table (:func:`first_draws`) and remembers only
``(n, draws made)``. Whatever reads ``np_random`` (or ``_np_random``, as ``gymnasium.utils.env_checker``
does) gets the Generator built from ``n`` and advanced by the draws already made: the same object
state, so the same stream, as the eager Generator would have had at that point.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.utils import seeding

__all__ = ["DRAW_HIGH", "FIRST_DRAWS", "LazyNpRandom", "first_draws", "generator_after"]

#: Every draw :meth:`LazyNpRandom._draw` makes is ``np_random.integers(0, DRAW_HIGH)``.
DRAW_HIGH = 2**31 - 1
#: Draws per seed kept in the table (a reset makes at most two: the task seed and the fault seed).
FIRST_DRAWS = 2
#: Seeds kept (a few dozen bytes each); the table is emptied when full.
SEED_TABLE_SIZE = 16_384

_FIRST: dict[int, tuple[int, ...]] = {}


def first_draws(seed: int) -> tuple[int, ...]:
    """The first :data:`FIRST_DRAWS` values of ``integers(0, DRAW_HIGH)`` from the Generator of ``seed``."""
    draws = _FIRST.get(seed)
    if draws is None:
        rng, _ = seeding.np_random(seed)
        draws = tuple(int(rng.integers(0, DRAW_HIGH)) for _ in range(FIRST_DRAWS))
        if len(_FIRST) >= SEED_TABLE_SIZE:
            _FIRST.clear()
        _FIRST[seed] = draws
    return draws


def generator_after(seed: int, draws: int) -> np.random.Generator:
    """Gymnasium's Generator of ``seed`` after ``draws`` calls of ``integers(0, DRAW_HIGH)``."""
    rng, _ = seeding.np_random(seed)
    for _ in range(draws):
        rng.integers(0, DRAW_HIGH)
    return rng


class LazyNpRandom:
    """Mixin for a ``gym.Env`` (list it first): a seeded reset defers building ``np_random``.

    Call :meth:`_seed_lazily` instead of ``super().reset(seed=seed)`` for a plain non-negative
    ``int`` seed, and :meth:`_draw` instead of ``int(self.np_random.integers(0, DRAW_HIGH))``.
    State lives in ``_rng`` (the Generator, once built) and ``_rng_pending`` (``(seed, draws)``
    while it is not).
    """

    __dict__: dict[str, Any]

    def _seed_lazily(self, seed: int) -> None:
        """What ``Env.reset(seed=seed)`` does to the generator, without building it yet."""
        d = self.__dict__
        d["_rng"] = None
        d["_rng_pending"] = (seed, 0)
        d["_np_random_seed"] = seed  # SeedSequence(seed).entropy, as gymnasium reports it

    def _draw(self) -> int:
        """``int(self.np_random.integers(0, DRAW_HIGH))``, from the table while the Generator is unbuilt."""
        d = self.__dict__
        pending = d.get("_rng_pending")
        if pending is not None and pending[1] < FIRST_DRAWS:
            seed, made = pending
            d["_rng_pending"] = (seed, made + 1)
            return first_draws(seed)[made]
        rng: np.random.Generator = self.np_random  # type: ignore[attr-defined]
        return int(rng.integers(0, DRAW_HIGH))

    @property
    def _np_random(self) -> np.random.Generator | None:
        """The Generator, built now if a seeded reset deferred it (Gymnasium's ``Env`` reads this)."""
        d = self.__dict__
        rng: np.random.Generator | None = d.get("_rng")
        pending = d.get("_rng_pending")
        if rng is None and pending is not None:
            rng = d["_rng"] = generator_after(*pending)
            d["_rng_pending"] = None
        return rng

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        d = self.__dict__
        d["_rng"] = value
        d["_rng_pending"] = None
