"""What every task template builds on: the draw :class:`Context`, :class:`Retry` and a tool's :class:`TaskKind`.

The built-in templates (:mod:`agentrl_envs.tasks.templates`) and each tool's own kind module
(``agentrl_envs/tasks/<tool>_templates.py``) import this module; it imports neither.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl_envs.backends.base import DatabaseSpec
from agentrl_envs.tasks.base import GoldRunner, SubTask
from agentrl_envs.tasks.domains.base import Domain, Staff

__all__ = ["TRAIN_SHARE", "Context", "Retry", "TaskKind", "Template", "fmt", "staff_lookup_sql"]

TRAIN_SHARE = 7  # of 10 parameter buckets go to train; the rest to test


class Retry(Exception):
    """The drawn parameters do not fit (wrong split, empty result): draw again."""


@dataclass
class Context:
    """What a template may use: the domain, the data, the generator and the gold runner."""

    domain: Domain
    tables: dict[str, dict[str, Any]]
    database: DatabaseSpec
    rng: np.random.Generator
    runner: GoldRunner
    split: str

    @property
    def staff(self) -> list[Staff]:
        return Domain.staff(self.tables)

    def choice(self, options: Any) -> Any:
        options = list(options)
        return options[int(self.rng.integers(len(options)))]

    def check_split(self, template: str, params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        """Train and test get disjoint parameter sets of every template; heldout takes any."""
        items = tuple(sorted(params.items()))
        if self.split != "heldout":
            bucket = int(hashlib.sha256(repr((template, items)).encode()).hexdigest(), 16) % 10
            if (bucket < TRAIN_SHARE) != (self.split == "train"):
                raise Retry
        return items

    def scalar(self, sql: str) -> Any:
        _, rows = self.runner.query(self.database, sql)
        if not rows or rows[0][0] is None:
            raise Retry
        return rows[0][0]

    def manager(self, unit: str) -> Staff:
        return next(s for s in self.staff if s.role == "manager" and s.unit == unit)

    def director(self) -> Staff:
        return next(s for s in self.staff if s.role == "director")

    def analysts(self) -> list[Staff]:
        return [s for s in self.staff if s.role == "analyst"]


def fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def staff_lookup_sql(people: list[Staff]) -> str:
    """The ``staff`` query that finds ``people`` as an instruction names them (by role, and unit for managers)."""

    def quote(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    terms: list[str] = []
    for s in people:
        term = f"(role = 'manager' AND unit = {quote(s.unit)})" if s.role == "manager" else f"role = {quote(s.role)}"
        if term not in terms:
            terms.append(term)
    return f"SELECT name, email, role, unit FROM staff WHERE {' OR '.join(terms)} ORDER BY staff_id"


Template = Callable[[Context], SubTask]


@dataclass(frozen=True)
class TaskKind:
    """The tasks of one tool, contributed by its own module ``agentrl_envs/tasks/<tool>_templates.py``.

    That module defines ``TASK_KIND``; :func:`discover_kinds` finds it, so a tool's tasks need no
    registration line here or in the sampler.

    Attributes:
        name: the kind, which is the tool's name (``http``).
        templates: its templates, drawn as the built-in kinds' are.
        code: its number in a task's seed stream (:class:`~agentrl_envs.tasks.sampler.TaskSampler`):
            unique, and fixed once tasks of the kind exist (another code draws other tasks).
        title: its part of a task id, ``<title>/<domain>/<split>/<seed>``.
        database: whether its episodes get the database (the sql tool's, or a service built from it).
        prepare: ``prepare(domain, tables, data_seed)``: the kind's data, when it adds tables to the
            domain's (a function of the data seed only: the data set is shared and cached).
        notes: paragraphs of the instruction, after the workspace files and the staff directory.
        done: the instruction's last line when no final answer is checked.
    """

    name: str
    templates: tuple[Template, ...]
    code: int
    title: str
    database: bool = False
    prepare: Callable[[Domain, dict[str, dict[str, Any]], int], dict[str, dict[str, Any]]] | None = None
    notes: tuple[str, ...] = ()
    done: str = '\nWhen the task is done, call finish with {"answer": "done"}.'
