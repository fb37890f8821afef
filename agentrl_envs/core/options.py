"""The options of an agentrl env: every ``gym.make`` keyword, in one frozen dataclass checked once.

:class:`~agentrl_envs.core.env.ToolUseEnv` keeps its options only here (``env.options``); its
``__init__`` signature is generated from these fields, so the env reference, the env-card test and
``agentrl-train``'s ``--env-kwargs`` check read the same list. The options that may change after the
env is made (:data:`SETTABLE_OPTIONS`) change by :func:`dataclasses.replace`, so a new value is
checked exactly as a ``gym.make`` keyword is.

``split`` and ``domain`` are checked by the task sampler, ``error_profile`` by
:func:`~agentrl_envs.faults.load_profile` and ``backend`` by
:func:`~agentrl_envs.backends.make_backend`, when the env is made: each owner knows its choices.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import ErrorProfile
from agentrl_envs.rewards.schedule import parse_aux_reward
from agentrl_envs.yamlsafe import short_repr

__all__ = ["MAX_CANDIDATES", "MAX_SERVICE_S", "RENDER_MODES", "SETTABLE_OPTIONS", "EnvOptions"]

#: K of ``candidates=K``: past the task's wrong calls the env pads with no-op guesses, so K=10**9 never returned
MAX_CANDIDATES = 1024
#: ``python_timeout_s`` and ``sql_deadline_s`` at most: a day
MAX_SERVICE_S = 86400.0
RENDER_MODES = ("ansi",)
#: Options that may change after the env is made (``vec_env.set_attr(name, value)``), each checked as at ``gym.make``.
SETTABLE_OPTIONS = ("aux_reward", "candidates")


@dataclass(frozen=True, slots=True)
class EnvOptions:
    """What ``gym.make(id, **keywords)`` sets; a bad value is a :class:`ConfigError` that names the fix."""

    split: str = "train"
    """Task split: ``"train"``, ``"test"`` or ``"heldout"`` (unseen domains)."""
    domain: str | None = None
    """One company domain, or None for any domain of the split."""
    error_profile: str | Path | ErrorProfile = "none"
    """A fault profile: a shipped name, a YAML path or an :class:`ErrorProfile`."""
    backend: Any = "sim"
    """Where tool calls go: ``"sim"``, ``"direct"``, a URL, or a dict of them by tool (see the backends guide)."""
    max_steps: int | None = None
    """Steps before truncation; None for the task's default (3 per gold call + 4, at least 10)."""
    time_budget_s: float | None = None
    """Virtual seconds before truncation, or None for no budget."""
    candidates: int = 0
    """K plausible actions in ``info["candidates"]``, the oracle's among them; 0 for none."""
    candidates_difficulty: str = "easy"
    """``"easy"`` or ``"hard"``: how close the wrong candidates are to the right one."""
    render_mode: str | None = None
    """``"ansi"`` (``render()`` returns the transcript) or None."""
    aux_reward: Any = None
    """The dense aux reward: None (the default schedule), False, a weight, a dict or an ``AuxRewardConfig``;
    stored parsed, as an ``AuxRewardConfig``."""
    long_horizon: bool = False
    """Chain several tasks into one episode."""
    format_penalty: float = -0.1
    """Reward of an action that is not one well-formed call (at most 0)."""
    python_timeout_s: float = 5.0
    """CPU seconds a Python program may run, above 0 and at most a day."""
    sql_deadline_s: float = 2.0
    """Seconds a SQL query may run, above 0 and at most a day."""
    realtime: bool = False
    """Sleep through each call's virtual latency instead of only adding it to the virtual clock."""
    mail_domains: tuple[str, ...] | list[str] | str | None = "company"
    """Domains mail may be sent to: ``"company"`` (the task's own), a list of domains, or None for any."""
    python_sandbox: bool = True
    """Run programs in the hardened sandbox."""
    allow_unsafe_sandbox: bool = False
    """Let the python tool fall back to an unsandboxed runner where the sandbox cannot start."""

    def __post_init__(self) -> None:
        if self.render_mode is not None and self.render_mode not in RENDER_MODES:
            sb3 = " (SB3's make_vec_env passes 'rgb_array' unless env_kwargs holds 'render_mode': None)"
            raise ConfigError(
                f"render_mode={short_repr(self.render_mode)}: use 'ansi' or None{sb3 if self.render_mode == 'rgb_array' else ''}"
            )
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise ConfigError(f"max_steps={self.max_steps!r}: use a positive int or None for the default")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ConfigError(f"time_budget_s={self.time_budget_s!r}: use a positive number of virtual seconds or None")
        check_candidates(self.candidates)
        if self.candidates_difficulty not in ("easy", "hard"):
            raise ConfigError(f"candidates_difficulty={self.candidates_difficulty!r}: use 'easy' (default) or 'hard'")
        for name in ("python_timeout_s", "sql_deadline_s"):
            value: Any = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) <= MAX_SERVICE_S:
                # 1e300 failed later inside the sandbox's CPU-time limit with a raw ValueError
                raise ConfigError(
                    f"{name}={value!r}: use a number of seconds above 0 and at most {MAX_SERVICE_S:g} (a day), e.g. 5.0"
                )
        domains = self.mail_domains
        if (
            domains is not None
            and domains != "company"
            and not (isinstance(domains, (list, tuple)) and all(isinstance(d, str) and d for d in domains))
        ):
            raise ConfigError(f"mail_domains={domains!r}: use 'company', a list of domains, or None for any")
        # Normalized in place: the instance is new and not yet shared (frozen only to everyone else).
        set_field = object.__setattr__
        set_field(self, "candidates", int(self.candidates))
        set_field(self, "realtime", bool(self.realtime))
        set_field(self, "python_sandbox", bool(self.python_sandbox))
        set_field(self, "allow_unsafe_sandbox", bool(self.allow_unsafe_sandbox))
        if isinstance(domains, list):
            set_field(self, "mail_domains", tuple(domains))
        set_field(self, "aux_reward", parse_aux_reward(self.aux_reward))


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(EnvOptions))


def check_candidates(value: Any) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 0 <= int(value) <= MAX_CANDIDATES:
        raise ConfigError(f"candidates={value!r}: use 0 (off) or a positive int K up to {MAX_CANDIDATES}")


def keyword_signature() -> inspect.Signature:
    """``(self, *, split="train", ...)``: the env's ``__init__`` as callers and docs see it, from the fields."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f in dataclasses.fields(EnvOptions):
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type))
    return inspect.Signature(params, return_annotation=None)


def unknown_keyword(owner: str, name: str) -> TypeError:
    """The error of a keyword no env takes, with the nearest one when there is one."""
    import difflib

    near = difflib.get_close_matches(name, OPTION_NAMES, n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"the keywords are {', '.join(OPTION_NAMES)}"
    return TypeError(f"{owner}.__init__() got an unexpected keyword argument {name[:80]!r}; {hint}")
