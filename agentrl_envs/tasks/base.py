"""Tasks: what the agent is asked, the gold plan that does it, and what the checker expects.

Ground truth is never a constant: a template picks parameters, and :class:`GoldRunner` runs the
template's gold SQL and gold Python on the episode's own data to get the expected figures.
"""

from __future__ import annotations

import collections
import contextlib
import io
from dataclasses import dataclass, field
from typing import Any

from agentrl_envs.backends.base import DatabaseSpec
from simulators.sql import ReadOnlyDatabase, format_rows

__all__ = [
    "CSV_PLACEHOLDER",
    "APISpec",
    "EmailSpec",
    "FrozenDict",
    "GoldRunner",
    "SubTask",
    "Task",
    "freeze_tables",
    "normalize_rows",
]

#: Gold Python code names its input file with this placeholder; the oracle fills in the CSV path
#: its own query saved (or the data file of Python-only tasks).
CSV_PLACEHOLDER = "__CSV_PATH__"

#: The path gold code run by :class:`GoldRunner` reads; it exists only in that code's ``open``.
GOLD_INPUT = "/gold/input.csv"


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that refuses changes: the data of a cached task, shared by every episode of its seed.

    It is a real ``dict`` (``json.dumps``, ``dict(...)`` and type checks work) whose mutating
    methods raise ``TypeError``; change a copy of your own (``dict(task.files)``) instead.
    """

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "task data is shared by every episode of this seed (tasks are cached) and cannot be changed; "
            "change a copy of your own instead: dict(task.files), json.loads(json.dumps(task.database.tables))"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy rebuild it whole (not item by item)
        return (FrozenDict, (dict(self),))


def freeze_tables(tables: dict[str, dict[str, Any]]) -> FrozenDict:
    """Tables (``{name: {"columns", "rows", ...}}``) as read-only dicts of tuples; the JSON is unchanged."""

    def freeze(value: Any) -> Any:
        if isinstance(value, dict):
            return FrozenDict({k: freeze(v) for k, v in value.items()})
        if isinstance(value, (list, tuple)):
            return tuple(freeze(v) for v in value)
        return value

    frozen: FrozenDict = freeze(tables)
    return frozen


@dataclass(frozen=True)
class EmailSpec:
    """The email a sub-task requires: exactly these recipients, and the figures in the body."""

    to: tuple[str, ...]
    cc: tuple[str, ...]
    subject: str
    body: str
    attachments: tuple[str, ...] = ()


@dataclass(frozen=True)
class APISpec:
    """The company-API call an ``http`` step requires: the gold call, and what the service's answer must show.

    Attributes:
        method, path, query, body: the gold call (query and body as sorted (name, value) pairs).
        expect: fields one record of a successful answer must hold (the state the task asks for).
        total: the ``total`` a listing of ``path`` with the gold filters must answer (count tasks).
    """

    method: str
    path: str
    query: tuple[tuple[str, Any], ...] = ()
    body: tuple[tuple[str, Any], ...] = ()
    expect: tuple[tuple[str, Any], ...] = ()
    total: int | None = None


@dataclass(frozen=True)
class SubTask:
    """One unit of work: some of ``sql`` -> ``python`` -> ``smtp``, in that order.

    Attributes:
        template: id of the template that made it (``sql.count``).
        steps: the tools the sub-task needs, in order.
        description: what the agent is told.
        gold_sql: the gold query (when ``sql`` is a step or the answer comes from SQL).
        gold_rows: the gold query's result, normalized (see :func:`normalize_rows`).
        gold_code: the gold program, reading its input at :data:`CSV_PLACEHOLDER`.
        data_path: the workspace file the gold program reads when there is no query step.
        figures: numbers the answer, the program output or the email must contain.
        names: names the answer or the email must contain.
        email: the required email, for sub-tasks with an ``smtp`` step.
        answer: the gold final answer text, for sub-tasks answered through ``finish``.
        params: the template parameters (reported in info; used for split disjointness).
        files: workspace files the sub-task needs, as (path, text) pairs.
        api: the company-API call, for sub-tasks with an ``http`` step.
        lookup_sql: the query that finds the email's recipients in the ``staff`` table, for
            sub-tasks whose instruction names people by role only; the gold plan of an env with
            ``oracle_lookup`` runs it before the ``smtp`` step (:mod:`agentrl_envs.core.progress`).
    """

    template: str
    steps: tuple[str, ...]
    description: str
    gold_sql: str | None = None
    gold_rows: tuple[tuple[Any, ...], ...] | None = None
    gold_code: str | None = None
    data_path: str | None = None
    figures: tuple[float, ...] = ()
    names: tuple[str, ...] = ()
    email: EmailSpec | None = None
    answer: str | None = None
    params: tuple[tuple[str, Any], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    api: APISpec | None = None
    lookup_sql: str | None = None

    def code_for(self, path: str) -> str:
        assert self.gold_code is not None
        return self.gold_code.replace(CSV_PLACEHOLDER, repr(path))


@dataclass(frozen=True)
class Task:
    """An episode's task.

    Attributes:
        task_id: stable id: kind/domain/split/seed.
        kind: ``sql``, ``python``, ``smtp`` or ``pipeline``.
        domain, split, seed: where it comes from.
        instruction: the text the agent reads after reset.
        subtasks: the units of work, in order.
        database: the episode's data (None when the env has no SQL tool and no data).
        files: text files placed in the workspace.
        answer_required: the final ``finish`` answer is checked.
        data: the generated data behind the task, whether or not the agent can query it.
    """

    task_id: str
    kind: str
    domain: str
    split: str
    seed: int
    instruction: str
    subtasks: tuple[SubTask, ...]
    database: DatabaseSpec | None
    files: dict[str, str] = field(default_factory=dict, repr=False)
    answer_required: bool = False
    data: DatabaseSpec | None = field(default=None, repr=False)

    @property
    def gold_answer(self) -> str:
        answers = [s.answer for s in self.subtasks if s.answer is not None]
        return "; ".join(answers) if answers else "done"


def normalize_rows(rows: Any) -> tuple[tuple[Any, ...], ...]:
    """Rows as a sorted tuple of tuples with floats rounded, for order-insensitive comparison."""
    out = []
    for row in rows:
        out.append(tuple(round(v, 6) if isinstance(v, float) else v for v in row))
    return tuple(sorted(out, key=repr))


class GoldRunner:
    """Runs gold plans on a task's own data to produce ground truth.

    SQL goes through the same read-only engine as the simulator; gold Python (trusted code written
    by the templates) runs in process on the same CSV text the sql tool would save. Its input file
    is served from memory (:data:`GOLD_INPUT` through an ``open`` of its own), so a runner holds no
    files: an env that is never closed, or a process that is killed, leaves nothing on disk.
    """

    def __init__(self, max_databases: int = 64) -> None:
        self._dbs: collections.OrderedDict[str, ReadOnlyDatabase] = collections.OrderedDict()
        self._csv: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()
        self._max = max_databases

    def query(self, database: DatabaseSpec, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        db = self._dbs.get(database.fingerprint)
        if db is None:
            from simulators.sql import build_database

            db = ReadOnlyDatabase(build_database(database.tables), deadline_s=10.0)
            self._dbs[database.fingerprint] = db
            while len(self._dbs) > self._max:
                self._dbs.popitem(last=False)[1].close()
        self._dbs.move_to_end(database.fingerprint)
        result = db.query(sql)
        return result.columns, result.rows

    def csv_of(self, database: DatabaseSpec, sql: str) -> str:
        """The CSV text the sql tool would save for ``sql`` (cached: templates ask for it often)."""
        key = (database.fingerprint, sql)
        text = self._csv.get(key)
        if text is None:
            columns, rows = self.query(database, sql)
            text = format_rows(columns, rows)
            self._csv[key] = text
            while len(self._csv) > 256:
                self._csv.popitem(last=False)
        self._csv.move_to_end(key)
        return text

    def run_code(self, code: str, csv_text: str) -> str:
        """Run gold code with its input file holding ``csv_text``; return what it printed."""

        def gold_open(file: Any, mode: str = "r", *args: Any, newline: str | None = None, **kwargs: Any) -> io.StringIO:
            if file != GOLD_INPUT or mode not in ("r", "rt"):
                raise OSError(f"gold code reads its input file {GOLD_INPUT!r} and nothing else, not {file!r} ({mode!r})")
            return io.StringIO(csv_text, newline=newline)

        out = io.StringIO()
        scope = {"__name__": "__gold__", "open": gold_open}
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace(CSV_PLACEHOLDER, repr(GOLD_INPUT)), "<gold>", "exec"), scope)
        return out.getvalue()

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
