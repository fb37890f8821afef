"""What an episode of the env core starts from and reports: the reset info, the episode start, task seeds.

Pure functions and one frozen record, kept apart from :class:`~agentrl_envs.core.env.ToolUseEnv` so the env
reads as its step and reset; nothing here holds state.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrl_envs.errors import ConfigError
from agentrl_envs.rewards import zero_components
from agentrl_envs.tasks.base import Task
from agentrl_envs.tools import Tool

#: The keys ``reset(options=...)`` reads; any other is refused (a typo such as ``"taskseed"`` drew a random task).
#: Gymnasium's vector envs take their own ``"reset_mask"`` out of the options before a sub-env sees them.
RESET_OPTIONS = ("task_seed",)
#: ``options["task_seed"]`` at most: an int64, as every seed this project stores. The task generator would
#: take any int, but a task id prints its seed and Python refuses ints past 4,300 digits (a raw ValueError
#: after the episode in progress was closed); reset's own draws are below 2**31 - 1.
MAX_TASK_SEED = 2**63 - 1


def step_info(
    task: Task,
    *,
    step: int,
    tool: str | None,
    result: dict[str, Any] | None,
    virtual_time: float,
    subtask_index: int,
    boundary: bool,
    sandbox_tier: str | None,
) -> dict[str, Any]:
    """The info of a reset or a step, in its key order (a reset adds its own keys after these)."""
    return {
        "task_id": task.task_id,
        "domain": task.domain,
        "split": task.split,
        "step": step,
        "reward_components": zero_components(),
        "tool": tool,
        "tool_result": result,
        "fault": {},
        "virtual_time_s": virtual_time,
        "subtask_index": subtask_index,
        "subtask_boundary": boundary,
        "sandbox_tier": sandbox_tier,
        "call_format": "none",
    }


@dataclass(frozen=True, slots=True)
class EpisodeStart:
    """What every reset of one task in one env returns or sets, worked out at its first reset.

    ``info`` holds the reset info's keys in their order; its values are immutable (str, int, bool,
    None), and the mutable ones (``reward_components``, ``tool_result``, ``fault``, ``tools``) are
    made fresh by every reset, so no caller's change to one reset's info reaches the next.
    """

    task_ref: weakref.ref[Task]
    observation: str
    transcript_head: str
    sender: str
    mail_domains: tuple[str, ...] | None
    max_steps: int
    info: dict[str, Any]


def schema_parts(tools: Iterable[Tool], facts: dict[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Each tool's ``schema(facts)`` as ``(type, function)``: every reset copies the ``function`` dict.

    ``schema`` hands out its own copy of the parameters, so an ``info["tools"]`` a caller edits can
    change this env's later ``info["tools"]`` at most, never the tool's definition or its argument checks.
    """
    parts = []
    for tool in tools:
        schema = tool.schema(facts)
        if set(schema) != {"type", "function"}:
            raise ValueError(f"tool {tool.name!r}: schema() must return {{'type', 'function'}} only, got {sorted(schema)}")
        parts.append((schema["type"], schema["function"]))
    return tuple(parts)


def default_max_steps(task: Task, lookups: bool = False) -> int:
    """3 per gold call + 4, at least 10; ``lookups`` counts the oracle's staff lookups as gold calls."""
    gold_calls = sum(len(s.steps) + (lookups and s.lookup_sql is not None) for s in task.subtasks) + 1
    return max(10, 3 * gold_calls + 4)


def task_mail_domain(task: Task) -> str:
    from agentrl_envs.tasks.domains import DOMAINS

    return DOMAINS[task.domain].mail_domain


def task_seed_option(options: Any) -> int | None:
    """``options["task_seed"]`` as an int, None when absent.

    Raises:
        ConfigError: options that are no mapping, a key not in :data:`RESET_OPTIONS`, or a task seed
            that is no int in ``[0, MAX_TASK_SEED]``.
    """
    if options is None:
        return None
    if not isinstance(options, Mapping):  # a str or a list raised a raw AttributeError
        raise ConfigError(f"options={options!r:.80} ({type(options).__name__}): use a dict such as {{'task_seed': 3}}, or None")
    unknown = [key for key in options if key not in RESET_OPTIONS]
    if unknown:
        raise ConfigError(
            f"options key {unknown[0]!r:.80} is not a reset option of agentrl envs; "
            f"the keys they read: {', '.join(map(repr, RESET_OPTIONS))}"
        )
    task_seed = options.get("task_seed")
    if task_seed is None:
        return None
    if not isinstance(task_seed, numbers.Integral) or isinstance(task_seed, bool) or not 0 <= int(task_seed) <= MAX_TASK_SEED:
        huge = isinstance(task_seed, int) and task_seed.bit_length() > 256  # repr past 4,300 digits raises ValueError
        shown = f"a {task_seed.bit_length()}-bit int" if huge else repr(task_seed)
        raise ConfigError(f"options['task_seed']={shown:.80}: use an int from 0 to 2**63 - 1 (an int64)")
    return int(task_seed)  # a numpy int from a generator picks the same task as the int
