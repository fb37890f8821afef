"""Error profiles: what faults each tool's API produces, how slow it is, and what faults cost.

A profile is one YAML file (``error_profiles/<name>.yaml``)::

    name: realistic
    description: Rates seen in production API logs.
    think_time_s: 1.0            # virtual seconds an agent step takes before its call goes out
    defaults:                    # every tool, unless overridden under tools:
      rates: {http_500: 0.01, http_503: 0.005, http_429: 0.01, timeout: 0.004}
      retry_after_s: [1.0, 3.0]  # Retry-After of a 429, drawn uniformly
      latency: {distribution: lognormal, median_ms: 80, sigma: 0.6}
      timeout_s: 10.0            # the client gives up after this many (virtual) seconds
      burst:                     # outages: a two-state Markov chain per tool
        enter_p: 0.01            # per call, normal -> burst
        exit_p: 0.25             # per call, burst -> normal
        rates: {http_503: 0.5, timeout: 0.2}
    tools:
      smtp: {rates: {http_401: 0.02}}   # fields given here replace the defaults' fields
    penalties: {http_500: -2.0, http_401: -1.5, timeout: -3.0}

Validation names the key and the problem: unknown keys, probabilities outside [0, 1] or summing
past 1, and numbers outside the ranges in ``LIMITS`` (chosen so that every latency, the virtual
clock and every reward stay finite: a lognormal ``sigma`` of 1000 overflows ``exp``, a think time
of 1e308 drives the clock to inf, a penalty of -1e308 makes returns -inf). A field a tool does not
override comes from ``defaults``.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl_envs.errors import ConfigError
from agentrl_envs.tools import service_tools
from agentrl_envs.yamlsafe import load_yaml, read_yaml_file, short_repr

__all__ = [
    "DEFAULT_PENALTIES",
    "FAULT_STATUS",
    "FAULT_TYPES",
    "LIMITS",
    "MAX_DRAW_S",
    "Burst",
    "ErrorProfile",
    "Latency",
    "ProfileError",
    "ToolFaults",
    "load_profile",
]

#: Fault types and the HTTP status each answers with (599: the connection was reset, no answer).
FAULT_STATUS: dict[str, int] = {
    "http_500": 500,
    "http_502": 502,
    "http_503": 503,
    "http_401": 401,
    "http_403": 403,
    "http_429": 429,
    "timeout": 504,
    "connection_reset": 599,
}
FAULT_TYPES = tuple(FAULT_STATUS)

#: Penalties per fault type (500: -2.0, 401: -1.5, timeout: -3.0, and the rest).
DEFAULT_PENALTIES: dict[str, float] = {
    "http_500": -2.0,
    "http_502": -2.0,
    "http_503": -2.0,
    "http_401": -1.5,
    "http_403": -1.5,
    "http_429": -0.5,
    "timeout": -3.0,
    "connection_reset": -2.0,
}

#: Allowed range of every bounded number in a profile, by field name.
LIMITS: dict[str, tuple[float, float]] = {
    "ms": (0.0, 3_600_000.0),
    "median_ms": (0.0, 3_600_000.0),
    "mean_ms": (0.0, 3_600_000.0),
    "sigma": (0.0, 5.0),
    "timeout_s": (0.0, 86_400.0),
    "retry_after_s": (0.0, 86_400.0),
    "think_time_s": (0.0, 3_600.0),
    "sql_s_per_mstep": (0.0, 3_600.0),
    "penalty": (-100.0, 0.0),
}
#: No latency draw is longer than this (a lognormal's far tail is cut here): one day.
MAX_DRAW_S = 86_400.0
_STANDARD_NORMAL = NormalDist()


class ProfileError(ConfigError):
    """A profile file that does not validate; the message names the key and the problem."""


def _bounded(name: str, default: float, *, positive: bool = False) -> Any:
    """A field limited to ``LIMITS[name]`` (``positive``: the low end excluded)."""
    lo, hi = LIMITS[name]
    return Field(default, gt=lo, le=hi) if positive else Field(default, ge=lo, le=hi)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _finite(self) -> _Strict:
        # An infinite or NaN latency, timeout or think time would break the virtual clock.
        for name, value in self:
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} is {value}; it must be a finite number")
        return self


def _check_rates(rates: dict[str, float]) -> dict[str, float]:
    for key, p in rates.items():
        if key not in FAULT_STATUS:
            raise ValueError(f"unknown fault type {short_repr(key, 60)}; use one of {', '.join(FAULT_TYPES)}")
        if not (isinstance(p, (int, float)) and math.isfinite(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"probability of {key} is {short_repr(p, 60)}; it must be within [0, 1]")
    total = sum(rates.values())
    if total > 1.0 + 1e-9:
        raise ValueError(f"fault probabilities sum to {total:.6g}, more than 1")
    return {k: float(v) for k, v in rates.items()}


class Latency(_Strict):
    """Latency of a successful call, in virtual milliseconds.

    ``constant`` uses ``ms``; ``lognormal`` uses ``median_ms`` and ``sigma``; ``exponential`` uses
    ``mean_ms``. Ranges: see ``LIMITS`` (times up to one hour, ``sigma`` up to 5).
    """

    distribution: Literal["constant", "lognormal", "exponential"] = "constant"
    ms: float = _bounded("ms", 0.0)
    median_ms: float = _bounded("median_ms", 0.0)
    sigma: float = _bounded("sigma", 0.0)
    mean_ms: float = _bounded("mean_ms", 0.0)

    @property
    def is_zero(self) -> bool:
        return {"constant": self.ms, "lognormal": self.median_ms, "exponential": self.mean_ms}[self.distribution] == 0

    def sample_s(self, rng: np.random.Generator) -> float:
        """One draw, in seconds, at most ``MAX_DRAW_S``. Always consumes exactly one draw of ``rng`` (replayable)."""
        u = float(rng.random())
        if self.distribution == "constant":
            return self.ms / 1000.0
        if self.distribution == "exponential":
            return min(MAX_DRAW_S, -math.log1p(-u) * self.mean_ms / 1000.0)
        if self.median_ms == 0.0:
            return 0.0
        # The standard library's normal quantile (Wichura's AS241, in C in CPython): 0.54 us a draw
        # against 2.61 us for the hand-written erfinv it replaced (Giles' approximation + 2 Newton
        # steps), and accurate in the tails, where that one was off by 7e-5 in z at the 1e-12 clamps.
        z = _STANDARD_NORMAL.inv_cdf(min(max(u, 1e-12), 1 - 1e-12))
        return min(MAX_DRAW_S, self.median_ms * math.exp(self.sigma * z) / 1000.0)


class Burst(_Strict):
    """Outage bursts: a two-state Markov chain stepped once per call of the tool."""

    enter_p: float = Field(0.0, ge=0, le=1)
    exit_p: float = Field(1.0, ge=0, le=1)
    rates: dict[str, float] = Field(default_factory=dict)

    @field_validator("rates")
    @classmethod
    def _rates_ok(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_rates(v)

    @property
    def stationary_share(self) -> float:
        """Long-run share of calls made in the burst state."""
        total = self.enter_p + self.exit_p
        return self.enter_p / total if total > 0 else 0.0


class ToolFaults(_Strict):
    """Fault behaviour of one tool's API."""

    rates: dict[str, float] = Field(default_factory=dict)
    retry_after_s: tuple[float, float] = (1.0, 3.0)
    latency: Latency = Field(default_factory=Latency)
    timeout_s: float = _bounded("timeout_s", 30.0, positive=True)
    burst: Burst | None = None
    #: virtual seconds per 1,000,000 SQLite VM steps of real work (agent-caused latency).
    sql_s_per_mstep: float = _bounded("sql_s_per_mstep", 0.05)

    @field_validator("rates")
    @classmethod
    def _rates_ok(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_rates(v)

    @field_validator("retry_after_s")
    @classmethod
    def _retry_after_ok(cls, v: tuple[float, float]) -> tuple[float, float]:
        lo, hi = v
        top = LIMITS["retry_after_s"][1]
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or hi < lo or hi > top:
            raise ValueError(f"retry_after_s must be [low, high] with 0 <= low <= high, within [0, {top:g}]; got {list(v)}")
        return (float(lo), float(hi))


class ErrorProfile(_Strict):
    """A validated error profile. Build one with :func:`load_profile`."""

    name: str
    description: str = ""
    think_time_s: float = _bounded("think_time_s", 0.0)
    defaults: ToolFaults = Field(default_factory=lambda: ToolFaults())
    tools: dict[str, dict[str, Any]] = Field(default_factory=dict)
    penalties: dict[str, float] = Field(default_factory=dict)

    @field_validator("tools")
    @classmethod
    def _tools_ok(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for tool, override in v.items():
            if tool not in service_tools():
                raise ValueError(f"unknown tool {short_repr(tool, 60)}; use one of {', '.join(service_tools())}")
            if not isinstance(override, dict):
                raise ValueError(f"tools.{tool} must be a mapping of ToolFaults fields")
        return v

    @field_validator("penalties")
    @classmethod
    def _penalties_ok(cls, v: dict[str, float]) -> dict[str, float]:
        for key, penalty in v.items():
            if key not in FAULT_STATUS:
                raise ValueError(f"unknown fault type {short_repr(key, 60)}; use one of {', '.join(FAULT_TYPES)}")
            lo, hi = LIMITS["penalty"]
            if not (math.isfinite(penalty) and lo <= penalty <= hi):
                raise ValueError(f"penalty of {key} is {penalty!r}; it must be a finite number within [{lo:g}, {hi:g}]")
        return v

    @model_validator(mode="after")
    def _overrides_validate(self) -> ErrorProfile:
        for tool in self.tools:
            self.for_tool(tool)
        return self

    def for_tool(self, tool: str) -> ToolFaults:
        """The defaults with the tool's overrides applied (fields given replace the defaults')."""
        override = self.tools.get(tool)
        if not override:
            return self.defaults
        merged = self.defaults.model_dump()
        merged.update(override)
        try:
            return ToolFaults.model_validate(merged)
        except ValidationError as exc:
            raise ValueError(f"tools.{tool}: {_describe(exc)}") from None

    def penalty(self, fault_type: str) -> float:
        return float(self.penalties.get(fault_type, DEFAULT_PENALTIES.get(fault_type, 0.0)))

    @property
    def injects(self) -> bool:
        """Whether the profile changes anything at all (``none`` does not)."""
        tools = [self.for_tool(t) for t in service_tools()]
        return self.think_time_s > 0 or any(
            bool(t.rates) or (t.burst is not None and t.burst.enter_p > 0) or not t.latency.is_zero for t in tools
        )

    def to_yaml(self) -> str:
        data = self.model_dump(exclude_defaults=False)
        return yaml.safe_dump(_plain(data), sort_keys=False)


def load_profile(spec: str | Path | ErrorProfile) -> ErrorProfile:
    """A profile by shipped name (``"realistic"``), by YAML path, or as given."""
    if isinstance(spec, ErrorProfile):
        return spec
    error_profiles = importlib.import_module("agentrl_envs.error_profiles")
    shipped = ", ".join(error_profiles.available())
    if not isinstance(spec, (str, Path)) or not str(spec):
        raise ProfileError(f"error_profile={spec!r}: use a shipped profile name ({shipped}) or the path of a .yaml file")
    text: str
    source: str
    if isinstance(spec, str) and spec in error_profiles.available():
        text, source = error_profiles.read_text(spec), f"profile {spec!r}"
    else:
        path = Path(spec)
        if path.suffix not in (".yaml", ".yml"):
            raise ProfileError(f"error_profile={str(spec)[:200]!r}: not a shipped profile ({shipped}) and not a .yaml path")
        if not path.exists():
            raise ProfileError(f"error_profile={str(spec)[:200]!r}: {path} does not exist (shipped profiles: {shipped})")
        if path.is_dir():
            raise ProfileError(
                f"error_profile={str(spec)[:200]!r}: {path} is a directory, not a .yaml file (shipped profiles: {shipped})"
            )
        try:
            data = read_yaml_file(path, str(path))
        except FileNotFoundError:  # removed since the look above
            raise ProfileError(
                f"error_profile={str(spec)[:200]!r}: {path} does not exist (shipped profiles: {shipped})"
            ) from None
        except IsADirectoryError:
            raise ProfileError(f"error_profile={str(spec)[:200]!r}: {path} is a directory, not a .yaml file") from None
        except ConfigError as exc:  # a FIFO or device, over 1 MiB, not UTF-8, bad YAML, an alias bomb
            raise ProfileError(str(exc)) from None
        return _validate(data, str(path))
    return parse_profile(text, source)


def parse_profile(text: str, source: str = "<profile>") -> ErrorProfile:
    """Validate YAML text as a profile; errors name the source, the key and the problem.

    The text goes through :func:`agentrl_envs.yamlsafe.load_yaml` (size, alias and depth caps).
    """
    try:
        data = load_yaml(text, source)
    except ConfigError as exc:
        raise ProfileError(str(exc)) from None
    return _validate(data, source)


def _validate(data: Any, source: str) -> ErrorProfile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a YAML mapping with at least 'name'")
    try:
        return ErrorProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{source}: {_describe(exc)}") from None
    except ValueError as exc:
        raise ProfileError(f"{source}: {exc}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p)[:40] for p in err["loc"])  # a key of the file: any length
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        field = str(err["loc"][-1]) if err["loc"] else ""
        if field in LIMITS and err["type"] in ("greater_than", "greater_than_equal", "less_than_equal"):
            lo, hi = LIMITS[field]
            msg += f" (allowed range {'(' if err['type'] == 'greater_than' else '['}{lo:g}, {hi:g}])"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
