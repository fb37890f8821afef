"""Task templates, written once against the domain roles of :class:`Domain`.

A template draws its parameters from the episode's generator, refuses draws outside its split
(``Retry``), runs its gold plan through :class:`GoldRunner` and returns a :class:`SubTask`.
Five templates per env kind: ``sql.*`` (answer with finish), ``python.*`` (compute from a CSV
file, answer with finish), ``smtp.*`` (send the right email), ``pipeline.*`` (query, compute in
Python from the saved CSV, email the result). A tool's own kind lives in its module
``agentrl_envs/tasks/<tool>_templates.py`` as a :class:`TaskKind` (``http.*`` in
:mod:`~agentrl_envs.tasks.http_templates`), found by :func:`discover_kinds`. What every template
builds on (:class:`Context`, :class:`Retry`, :class:`TaskKind`) is in :mod:`~agentrl_envs.tasks.template_base`,
which the tools' kind modules import, so none of them imports this module.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from agentrl_envs.tasks.base import CSV_PLACEHOLDER, EmailSpec, SubTask, normalize_rows
from agentrl_envs.tasks.domains.base import MONTHS, Staff
from agentrl_envs.tasks.http_templates import HTTP_WRITES
from agentrl_envs.tasks.scoring import extract_numbers
from agentrl_envs.tasks.template_base import TRAIN_SHARE, Context, Retry, TaskKind, Template, fmt, staff_lookup_sql

__all__ = [
    "TEMPLATES",
    "TOOL_KINDS",
    "TRAIN_SHARE",
    "WORKPLACE_PLAN",
    "Context",
    "Retry",
    "TaskKind",
    "Template",
    "discover_kinds",
    "fmt",
]


def _round(expr: str) -> str:
    """``expr`` rounded to 2 decimals in SQL that SQLite and PostgreSQL both accept (PostgreSQL has
    no ``round(double precision, int)``)."""
    return f"ROUND(CAST({expr} AS NUMERIC), 2)"


def q(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _figures(stdout: str) -> tuple[float, ...]:
    numbers = extract_numbers(stdout)
    if not numbers:
        raise Retry
    return (numbers[-1],)


# ---------------------------------------------------------------- SQL: answer from one query


def sql_count(c: Context) -> SubTask:
    d = c.domain
    cat, unit = c.choice(d.categories), c.choice(d.units)
    params = c.check_split("sql.count", {"category": cat, "unit": unit})
    sql = f"SELECT COUNT(*) AS n FROM {d.fact} WHERE {d.category} = {q(cat)} AND {d.unit} = {q(unit)}"
    value = c.scalar(sql)
    return SubTask(
        "sql.count",
        ("sql",),
        f"How many {d.fact_noun} rows have {d.category_noun} '{cat}' in the {d.unit_noun} '{unit}'?",
        gold_sql=sql,
        figures=(float(value),),
        answer=fmt(value),
        params=params,
    )


def sql_month_total(c: Context) -> SubTask:
    d = c.domain
    cat, month = c.choice(d.categories), c.choice(MONTHS)
    params = c.check_split("sql.month_total", {"category": cat, "month": month})
    sql = f"SELECT {_round(f'SUM({d.measure})')} AS total FROM {d.fact} WHERE {d.category} = {q(cat)} AND substr({d.date}, 1, 7) = {q(month)}"
    value = float(c.scalar(sql))
    return SubTask(
        "sql.month_total",
        ("sql",),
        f"What was the total {d.measure_noun} for {d.category_noun} '{cat}' in {month}? Round to 2 decimals.",
        gold_sql=sql,
        figures=(value,),
        answer=fmt(value),
        params=params,
    )


def sql_top_entity(c: Context) -> SubTask:
    d = c.domain
    unit, half = c.choice(d.units), c.choice((1, 2))
    params = c.check_split("sql.top_entity", {"unit": unit, "half": half})
    first, last = ("2025-01-01", "2025-06-30") if half == 1 else ("2025-07-01", "2025-12-31")
    sql = (
        f"SELECT e.name, {_round(f'SUM(f.{d.measure})')} AS total FROM {d.fact} f JOIN {d.entity} e "
        f"ON e.{d.entity_key} = f.{d.entity_key} WHERE f.{d.unit} = {q(unit)} "
        f"AND f.{d.date} BETWEEN {q(first)} AND {q(last)} "
        f"GROUP BY e.{d.entity_key}, e.name ORDER BY total DESC, e.name LIMIT 1"
    )
    name = str(c.scalar(sql))
    return SubTask(
        "sql.top_entity",
        ("sql",),
        f"Which {d.entity_noun} has the highest total {d.measure_noun} in the {d.unit_noun} '{unit}' between {first} and "
        f"{last}? Answer with the name.",
        gold_sql=sql,
        names=(name,),
        answer=name,
        params=params,
    )


def sql_average(c: Context) -> SubTask:
    d = c.domain
    cat, unit = c.choice(d.categories), c.choice(d.units)
    params = c.check_split("sql.average", {"category": cat, "unit": unit})
    sql = f"SELECT {_round(f'AVG({d.measure})')} AS average FROM {d.fact} WHERE {d.category} = {q(cat)} AND {d.unit} = {q(unit)}"
    value = float(c.scalar(sql))
    return SubTask(
        "sql.average",
        ("sql",),
        f"What is the average {d.measure_noun} for {d.category_noun} '{cat}' in the {d.unit_noun} '{unit}'? Round to 2 decimals.",
        gold_sql=sql,
        figures=(value,),
        answer=fmt(value),
        params=params,
    )


def sql_distinct_over(c: Context) -> SubTask:
    d = c.domain
    unit = c.choice(d.units)
    mult = c.choice((1, 2, 3))
    threshold = round(d.scale * mult)
    params = c.check_split("sql.distinct_over", {"unit": unit, "threshold": threshold})
    sql = f"SELECT COUNT(DISTINCT {d.entity_key}) AS n FROM {d.fact} WHERE {d.unit} = {q(unit)} AND {d.measure} > {threshold}"
    value = c.scalar(sql)
    return SubTask(
        "sql.distinct_over",
        ("sql",),
        f"How many distinct {d.entity_noun}s have at least one {d.fact_noun} in the {d.unit_noun} '{unit}' "
        f"with {d.measure_noun} above {threshold}?",
        gold_sql=sql,
        figures=(float(value),),
        answer=fmt(value),
        params=params,
    )


# ---------------------------------------------------------------- Python: compute from a CSV file

_READ = f"import csv, statistics\nwith open({CSV_PLACEHOLDER}, newline='') as f:\n    rows = list(csv.DictReader(f))\n"


def _python_subtask(c: Context, template: str, params: dict[str, Any], text: str, body: str) -> SubTask:
    d = c.domain
    items = c.check_split(template, params)
    code = _READ + body
    data_sql = f"SELECT * FROM {d.fact} ORDER BY id"
    try:
        stdout = c.runner.run_code(code, c.runner.csv_of(c.database, data_sql))
    except (ArithmeticError, ValueError, IndexError) as exc:  # statistics.StatisticsError is a ValueError
        raise Retry from exc
    figures = _figures(stdout)
    return SubTask(
        template,
        ("python",),
        text,
        gold_code=code,
        data_path=f"data/{d.fact}.csv",
        figures=figures,
        answer=fmt(figures[0]),
        params=items,
    )


def python_median(c: Context) -> SubTask:
    d = c.domain
    cat, unit = c.choice(d.categories), c.choice(d.units)
    body = (
        f"vals = [float(r[{d.measure!r}]) for r in rows if r[{d.category!r}] == {cat!r} and r[{d.unit!r}] == {unit!r}]\n"
        "print(round(statistics.median(vals), 2))\n"
    )
    return _python_subtask(
        c,
        "python.median",
        {"category": cat, "unit": unit},
        f"What is the median {d.measure_noun} for {d.category_noun} '{cat}' in the {d.unit_noun} '{unit}'? Round to 2 decimals.",
        body,
    )


def python_stdev(c: Context) -> SubTask:
    d = c.domain
    unit, cat = c.choice(d.units), c.choice(d.categories)
    body = (
        f"vals = [float(r[{d.measure!r}]) for r in rows if r[{d.unit!r}] == {unit!r} and r[{d.category!r}] == {cat!r}]\n"
        "print(round(statistics.pstdev(vals), 2))\n"
    )
    return _python_subtask(
        c,
        "python.stdev",
        {"unit": unit, "category": cat},
        f"What is the population standard deviation of {d.measure_noun} for {d.category_noun} '{cat}' in the "
        f"{d.unit_noun} '{unit}'? Round to 2 decimals.",
        body,
    )


def python_share(c: Context) -> SubTask:
    d = c.domain
    cat, unit = c.choice(d.categories), c.choice(d.units)
    body = (
        f"mine = [r for r in rows if r[{d.unit!r}] == {unit!r}]\n"
        f"total = sum(float(r[{d.measure!r}]) for r in mine)\n"
        f"part = sum(float(r[{d.measure!r}]) for r in mine if r[{d.category!r}] == {cat!r})\n"
        "print(round(100 * part / total, 2))\n"
    )
    return _python_subtask(
        c,
        "python.share",
        {"category": cat, "unit": unit},
        f"In the {d.unit_noun} '{unit}', what percentage of the total {d.measure_noun} comes from {d.category_noun} "
        f"'{cat}'? Round to 2 decimals.",
        body,
    )


def python_growth(c: Context) -> SubTask:
    d = c.domain
    unit = c.choice(d.units)
    i = int(c.rng.integers(0, len(MONTHS) - 1))
    m1, m2 = MONTHS[i], MONTHS[i + 1]
    body = (
        f"def total(m):\n    return sum(float(r[{d.measure!r}]) for r in rows if r[{d.unit!r}] == {unit!r} and r[{d.date!r}].startswith(m))\n"
        f"a, b = total({m1!r}), total({m2!r})\n"
        "print(round(100 * (b - a) / a, 2))\n"
    )
    return _python_subtask(
        c,
        "python.growth",
        {"unit": unit, "month": m1},
        f"By what percentage did the total {d.measure_noun} of the {d.unit_noun} '{unit}' change from {m1} to {m2}? "
        "Round to 2 decimals (negative for a decrease).",
        body,
    )


def python_top5(c: Context) -> SubTask:
    d = c.domain
    cat, k = c.choice(d.categories), c.choice((3, 4, 5, 6, 7, 8))
    body = (
        f"vals = sorted(float(r[{d.measure!r}]) for r in rows if r[{d.category!r}] == {cat!r})\n"
        f"print(round(sum(vals[-{k}:]), 2))\n"
    )
    return _python_subtask(
        c,
        "python.top5",
        {"category": cat, "k": k},
        f"What is the sum of the {k} largest {d.measure_noun} values for {d.category_noun} '{cat}'? Round to 2 decimals.",
        body,
    )


# ---------------------------------------------------------------- SMTP: send the right email


def _unit_total(c: Context, unit: str, month: str) -> float:
    d = c.domain
    return float(
        c.scalar(
            f"SELECT ROUND(SUM({d.measure}), 2) FROM {d.fact} WHERE {d.unit} = {q(unit)} AND substr({d.date}, 1, 7) = {q(month)}"
        )
    )


def _mail(
    c: Context,
    template: str,
    params: dict[str, Any],
    text: str,
    to: list[Staff],
    cc: list[Staff],
    subject: str,
    lines: list[str],
    figures: tuple[float, ...],
    files: tuple[tuple[str, str], ...] = (),
) -> SubTask:
    items = c.check_split(template, params)
    body = "Hello,\n\n" + "\n".join(lines) + "\n\nRegards,\nThe analytics agent"
    email = EmailSpec(tuple(s.email for s in to), tuple(s.email for s in cc), subject, body, tuple(p for p, _ in files))
    return SubTask(template, ("smtp",), text, figures=figures, email=email, params=items, files=files)


def smtp_manager(c: Context) -> SubTask:
    d = c.domain
    unit, month = c.choice(d.units), c.choice(MONTHS)
    total = _unit_total(c, unit, month)
    return _mail(
        c,
        "smtp.manager",
        {"unit": unit, "month": month},
        f"The total {d.measure_noun} of the {d.unit_noun} '{unit}' in {month} is {total:.2f}. Email this figure to the "
        f"manager of '{unit}'.",
        [c.manager(unit)],
        [],
        f"Total {d.measure_noun} for {unit}, {month}",
        [f"The total {d.measure_noun} for {unit} in {month} is {total:.2f}."],
        (total,),
    )


def smtp_manager_cc(c: Context) -> SubTask:
    d = c.domain
    unit, month = c.choice(d.units), c.choice(MONTHS)
    total = _unit_total(c, unit, month)
    return _mail(
        c,
        "smtp.manager_cc",
        {"unit": unit, "month": month},
        f"The total {d.measure_noun} of the {d.unit_noun} '{unit}' in {month} is {total:.2f}. Email it to the manager of "
        f"'{unit}' and put the director in Cc.",
        [c.manager(unit)],
        [c.director()],
        f"{unit} {d.measure_noun}, {month}",
        [f"The total {d.measure_noun} for {unit} in {month} is {total:.2f}."],
        (total,),
    )


def smtp_analysts(c: Context) -> SubTask:
    d = c.domain
    cat, month = c.choice(d.categories), c.choice(MONTHS)
    value = float(
        c.scalar(
            f"SELECT ROUND(SUM({d.measure}), 2) FROM {d.fact} WHERE {d.category} = {q(cat)} "
            f"AND substr({d.date}, 1, 7) = {q(month)}"
        )
    )
    return _mail(
        c,
        "smtp.analysts",
        {"category": cat, "month": month},
        f"The total {d.measure_noun} for {d.category_noun} '{cat}' in {month} is {value:.2f}. Send one email with this "
        "figure to all analysts.",
        c.analysts(),
        [],
        f"{cat} total, {month}",
        [f"The total {d.measure_noun} for {cat} in {month} is {value:.2f}."],
        (value,),
    )


def smtp_attachment(c: Context) -> SubTask:
    d = c.domain
    unit, month = c.choice(d.units), c.choice(MONTHS)
    total = _unit_total(c, unit, month)
    path = f"reports/{unit}_{month}.csv"
    report = c.runner.csv_of(
        c.database,
        f"SELECT {d.category}, COUNT(*) AS n, ROUND(SUM({d.measure}), 2) AS total FROM {d.fact} "
        f"WHERE {d.unit} = {q(unit)} AND substr({d.date}, 1, 7) = {q(month)} GROUP BY {d.category} ORDER BY {d.category}",
    )
    return _mail(
        c,
        "smtp.attachment",
        {"unit": unit, "month": month},
        f"Email the report file {path} to the manager of '{unit}' as an attachment, and mention the total "
        f"{d.measure_noun} {total:.2f} in the body.",
        [c.manager(unit)],
        [],
        f"{unit} report",
        [f"Attached is the {unit} report. Total {d.measure_noun}: {total:.2f}."],
        (total,),
        ((path, report),),
    )


def smtp_two_units(c: Context) -> SubTask:
    d = c.domain
    u1, u2 = (str(u) for u in c.rng.choice(d.units, size=2, replace=False))
    month = c.choice(MONTHS)
    t1, t2 = _unit_total(c, u1, month), _unit_total(c, u2, month)
    return _mail(
        c,
        "smtp.two_units",
        {"units": tuple(sorted((u1, u2))), "month": month},
        f"In {month} the total {d.measure_noun} was {t1:.2f} for '{u1}' and {t2:.2f} for '{u2}'. Send one email with "
        f"both figures to the managers of '{u1}' and '{u2}'.",
        [c.manager(u1), c.manager(u2)],
        [],
        f"{d.measure_noun}: {u1} and {u2}",
        [f"{u1}: {t1:.2f}", f"{u2}: {t2:.2f}"],
        (t1, t2),
    )


# ---------------------------------------------------------------- pipeline: query -> compute -> email


def _pipeline(
    c: Context,
    template: str,
    params: dict[str, Any],
    sql: str,
    body: str,
    text: str,
    to: list[Staff],
    cc: list[Staff],
    subject: str,
    label: str,
) -> SubTask:
    items = c.check_split(template, params)
    _columns, rows = c.runner.query(c.database, sql)
    if not rows:
        raise Retry
    code = _READ + body
    try:
        stdout = c.runner.run_code(code, c.runner.csv_of(c.database, sql))
    except (ArithmeticError, ValueError, IndexError) as exc:
        raise Retry from exc
    figures = _figures(stdout)
    lines = [f"{label}: {figures[0]:.2f}."]
    email = EmailSpec(
        tuple(s.email for s in to),
        tuple(s.email for s in cc),
        subject,
        "Hello,\n\n" + "\n".join(lines) + "\n\nRegards,\nThe analytics agent",
    )
    return SubTask(
        template,
        ("sql", "python", "smtp"),
        text,
        gold_sql=sql,
        gold_rows=normalize_rows(rows),
        gold_code=code,
        figures=figures,
        email=email,
        params=items,
        lookup_sql=staff_lookup_sql([*to, *cc]),
    )


def pipeline_median(c: Context) -> SubTask:
    d = c.domain
    unit, cat = c.choice(d.units), c.choice(d.categories)
    sql = f"SELECT {d.measure} FROM {d.fact} WHERE {d.unit} = {q(unit)} AND {d.category} = {q(cat)} ORDER BY id"
    body = f"vals = [float(r[{d.measure!r}]) for r in rows]\nprint(round(statistics.median(vals), 2))\n"
    return _pipeline(
        c,
        "pipeline.median",
        {"unit": unit, "category": cat},
        sql,
        body,
        f"Find the median {d.measure_noun} for {d.category_noun} '{cat}' in the {d.unit_noun} '{unit}' and email it to "
        f"the manager of '{unit}'.",
        [c.manager(unit)],
        [],
        f"Median {cat} {d.measure_noun} for {unit}",
        f"The median {d.measure_noun} for {cat} in {unit} is",
    )


def pipeline_growth(c: Context) -> SubTask:
    d = c.domain
    unit = c.choice(d.units)
    i = int(c.rng.integers(0, len(MONTHS) - 1))
    m1, m2 = MONTHS[i], MONTHS[i + 1]
    sql = f"SELECT {d.date}, {d.measure} FROM {d.fact} WHERE {d.unit} = {q(unit)} ORDER BY id"
    body = (
        f"def total(m):\n    return sum(float(r[{d.measure!r}]) for r in rows if r[{d.date!r}].startswith(m))\n"
        f"a, b = total({m1!r}), total({m2!r})\nprint(round(100 * (b - a) / a, 2))\n"
    )
    return _pipeline(
        c,
        "pipeline.growth",
        {"unit": unit, "month": m1},
        sql,
        body,
        f"Compute the percentage change of total {d.measure_noun} in the {d.unit_noun} '{unit}' from {m1} to {m2} "
        f"(2 decimals) and email it to the director, with the manager of '{unit}' in Cc.",
        [c.director()],
        [c.manager(unit)],
        f"{unit} growth {m1} to {m2}",
        f"Change in {unit} from {m1} to {m2} (%)",
    )


def pipeline_share(c: Context) -> SubTask:
    d = c.domain
    cat, unit = c.choice(d.categories), c.choice(d.units)
    sql = f"SELECT {d.category}, {d.measure} FROM {d.fact} WHERE {d.unit} = {q(unit)} ORDER BY id"
    body = (
        f"total = sum(float(r[{d.measure!r}]) for r in rows)\n"
        f"part = sum(float(r[{d.measure!r}]) for r in rows if r[{d.category!r}] == {cat!r})\n"
        "print(round(100 * part / total, 2))\n"
    )
    return _pipeline(
        c,
        "pipeline.share",
        {"category": cat, "unit": unit},
        sql,
        body,
        f"Compute the share (in percent, 2 decimals) of the {d.unit_noun} '{unit}' total {d.measure_noun} that comes "
        f"from {d.category_noun} '{cat}' and send it in one email to all analysts.",
        c.analysts(),
        [],
        f"Share of {cat} in {unit}",
        f"Share of {cat} in the {unit} total {d.measure_noun} (%)",
    )


def pipeline_stdev(c: Context) -> SubTask:
    d = c.domain
    cat, unit = c.choice(d.categories), c.choice(d.units)
    sql = f"SELECT {d.measure} FROM {d.fact} WHERE {d.category} = {q(cat)} AND {d.unit} = {q(unit)} ORDER BY id"
    body = f"vals = [float(r[{d.measure!r}]) for r in rows]\nprint(round(statistics.pstdev(vals), 2))\n"
    return _pipeline(
        c,
        "pipeline.stdev",
        {"category": cat, "unit": unit},
        sql,
        body,
        f"Compute the population standard deviation (2 decimals) of {d.measure_noun} for {d.category_noun} '{cat}' "
        f"in the {d.unit_noun} '{unit}' and email it to the manager of '{unit}'.",
        [c.manager(unit)],
        [],
        f"Spread of {cat} in {unit}",
        f"Standard deviation of {cat} {d.measure_noun} in {unit}",
    )


def pipeline_mean_count(c: Context) -> SubTask:
    d = c.domain
    unit, cat = c.choice(d.units), c.choice(d.categories)
    sql = f"SELECT {d.count} FROM {d.fact} WHERE {d.unit} = {q(unit)} AND {d.category} = {q(cat)} ORDER BY id"
    body = f"vals = [int(r[{d.count!r}]) for r in rows]\nprint(round(sum(vals) / len(vals), 2))\n"
    return _pipeline(
        c,
        "pipeline.mean_count",
        {"unit": unit, "category": cat},
        sql,
        body,
        f"Compute the mean {d.count_noun} ({d.count}) per {d.fact_noun} of {d.category_noun} '{cat}' in the "
        f"{d.unit_noun} '{unit}' (2 decimals) "
        f"and email it to the manager of '{unit}' with the director in Cc.",
        [c.manager(unit)],
        [c.director()],
        f"Mean {d.count_noun} in {unit}",
        f"Mean {d.count_noun} per {d.fact_noun} in {unit}",
    )


def discover_kinds(package: str = "agentrl_envs.tasks") -> dict[str, TaskKind]:
    """``{name: kind}`` of every ``<package>.<tool>_templates`` module's ``TASK_KIND``, sorted by module name.

    Args:
        package: the package searched (a test may point it at its own).

    Raises:
        TypeError: a ``*_templates`` module defines no ``TASK_KIND``, or one named after another tool.
    """
    folder = Path(__file__).parent if package == __package__ else Path(importlib.import_module(package).__file__ or "").parent
    kinds: dict[str, TaskKind] = {}
    for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
        if info.ispkg or not info.name.endswith("_templates"):
            continue
        tool = info.name.removesuffix("_templates")
        module = importlib.import_module(f"{package}.{info.name}")
        kind = getattr(module, "TASK_KIND", None)
        if not isinstance(kind, TaskKind) or kind.name != tool:
            raise TypeError(
                f"{module.__name__} must define TASK_KIND = TaskKind(name={tool!r}, ...), the tasks of the {tool!r} "
                f"tool; it defines {type(kind).__name__} {getattr(kind, 'name', '')!r}"
            )
        kinds[kind.name] = kind
    return kinds


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "sql": (sql_count, sql_month_total, sql_top_entity, sql_average, sql_distinct_over),
    "python": (python_median, python_stdev, python_share, python_growth, python_top5),
    "smtp": (smtp_manager, smtp_manager_cc, smtp_analysts, smtp_attachment, smtp_two_units),
    "pipeline": (pipeline_median, pipeline_growth, pipeline_share, pipeline_stdev, pipeline_mean_count),
}
#: The kinds the tools' own modules contribute (``http``), after the built-in ones.
TOOL_KINDS: dict[str, TaskKind] = discover_kinds()
TEMPLATES.update({name: kind.templates for name, kind in TOOL_KINDS.items()})

#: ``AgentRL/Workplace-v1``: two pipeline sub-tasks and two ticket changes, in an order drawn per task.
WORKPLACE_PLAN: tuple[tuple[Template, ...], ...] = (TEMPLATES["pipeline"], HTTP_WRITES, TEMPLATES["pipeline"], HTTP_WRITES)
TEMPLATES["workplace"] = TEMPLATES["pipeline"] + HTTP_WRITES
