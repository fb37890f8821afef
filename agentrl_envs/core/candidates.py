"""Candidate actions for ``candidates=K``: the oracle's next action and K-1 plausible wrong ones.

Wrong candidates are perturbations of the right one, the mistakes an agent really makes (each
tool writes its own: ``Tool.perturb``, ``Tool.perturb_hard`` and ``Tool.guess``):
SQL with another filter value, another aggregate or no filter; Python reading the wrong column,
dropping a row or not parsing; email to the wrong person, without the Cc or with a wrong figure;
and finishing early or with a wrong answer. None of them ends the episode except a ``finish``,
so the oracle can still solve the task from wherever a wrong candidate leads.

Two difficulties (``candidates_difficulty``):

- ``"easy"`` (default): the perturbations above plus generic guesses. Many differ from the right
  call in surface form (another unit's name, a figure that appears nowhere), so a no-model heuristic
  that picks the candidate sharing the most words and numbers with the instruction and the last
  observation (:class:`~agentrl_envs.agents.OverlapAgent`) solves most tasks.
- ``"hard"``: every wrong candidate keeps the instruction's entities and figures and differs in
  meaning: a wrong aggregate or column, a flipped filter or comparison, an off-by-one period or
  rank, swapped operands, the wrong recipient of the company's domain (To and Cc swapped, the
  director for the manager), a right-looking figure from another computation. From that pool
  (``Tool.perturb_hard`` and the easy one), the K-1 whose :func:`overlap_score` with the context
  (instruction + last observation) is closest to the right call's are kept (ties broken by the
  env's generator), an adversarial filter against the surface heuristic: it then scores like a
  random pick.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl_envs.core.actions import format_call
from agentrl_envs.core.progress import Progress
from agentrl_envs.tasks.base import Task
from agentrl_envs.tools import TOOLS, get_tool, service_tools
from agentrl_envs.tools.perturb import numbers, shift_numbers

__all__ = ["DIFFICULTIES", "make_candidates", "overlap_score", "overlap_tokens", "word_tokens"]

DIFFICULTIES = ("easy", "hard")

_TOKEN = re.compile(r"[^\W\d_]+|\d+(?:\.\d+)?")


def word_tokens(text: str) -> list[str]:
    """The words (letters only, lower-cased) and numbers of ``text`` in order: ``results/q1.csv`` -> results, q, 1, csv."""
    return _TOKEN.findall(text.lower())


def overlap_tokens(text: str) -> set[str]:
    """The distinct :func:`word_tokens` of ``text``."""
    return set(word_tokens(text))


def overlap_score(candidate: str, context: str | set[str]) -> int:
    """How many distinct words and numbers ``candidate`` shares with ``context`` (text or its tokens)."""
    tokens = context if isinstance(context, set) else overlap_tokens(context)
    return len(overlap_tokens(candidate) & tokens)


def make_candidates(
    task: Task,
    progress: Progress,
    oracle: str,
    k: int,
    rng: np.random.Generator,
    tools: tuple[str, ...],
    *,
    difficulty: str = "easy",
    context: str = "",
) -> list[str]:
    """K distinct action strings, shuffled by ``rng``, exactly one of which is ``oracle``.

    Args:
        task, progress: the episode's task and what it has achieved (for the next gold call).
        oracle: the right action.
        k: how many candidates.
        rng: the env's generator (every choice flows from it).
        tools: the env's tools (candidates only call these).
        difficulty: ``"easy"`` or ``"hard"`` (see the module docstring).
        context: the instruction and the last observation (used by ``"hard"``).
    """
    if difficulty == "hard":
        return _make_hard(task, progress, oracle, k, rng, tools, context)
    name, arguments = progress.next_gold_call()
    wrong = [c for c in _perturb(task, name, arguments) if c != oracle and _tool_of(c) in tools]
    wrong += [c for c in _generic(task, name) if c != oracle and _tool_of(c) in tools]
    unique: list[str] = []
    for c in wrong:
        if c not in unique:
            unique.append(c)
    n = 0
    while len(unique) < k - 1:  # pad with harmless no-op guesses if the perturbations ran out
        n += 1
        unique.append(format_call("finish", {"answer": f"I am not sure ({n})"}))
    picked = [unique[i] for i in sorted(rng.choice(len(unique), size=k - 1, replace=False))] if k > 1 else []
    out = [oracle, *picked]
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def _make_hard(
    task: Task, progress: Progress, oracle: str, k: int, rng: np.random.Generator, tools: tuple[str, ...], context: str
) -> list[str]:
    name, arguments = progress.next_gold_call()
    pool: list[str] = []
    for c in (*_perturb_hard(task, name, arguments, context), *_perturb(task, name, arguments)):
        if c != oracle and c not in pool and _tool_of(c) in tools:
            pool.append(c)
    tokens = overlap_tokens(context)
    target = overlap_score(oracle, tokens)
    early = _early_finish(context, tokens, target) if name != "finish" and "finish" in tools else None
    if early is not None and early not in pool:
        pool.append(early)
    n = 0
    while len(pool) < k - 1:
        n += 1
        pool.append(format_call("finish", {"answer": f"I am not sure ({n})"}))
    ties = rng.random(len(pool))
    deltas = [overlap_score(c, tokens) - target for c in pool]
    # Ties first; then a lower score before a higher one (a wrong call that out-scores the right one
    # would make the heuristic worse than chance, one that under-scores it better).
    # An early finish that ties is always kept: without one, a wrong call is rarely fatal.
    ranked = sorted(range(len(pool)), key=lambda i: (abs(deltas[i]), deltas[i] > 0, pool[i] != early, ties[i]))
    out = [oracle, *(pool[i] for i in ranked[: k - 1])]
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def _early_finish(context: str, tokens: set[str], target: int) -> str | None:
    """Finishing before the work is done, claiming it in the context's own words, scored like the right call."""
    skeleton = overlap_tokens(format_call("finish", {"answer": "Done:"}))
    words = [w for w in dict.fromkeys(word_tokens(context)) if w not in skeleton]
    need = target - len(skeleton & tokens)
    if need <= 0 or need > len(words):
        return None
    return format_call("finish", {"answer": "Done: " + " ".join(words[:need])})


def _perturb_hard(task: Task, name: str, arguments: dict[str, Any], context: str) -> list[str]:
    """Meaning-changing variants that keep the instruction's entities and figures (the tool's own), and finishing early."""
    out = [format_call(name, a) for a in get_tool(name).perturb_hard(task, arguments, context)]
    if name != "finish":
        out += [format_call("finish", {"answer": n}) for n in numbers(context)[:4]]  # finishing early
    return out


def _tool_of(action: str) -> str:
    match = re.search(r'"name": "(\w+)"', action)
    return match.group(1) if match else ""


def _perturb(task: Task, name: str, arguments: dict[str, Any]) -> list[str]:
    return [format_call(name, a) for a in get_tool(name).perturb(task, arguments)]


def _generic(task: Task, name: str) -> list[str]:
    out = []
    if name != "finish":
        guess = task.subtasks[0].answer or "done"
        out.append(format_call("finish", {"answer": shift_numbers(guess) if guess != "done" else guess}))
    for tool in service_tools():
        arguments = TOOLS[tool].guess(task)
        if arguments is not None:
            out.append(format_call(tool, arguments))
    return out
