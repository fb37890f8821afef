"""Drawing a task for an episode: split, domain, data, template and parameters, all from one seed.

Splits:
- ``train`` and ``test`` use the train domains with disjoint data seeds (train 0-7, test 100-107)
  and disjoint template parameters (see :meth:`Context.check_split`);
- ``heldout`` uses domains never seen in train or test (data seeds 200-207).

Data sets are generated once per (domain, data seed) and tasks once per (kind, split, domains, long
horizon, seed), and both are kept per process (bounded, least recently used first out), shared by
every env of the process: a reset of a seed seen before costs a dictionary look-up. Cached data is
read-only (:class:`~agentrl_envs.tasks.base.FrozenDict`, rows as tuples), so no episode can change
what the next episode of the same seed gets.
"""

from __future__ import annotations

import collections
import functools
import threading
from typing import Any

import numpy as np

from agentrl_envs.backends.base import DatabaseSpec
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks.base import FrozenDict, GoldRunner, SubTask, Task, freeze_tables
from agentrl_envs.tasks.domains import DOMAINS, HELDOUT_DOMAINS, TRAIN_DOMAINS, Domain
from agentrl_envs.tasks.domains.base import fingerprint
from agentrl_envs.tasks.templates import TEMPLATES, TOOL_KINDS, WORKPLACE_PLAN, Context, Retry, TaskKind

__all__ = ["KINDS", "LONG_HORIZON_SUBTASKS", "SPLITS", "TASK_CACHE_SIZE", "TaskSampler", "clear_task_cache"]

SPLITS = ("train", "test", "heldout")
KINDS = tuple(TEMPLATES)
LONG_HORIZON_SUBTASKS = 5
DATA_VARIANTS = 8
_DATA_BASE = {"train": 0, "test": 100, "heldout": 200}
_SPLIT_CODE = {"train": 11, "test": 23, "heldout": 37}
#: The built-in kinds' numbers in a task's seed stream; a tool's kind brings its own (:class:`TaskKind`).
_BUILTIN_CODE = {"sql": 1, "python": 2, "smtp": 3, "pipeline": 4, "workplace": 6}
_KIND_CODE = {**_BUILTIN_CODE, **{name: kind.code for name, kind in TOOL_KINDS.items()}}
if len(set(_KIND_CODE.values())) != len(_KIND_CODE):
    raise ConfigError(f"task kinds share a seed code ({_KIND_CODE}): give each TaskKind in tasks/*_templates.py its own code")
#: ``<title>`` of a task id, ``<title>/<domain>/<split>/<seed>``.
_TITLE = {
    "sql": "SQL",
    "python": "Python",
    "smtp": "SMTP",
    "pipeline": "SQLPythonSMTP",
    "workplace": "Workplace",
    **{name: kind.title for name, kind in TOOL_KINDS.items()},
}
#: Kinds whose episodes get the database (for the sql tool, or a tool's service built from it).
_DATABASE_KINDS = ("sql", "pipeline", "workplace", *(name for name, kind in TOOL_KINDS.items() if kind.database))
#: Tasks kept per process (a few kB each; the data sets they point to are shared).
TASK_CACHE_SIZE = 4096

_TaskKey = tuple[str, str, tuple[str, ...], bool, int]
_TASKS: collections.OrderedDict[_TaskKey, Task] = collections.OrderedDict()
_TASKS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _dataset(domain: str, data_seed: int, kind: TaskKind | None = None) -> DatabaseSpec:
    tables = DOMAINS[domain].generate(data_seed)
    if kind is not None and kind.prepare is not None:
        tables = kind.prepare(DOMAINS[domain], tables, data_seed)
    return DatabaseSpec(fingerprint(domain, data_seed, tables), freeze_tables(tables))


def clear_task_cache() -> None:
    """Forget every cached task and data set of this process (tests and benchmarks of a cold reset)."""
    with _TASKS_LOCK:
        _TASKS.clear()
    _dataset.cache_clear()


def domains_for(split: str, domain: str | None = None) -> tuple[str, ...]:
    """The domains a split draws from, restricted to ``domain`` when given."""
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: use one of {', '.join(SPLITS)}")
    pool = HELDOUT_DOMAINS if split == "heldout" else TRAIN_DOMAINS
    if domain is None:
        return pool
    if domain not in pool:
        raise ConfigError(f"domain={domain!r} is not in split {split!r}; its domains are: {', '.join(pool)}")
    return (domain,)


class TaskSampler:
    """Makes tasks of one kind. One per env; holds the gold runner's cached databases."""

    def __init__(self, kind: str, split: str = "train", domain: str | None = None, long_horizon: bool = False) -> None:
        if kind not in KINDS:
            raise ConfigError(f"task kind {kind!r}: use one of {', '.join(KINDS)}")
        if long_horizon and kind != "pipeline":
            raise ConfigError("long_horizon=True is available for AgentRL/SQLPythonSMTP only")
        self.kind = kind
        self.split = split
        self.domains = domains_for(split, domain)
        self.long_horizon = long_horizon
        self.runner = GoldRunner()

    def sample(self, seed: int) -> Task:
        """The task of ``seed`` (a non-negative int): the same seed always gives the same task.

        Made once per process and then served from the cache; the task and its data are read-only.
        """
        key: _TaskKey = (self.kind, self.split, self.domains, self.long_horizon, int(seed))
        with _TASKS_LOCK:
            task = _TASKS.get(key)
            if task is not None:
                _TASKS.move_to_end(key)
                return task
        task = self._make(seed)
        with _TASKS_LOCK:
            _TASKS[key] = task
            while len(_TASKS) > TASK_CACHE_SIZE:
                _TASKS.popitem(last=False)
        return task

    def _make(self, seed: int) -> Task:
        rng = np.random.default_rng([int(seed), _SPLIT_CODE[self.split], _KIND_CODE[self.kind], int(self.long_horizon)])
        domain = DOMAINS[self.domains[int(rng.integers(len(self.domains)))]]
        data_seed = _DATA_BASE[self.split] + int(rng.integers(DATA_VARIANTS))
        tool_kind = _tool_kind(self.kind)
        database = _dataset(domain.name, data_seed, tool_kind if tool_kind is not None and tool_kind.prepare else None)
        ctx = Context(domain, database.tables, database, rng, self.runner, self.split)
        templates = list(TEMPLATES[self.kind])
        if self.long_horizon:
            order = rng.permutation(len(templates))
            subtasks = tuple(self._draw(ctx, [templates[i]]) for i in order[:LONG_HORIZON_SUBTASKS])
        elif self.kind == "workplace":
            subtasks = self._workplace(ctx)
        else:
            subtasks = (self._draw(ctx, templates),)
        files: dict[str, str] = {}
        if self.kind == "python":
            files[f"data/{domain.fact}.csv"] = self.runner.csv_of(database, f"SELECT * FROM {domain.fact} ORDER BY id")
        for sub in subtasks:
            files.update(dict(sub.files))
        name = _TITLE[self.kind]
        long = "-long" if self.long_horizon else ""
        return Task(
            task_id=f"{name}{long}/{domain.name}/{self.split}/{seed}",
            kind=self.kind,
            domain=domain.name,
            split=self.split,
            seed=int(seed),
            instruction=self._instruction(domain, database, subtasks, files),
            subtasks=subtasks,
            database=database if self.kind in _DATABASE_KINDS else None,
            files=FrozenDict(files),
            answer_required=_answer_required(self.kind, subtasks),
            data=database,
        )

    def _workplace(self, ctx: Context) -> tuple[SubTask, ...]:
        """The groups of :data:`WORKPLACE_PLAN` in an order drawn from the seed, one distinct sub-task each."""
        subtasks: list[SubTask] = []
        for group in ctx.rng.permutation(len(WORKPLACE_PLAN)):
            for _ in range(20):
                sub = self._draw(ctx, list(WORKPLACE_PLAN[int(group)]))
                if all((sub.template, sub.params) != (s.template, s.params) for s in subtasks):
                    break
            subtasks.append(sub)
        return tuple(subtasks)

    def _draw(self, ctx: Context, templates: list[Any]) -> SubTask:
        template = templates[0]
        for attempt in range(200):
            if attempt % 10 == 0:  # after ten refused draws, try another template
                template = templates[int(ctx.rng.integers(len(templates)))]
            try:
                return template(ctx)
            except Retry:
                continue
        raise RuntimeError(f"no valid parameters for {[t.__name__ for t in templates]} in {ctx.domain.name}/{ctx.split}")

    def _instruction(self, domain: Domain, database: DatabaseSpec, subtasks: tuple[SubTask, ...], files: dict[str, str]) -> str:
        lines = [f"You are an analytics agent at {domain.where}."]
        if len(subtasks) == 1:
            lines.append(f"Task: {subtasks[0].description}")
        else:
            each = "" if self.kind == "workplace" else ", each with its own query, computation and email"
            lines.append(f"Complete these {len(subtasks)} tasks{each}:")
            lines += [f"{i}. {s.description}" for i, s in enumerate(subtasks, 1)]
        if self.kind in ("sql", "pipeline", "workplace"):
            lines.append("\nDatabase tables (SQLite):")
            lines.append(domain.schema_text(database.tables))
        if self.kind in ("pipeline", "workplace"):
            lines.append("People and their email addresses are in the staff table (role: manager, analyst or director).")
            lines.append("Compute figures with the python tool from the CSV file your query saved.")
        if files:
            lines.append("\nWorkspace files:")
            for path, text in sorted(files.items()):
                header = text.split("\n", 1)[0]
                lines.append(f"- {path} (columns: {header})")
        if self.kind == "smtp":
            lines.append("\nStaff directory:")
            for s in Domain.staff(database.tables):
                where = "" if s.role == "director" else f" of {s.unit}"
                lines.append(f"- {s.name}, {s.role}{where}: {s.email}")
        tool_kind = _tool_kind(self.kind)
        if tool_kind is not None:
            lines += tool_kind.notes
        if _answer_required(self.kind, subtasks):
            lines.append('\nWhen you know the answer, call finish with {"answer": "<the answer>"}.')
        elif self.kind in TOOL_KINDS:
            lines.append(TOOL_KINDS[self.kind].done)
        elif self.kind == "workplace":
            lines.append('\nWhen every task is done, call finish with {"answer": "done"}.')
        else:
            lines.append('\nWhen every email is sent, call finish with {"answer": "done"}.')
        return "\n".join(lines)

    def close(self) -> None:
        self.runner.close()


def _tool_kind(kind: str) -> TaskKind | None:
    """The tool's kind whose data and instruction notes a task of ``kind`` gets (``workplace`` mixes in ``http``'s)."""
    return TOOL_KINDS.get("http" if kind == "workplace" else kind)


def _answer_required(kind: str, subtasks: tuple[SubTask, ...]) -> bool:
    """Whether the final answer is checked: always for sql and python tasks; for a tool's kind, when a sub-task asks a question."""
    return kind in ("sql", "python") or (kind in TOOL_KINDS and any(s.answer is not None for s in subtasks))
