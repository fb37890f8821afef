"""Dense auxiliary rewards and the schedule that decays them as training goes on.

Dense tool rewards help early (they say which calls move a task forward) and mislead late (a
policy can learn to collect them instead of solving the task). So they are multiplied by a weight
that the trainer decays: ``vec_env.set_attr("training_step", n)`` (or ``call("set_training_step",
n)``; a single env: ``env.set_wrapper_attr("training_step", n)``).

Terms (defaults: each tool's ``aux_term`` in the registry of :mod:`agentrl_envs.tools`;
configurable): ``sql`` 0.3 when a query returns a non-empty result, ``python`` 0.2 when a program
runs and computes, ``smtp`` 0.5 when a message is accepted. They are paid for
progress only: a term is paid when the call newly completes its tool's part of a sub-task (the
first useful query, computation or email of that sub-task), never for repeats, and each episode's
aux total is divided by its number of sub-tasks. So an agent that spams cheap successful calls
collects at most ``weight`` per episode, while solving pays 1.0 on top: as long as the weight
stays below 1, farming returns less than half of solving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl_envs.errors import ConfigError
from agentrl_envs.tools import TOOLS

__all__ = ["AuxRewardConfig", "Schedule", "default_terms", "parse_aux_reward"]


def default_terms() -> dict[str, float]:
    """The default aux term of every registered tool that has one (``Tool.aux_term``)."""
    return {name: float(tool.aux_term) for name, tool in TOOLS.items() if tool.service and tool.aux_term is not None}


@dataclass(frozen=True)
class Schedule:
    """Weight of the aux reward as a function of the trainer's step.

    Args:
        kind: ``linear`` (start -> end over ``steps``), ``cosine`` (half cosine start -> end),
            ``exponential`` (start * (end/start) ** (t/steps)), ``step`` (start until
            ``steps``, end after) or ``constant`` (start).
        start, end: weights at step 0 and at ``steps`` (held after).
        steps: horizon in training steps.
    """

    kind: Literal["linear", "cosine", "exponential", "step", "constant"] = "linear"
    start: float = 0.8
    end: float = 0.1
    steps: int = 1_000_000

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "cosine", "exponential", "step", "constant"):
            raise ConfigError(f"aux_reward schedule {self.kind!r}: use linear, cosine, exponential, step or constant")
        for name, value in (("start", self.start), ("end", self.end)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"aux_reward {name}={value!r}: use a finite weight >= 0")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"aux_reward steps={self.steps!r}: use a positive int")
        if self.kind == "exponential" and (self.start <= 0 or self.end <= 0):
            raise ConfigError("an exponential aux_reward schedule needs start > 0 and end > 0")

    def weight(self, training_step: int) -> float:
        t = min(max(training_step, 0), self.steps) / self.steps
        if self.kind == "constant":
            return self.start
        if self.kind == "linear":
            return self.start + (self.end - self.start) * t
        if self.kind == "cosine":
            return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * t))
        if self.kind == "exponential":
            return self.start * (self.end / self.start) ** t
        return self.start if training_step < self.steps else self.end


@dataclass(frozen=True)
class AuxRewardConfig:
    """Dense auxiliary reward: per-tool base terms times the schedule's weight."""

    schedule: Schedule = field(default_factory=Schedule)
    terms: dict[str, float] = field(default_factory=default_terms)

    def __post_init__(self) -> None:
        known = default_terms()
        unknown = set(self.terms) - set(known)
        if unknown:
            raise ConfigError(f"aux_reward terms: unknown tool(s) {sorted(map(str, unknown))}; use {', '.join(known)}")
        for tool, value in self.terms.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"aux_reward terms[{tool!r}]={value!r}: use a finite value >= 0")


def parse_aux_reward(spec: Any) -> AuxRewardConfig:
    """``aux_reward=`` of ``gym.make``.

    ``None``: the default (linear 0.8 -> 0.1 over 1e6 steps; sql 0.3, python 0.2, smtp 0.5).
    ``False`` or ``0``: no aux reward. A number: a constant weight. A dict with any of
    ``schedule`` (kind), ``start``, ``end``, ``steps``, ``terms``. Or an :class:`AuxRewardConfig`.
    """
    if spec is None:
        return AuxRewardConfig()
    if isinstance(spec, AuxRewardConfig):
        return spec
    if spec is False:
        return AuxRewardConfig(Schedule("constant", 0.0, 0.0))
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return AuxRewardConfig(Schedule("constant", float(spec), float(spec)))
    if isinstance(spec, dict):
        unknown = set(spec) - {"schedule", "start", "end", "steps", "terms"}
        if unknown:
            raise ConfigError(f"aux_reward: unknown key(s) {sorted(map(str, unknown))}; use schedule, start, end, steps, terms")
        defaults = Schedule()
        schedule = Schedule(
            kind=spec.get("schedule", defaults.kind),
            start=spec.get("start", defaults.start),
            end=spec.get("end", defaults.end),
            steps=spec.get("steps", defaults.steps),
        )
        terms = spec.get("terms", {})
        if not isinstance(terms, dict):
            raise ConfigError("aux_reward terms: expected a dict such as {'sql': 0.3, 'python': 0.2, 'smtp': 0.5}")
        return AuxRewardConfig(schedule, {**default_terms(), **terms})
    raise ConfigError(f"aux_reward={spec!r}: use None, False, a number, a dict or an AuxRewardConfig")
