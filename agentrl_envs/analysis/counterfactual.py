"""Counterfactual reward-model data: each gold tool call next to perturbations that really fail.

``make_rm_data`` runs the oracle; for every gold ``sql``, ``python`` and ``smtp`` call (``finish`` calls
are not labelled) it writes the gold call with label 1.0 and up to 3 perturbations with label -0.5,
each of a different kind where possible:

- SQL, edited on the sqlglot AST and spliced into the original text at the edited tokens (gold and
  perturbed queries differ only where the mistake is). Changed WHERE predicate:
  ``sql.where_value``, ``sql.where_operator``, ``sql.where_drop`` (a condition dropped); swapped
  JOIN: ``sql.join_table``, ``sql.join_key``; ``sql.aggregate`` (SUM/AVG/MIN/MAX swapped, DISTINCT
  dropped or added); ``sql.group_by`` (another grouping, or one added); ``sql.column`` (another
  column selected). The three picks come from different families (where, join, aggregate,
  group_by, column) first;
- Python, edited on the ``ast``: ``python.wrong_column``, ``python.off_by_one`` (first or last row
  dropped, a slice bound or a denominator off by one, one decimal fewer), ``python.wrong_filter``,
  ``python.wrong_statistic``;
- SMTP: ``smtp.wrong_recipient``, ``smtp.missing_figure``, ``smtp.missing_cc``,
  ``smtp.missing_attachment``, ``smtp.extra_recipient``, ``smtp.wrong_figure``.

A perturbation is kept only if it changes the outcome as the env's checker sees it: the query's rows
(order-insensitive, :func:`~agentrl_envs.tasks.base.normalize_rows`) differ from the gold rows on the
episode's database; the program, run on the CSV the gold query saved (or the task's data file), no
longer prints the figure; the message no longer passes the task's email check. The others are
dropped and counted. A perturbation that fails outright (SQL error, Python exception) counts as
changed but is used only when its kind has no clean variant; the ``errors`` column marks it.

Parquet columns: ``env_id``, ``split``, ``task_id``, ``step`` (1-based step of the gold call),
``subtask``, ``tool``, ``prompt``, ``action``, ``label``, ``perturbation`` (``"gold"`` or the kind),
``detail`` (what changed), ``errors``. ``prompt`` is compact: the instruction, then every earlier
step as ``> action`` and its observation clipped to 1,000 characters.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agentrl_envs.core.progress import MAX_NUMBERS_OUTPUT, email_matches
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks.base import CSV_PLACEHOLDER, GoldRunner, SubTask, Task, normalize_rows
from agentrl_envs.tasks.scoring import contains_figure

__all__ = ["COLUMNS", "GOLD_LABEL", "PERTURBED_LABEL", "add_arguments", "cmd_make_rm_data", "make_rm_data"]

GOLD_LABEL = 1.0
PERTURBED_LABEL = -0.5
PER_CALL = 3
OBSERVATION_CHARS = 1000
MAX_VARIANTS = 6  # evaluated per kind and gold call
#: Parquet columns, in order.
COLUMNS = tuple("env_id split task_id step subtask tool prompt action label perturbation detail errors".split())

Variant = tuple[str, str, Any]  # (kind, detail, new arguments)


def make_rm_data(env_id: str, episodes: int, out_dir: str | Path, seed: int = 0, split: str = "train") -> dict[str, Any]:
    """Run the oracle for ``episodes`` episodes and write labelled calls to ``out_dir`` as Parquet.

    Episode i uses reset seed ``seed + i``. Writes ``<env>-<split>.parquet`` and a
    ``<env>-<split>.summary.json`` beside it.

    Returns:
        The summary: ``episodes``, ``gold_calls``, ``perturbations`` (written), ``rows``
        (= gold_calls + perturbations), ``by_kind``, ``candidates`` (perturbations evaluated)
        = perturbations + ``dropped_unchanged`` + ``unused`` (changed, but not needed),
        ``erroring`` (written perturbations that fail outright), ``short_calls`` (gold calls with
        fewer than 3 perturbations), ``path``.

    Raises:
        ConfigError: unknown env id, split, episodes < 1 or an unwritable ``out_dir``.
    """
    import gymnasium as gym

    import agentrl_envs
    from agentrl_envs.agents import OracleAgent
    from agentrl_envs.core.actions import parse_action
    from agentrl_envs.text.observation import clip

    if env_id not in agentrl_envs.ALL_IDS:
        raise ConfigError(f"unknown environment {str(env_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise ConfigError(f"episodes={episodes!r}: use a positive number of episodes")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed={seed!r}: use a non-negative int")
    env = gym.make(env_id, split=split)  # checks the split before anything is written
    try:
        out = _writable_dir(out_dir)
    except ConfigError:
        env.close()
        raise
    runner = GoldRunner()
    rows: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    try:
        core: Any = env.unwrapped
        agent = OracleAgent(env)
        for i in range(episodes):
            observation, info = env.reset(seed=seed + i)
            task: Task = core.task
            rng = np.random.default_rng([seed, i])
            transcript = [task.instruction]
            done = False
            while not done:
                action = agent.act(observation, info)
                call = parse_action(action, core.tools)
                if call.name != "finish":
                    sub = task.subtasks[min(int(info["subtask_index"]), len(task.subtasks) - 1)]
                    base = {"env_id": env_id, "split": split, "task_id": task.task_id, "step": int(info["step"]) + 1}
                    base.update(subtask=task.subtasks.index(sub), tool=call.name, prompt="\n\n".join(transcript))
                    rows.append(
                        {**base, "action": action, "label": GOLD_LABEL, "perturbation": "gold", "detail": "", "errors": False}
                    )
                    counts["gold_calls"] += 1
                    for kind, detail, arguments, errors in _perturbations(
                        task, sub, call.name, call.arguments, runner, rng, counts
                    ):
                        row = {**base, "action": _format(call.name, arguments), "label": PERTURBED_LABEL}
                        rows.append({**row, "perturbation": kind, "detail": detail, "errors": errors})
                        kinds[kind] += 1
                        counts["erroring"] += int(errors)
                observation, _, terminated, truncated, info = env.step(action)
                transcript.append(f"> {action}\n{clip(observation, OBSERVATION_CHARS)}")
                done = terminated or truncated
    finally:
        env.close()
        runner.close()
    stem = f"{env_id.split('/')[-1]}-{split}"
    path = out / f"{stem}.parquet"
    _write_parquet(rows, path)
    summary: dict[str, Any] = {"env_id": env_id, "split": split, "seed": seed, "episodes": episodes}
    summary.update(gold_calls=counts["gold_calls"], perturbations=sum(kinds.values()), rows=len(rows))
    summary["by_kind"] = dict(sorted(kinds.items()))
    summary.update({k: counts[k] for k in ("candidates", "dropped_unchanged", "unused", "erroring", "short_calls")})
    summary["path"] = str(path)
    (out / f"{stem}.summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``agentrl-envs make-rm-data``."""
    parser.add_argument("env_id", metavar="ID", help="environment id, e.g. AgentRL/SQLPythonSMTP-v1")
    parser.add_argument("--episodes", type=int, default=20, help="oracle episodes to label (default 20)")
    parser.add_argument("-o", "--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="first reset seed; episode i uses seed+i")
    parser.add_argument("--split", default="train", help="train, test or heldout (default train)")


def cmd_make_rm_data(args: argparse.Namespace) -> int:
    """``agentrl-envs make-rm-data ID --episodes N -o DIR``: print the summary; 0 on success."""
    summary = make_rm_data(args.env_id, args.episodes, args.out, seed=args.seed, split=args.split)
    print(
        f"{summary['rows']} rows ({summary['gold_calls']} gold calls, {summary['perturbations']} perturbations; "
        f"{summary['dropped_unchanged']} dropped as outcome-preserving) -> {summary['path']}"
    )
    print("by kind: " + ", ".join(f"{k} {n}" for k, n in summary["by_kind"].items()))
    return 0


# -- selection -----------------------------------------------------------------------------------


def _perturbations(
    task: Task,
    sub: SubTask,
    tool: str,
    arguments: dict[str, Any],
    runner: GoldRunner,
    rng: np.random.Generator,
    counts: Counter[str],
) -> list[tuple[str, str, Any, bool]]:
    """Up to PER_CALL outcome-changing perturbations, one kind each first, clean ones preferred."""
    checker = _Checker(task, sub, runner)
    if tool == "sql":
        variants, judge = _sql_variants(arguments["query"], checker.tables, rng), checker.sql
    elif tool == "python":
        variants, judge = _python_variants(arguments["code"], sub, checker, rng), checker.python
    else:
        variants, judge = _smtp_variants(arguments, sub, checker.tables, rng), checker.smtp
    by_family: dict[str, list[tuple[bool, int, str, str, Any]]] = {}
    seen = {json.dumps(arguments, sort_keys=True)}
    per_kind: Counter[str] = Counter()
    for kind, detail, new in variants:
        key = json.dumps(new, sort_keys=True)
        if key in seen or per_kind[kind] >= MAX_VARIANTS:
            continue
        seen.add(key)
        counts["candidates"] += 1
        errors = judge(new)
        if errors is None:
            counts["dropped_unchanged"] += 1
            continue
        # Within a family, interleave its kinds (value, operator, dropped condition, ...).
        by_family.setdefault(_FAMILY.get(kind, kind), []).append((errors, per_kind[kind], kind, detail, new))
        per_kind[kind] += 1
    for options in by_family.values():
        options.sort(key=lambda o: (o[0], o[1]))  # clean first; stable keeps the kinds' order
    picked: list[tuple[str, str, Any, bool]] = []
    for rank in range(MAX_VARIANTS * len(_FAMILY)):  # one per family, then seconds, ...
        for options in by_family.values():
            if len(picked) < PER_CALL and rank < len(options):
                errors, _, kind, detail, new = options[rank]
                picked.append((kind, detail, new, errors))
    counts["unused"] += sum(len(o) for o in by_family.values()) - len(picked)
    counts["short_calls"] += int(len(picked) < PER_CALL)
    return picked


class _Checker:
    """Judges a perturbed call: None when the outcome is unchanged, else whether it errors."""

    def __init__(self, task: Task, sub: SubTask, runner: GoldRunner) -> None:
        self.task, self.sub, self.runner = task, sub, runner
        data = task.database or task.data
        self.tables: dict[str, Any] = data.tables if data is not None else {}
        self._gold_rows: Any = None

    def sql(self, arguments: dict[str, Any]) -> bool | None:
        assert self.task.database is not None and self.sub.gold_sql is not None
        if self._gold_rows is None:
            self._gold_rows = normalize_rows(self.runner.query(self.task.database, self.sub.gold_sql)[1])
        try:
            rows = normalize_rows(self.runner.query(self.task.database, arguments["query"])[1])
        except Exception:
            return True
        return None if rows == self._gold_rows else False

    def csv_text(self) -> str:
        if self.sub.data_path is not None and self.sub.data_path in self.task.files:
            return self.task.files[self.sub.data_path]
        assert self.task.database is not None and self.sub.gold_sql is not None
        return self.runner.csv_of(self.task.database, self.sub.gold_sql)

    def python(self, arguments: dict[str, Any]) -> bool | None:
        try:
            stdout = self.runner.run_code(arguments["_template"], self.csv_text())
        except Exception:
            return True
        return None if contains_figure(stdout, self.sub.figures, MAX_NUMBERS_OUTPUT) else False

    def smtp(self, arguments: dict[str, Any]) -> bool | None:
        delivered = {
            "to": arguments["to"] if isinstance(arguments["to"], list) else [arguments["to"]],
            "cc": arguments.get("cc", []),
            "body": arguments["body"],
            "attachments": [{"path": p} for p in arguments.get("attachments", [])],
        }
        return None if email_matches(self.sub, delivered) else False


def _format(tool: str, arguments: dict[str, Any]) -> str:
    from agentrl_envs.core.actions import format_call

    return format_call(tool, {k: v for k, v in arguments.items() if not k.startswith("_")})


# -- SQL -----------------------------------------------------------------------------------------

_CLAUSE_END = {"GROUP_BY", "ORDER_BY", "LIMIT", "HAVING", "UNION", "WINDOW"}
_FAMILY = dict.fromkeys(("sql.where_value", "sql.where_operator", "sql.where_drop"), "sql.where")
_FAMILY |= dict.fromkeys(("sql.join_table", "sql.join_key"), "sql.join")
_FLIP = {"EQ": "<>", "NEQ": "=", "GT": "<", "GTE": "<", "LT": ">", "LTE": ">"}
_AGG_SWAP = {"Sum": ("AVG", "MAX"), "Avg": ("SUM", "MIN"), "Min": ("MAX",), "Max": ("MIN",)}


def _sql_variants(query: str, tables: dict[str, Any], rng: np.random.Generator) -> Iterator[Variant]:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(query, read="sqlite")
        tokens = list(sqlglot.tokenize(query, read="sqlite"))
    except sqlglot.errors.SqlglotError:
        return
    alias = {(t.alias or t.name): t.name for t in tree.find_all(exp.Table)}
    main = next(iter(alias.values()), "")

    def edit(kind: str, detail: str, start: int, end: int, text: str) -> Variant:
        return kind, detail, {"query": query[:start] + text + query[end + 1 :]}

    def columns_of(table: str) -> list[tuple[str, str]]:
        return [(c, t) for c, t in tables.get(table, {}).get("columns", [])]

    def owner(col: Any) -> str:
        return alias.get(col.table, main) if col.table else main

    where = tree.find(exp.Where)
    if where is not None:
        for lit in where.find_all(exp.Literal):
            parent = lit.parent
            if "start" not in lit.meta or not isinstance(parent, (exp.Binary, exp.Between)) or isinstance(parent, exp.Connector):
                continue
            other = parent.left if isinstance(parent, exp.Binary) and parent.right is lit else None
            for new in _literal_alternatives(lit, other, owner, tables, rng):
                yield edit("sql.where_value", f"{lit.sql()} -> {new}", lit.meta["start"], lit.meta["end"], new)
            i = _token_at(tokens, lit.meta["start"]) - 1
            if i >= 0 and tokens[i].token_type.name in _FLIP:
                op = _FLIP[tokens[i].token_type.name]
                yield edit("sql.where_operator", f"operator {tokens[i].text} -> {op}", tokens[i].start, tokens[i].end, op)
        yield from (("sql.where_drop", d, {"query": q}) for d, q in _dropped_conditions(query, tokens))
    for join in tree.find_all(exp.Join):
        ident = join.this.this if isinstance(join.this, exp.Table) else None
        if ident is not None and "start" in ident.meta:
            for name in tables:
                if name not in (ident.name, main):
                    yield edit("sql.join_table", f"JOIN {ident.name} -> {name}", ident.meta["start"], ident.meta["end"], name)
        on = join.args.get("on")
        for col in on.find_all(exp.Column) if on is not None else ():
            ints = [c for c, t in columns_of(owner(col)) if t == "INTEGER" and c != col.name]
            ident = col.this
            for name in ints[:2] if "start" in ident.meta else ():
                yield edit("sql.join_key", f"join key {col.sql()} -> {name}", ident.meta["start"], ident.meta["end"], name)
    for agg in tree.find_all(exp.AggFunc):
        if "start" not in agg.meta:
            continue
        for name in _AGG_SWAP.get(type(agg).__name__, ()):
            yield edit("sql.aggregate", f"{agg.sql()} -> {name}", agg.meta["start"], agg.meta["end"], name)
        if isinstance(agg, exp.Count):
            i = _token_at(tokens, agg.meta["start"]) + 2
            if i < len(tokens) and tokens[i].token_type.name == "DISTINCT":
                yield edit("sql.aggregate", "COUNT(DISTINCT x) -> COUNT(x)", tokens[i].start, tokens[i + 1].start - 1, "")
            elif i < len(tokens) and tokens[i].token_type.name == "STAR":
                keys = [c for c, _ in columns_of(main)[1:2]]
                for key in keys:
                    yield edit(
                        "sql.aggregate", f"COUNT(*) -> COUNT(DISTINCT {key})", tokens[i].start, tokens[i].end, f"DISTINCT {key}"
                    )
    yield from _group_variants(query, tree, tokens, columns_of, owner, main)
    for select in tree.expressions:
        for col in select.find_all(exp.Column):
            ident = col.this
            if "start" not in ident.meta:
                continue
            kind = dict(columns_of(owner(col))).get(col.name)
            numeric = ("INTEGER", "REAL")
            others = [
                (n, t)
                for n, t in columns_of(owner(col))
                if n not in (col.name, "id") and (t == kind or {t, kind} <= set(numeric))
            ]
            for name, _ in sorted(others, key=lambda c: c[1] != kind):
                yield edit("sql.column", f"SELECT {col.name} -> {name}", ident.meta["start"], ident.meta["end"], name)


def _literal_alternatives(lit: Any, other: Any, owner: Any, tables: dict[str, Any], rng: np.random.Generator) -> list[str]:
    from sqlglot import exp

    value = lit.this
    if not lit.is_string:
        number = float(value)
        return [str(int(number * 2) if number.is_integer() else round(number * 2, 2)), str(int(number // 2))]
    month = re.fullmatch(r"(\d{4})-(\d{2})((?:-\d{2})?)", value)
    if month:
        m = int(month.group(2))
        shifted = [f"{month.group(1)}-{k:02d}{month.group(3)}" for k in (m + 1, m - 1) if 1 <= k <= 12]
        return [f"'{s}'" for s in shifted]
    if isinstance(other, exp.Column):
        table = tables.get(owner(other), {})
        names = [c for c, _ in table.get("columns", [])]
        if other.name in names:
            j = names.index(other.name)
            pool = sorted({str(r[j]) for r in table["rows"]} - {value})
            picks = [pool[k] for k in rng.permutation(len(pool))[:3]]
            return ["'" + p.replace("'", "''") + "'" for p in picks]
    return []


def _token_at(tokens: list[Any], start: int) -> int:
    return next((i for i, t in enumerate(tokens) if t.start == start), -1)


def _clause(tokens: list[Any], name: str) -> tuple[int, int] | None:
    """Token range (first after the keyword, end exclusive) of a top-level clause."""
    depth, begin = 0, None
    for i, t in enumerate(tokens):
        kind = t.token_type.name
        depth += (kind == "L_PAREN") - (kind == "R_PAREN")
        if depth:
            continue
        if begin is None and kind == name:
            begin = i + 1
        elif begin is not None and kind in _CLAUSE_END:
            return begin, i
    return (begin, len(tokens)) if begin is not None else None


def _dropped_conditions(query: str, tokens: list[Any]) -> Iterator[tuple[str, str]]:
    span = _clause(tokens, "WHERE")
    if span is None:
        return
    begin, end = span
    ands, depth, between = [], 0, 0
    for i in range(begin, end):
        kind = tokens[i].token_type.name
        depth += (kind == "L_PAREN") - (kind == "R_PAREN")
        if depth == 0 and kind == "BETWEEN":
            between += 1
        elif depth == 0 and kind == "AND":
            if between:
                between -= 1
            else:
                ands.append(i)
    if not ands:
        start, stop = tokens[begin - 2].end + 1, tokens[end - 1].end + 1
        yield f"dropped {query[start:stop].strip()}", query[:start] + query[stop:]
        return
    bounds = [begin - 1, *ands, end]
    for j in range(len(bounds) - 1):
        first, last = bounds[j] + 1, bounds[j + 1] - 1
        cond = query[tokens[first].start : tokens[last].end + 1]
        if j == 0:
            new = query[: tokens[first].start] + query[tokens[ands[0] + 1].start :]
        else:
            new = query[: tokens[bounds[j] - 1].end + 1] + query[tokens[last].end + 1 :]
        yield f"dropped condition {cond}", new


def _group_variants(query: str, tree: Any, tokens: list[Any], columns_of: Any, owner: Any, main: str) -> Iterator[Variant]:
    from sqlglot import exp

    group = tree.args.get("group")
    used = {c.name for c in tree.find_all(exp.Column)}
    if group is not None:
        span = _clause(tokens, "GROUP_BY")
        keys = list(group.find_all(exp.Column))
        if span and keys:
            table = owner(keys[0])
            prefix = f"{keys[0].table}." if keys[0].table else ""
            for name, t in columns_of(table):
                if t == "TEXT" and name not in used:
                    start, end = tokens[span[0]].start, tokens[span[1] - 1].end
                    yield (
                        "sql.group_by",
                        f"GROUP BY -> {prefix}{name}",
                        {"query": query[:start] + prefix + name + query[end + 1 :]},
                    )
    elif tree.find(exp.AggFunc) is not None:
        span = _clause(tokens, "FROM")
        at = tokens[span[1]].start if span and span[1] < len(tokens) else len(query.rstrip())
        alias = next((t.alias for t in tree.find_all(exp.Table) if t.name == main and t.alias), "")
        for name, t in columns_of(main):
            if t == "TEXT" and name not in used:
                col = f"{alias}.{name}" if alias else name
                new = query[:at].rstrip() + f" GROUP BY {col}" + (" " + query[at:] if at < len(query.rstrip()) else "")
                yield "sql.group_by", f"added GROUP BY {col}", {"query": new}


# -- Python --------------------------------------------------------------------------------------

_STAT_SWAP = {"median": "mean", "mean": "median", "pstdev": "stdev", "stdev": "pstdev"}


def _python_variants(code: str, sub: SubTask, checker: _Checker, rng: np.random.Generator) -> Iterator[Variant]:
    """Edits of the gold template (``_template``: run on the gold CSV) mapped onto the action's code."""
    template = sub.gold_code
    if template is None or template.count(CSV_PLACEHOLDER) != 1:
        return
    head, tail = template.split(CSV_PLACEHOLDER)
    if not (code.startswith(head) and code.endswith(tail)):
        return
    path = code[len(head) : len(code) - len(tail)]
    src = template.encode()
    tree = ast.parse(template)
    lines = [0]
    for line in src.splitlines(keepends=True):
        lines.append(lines[-1] + len(line))
    records = list(csv.reader(io.StringIO(checker.csv_text())))
    header, first = (records[0], records[1]) if len(records) > 1 else ([], [])

    def edit(kind: str, detail: str, node: ast.AST, text: str) -> Variant:
        start = lines[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = lines[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        new = (src[:start] + text.encode() + src[end:]).decode()
        return kind, detail, {"code": new.replace(CSV_PLACEHOLDER, path), "_template": new}

    def numeric(name: str) -> bool:
        try:
            float(first[header.index(name)])
            return True
        except (ValueError, IndexError):
            return False

    later: list[Variant] = []  # weaker mistakes, tried after the data ones
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in header:
            old = node.slice.value
            others = sorted((h for h in header if h not in (old, "id")), key=lambda h: numeric(h) != numeric(old))
            for name in others[:3]:
                yield edit("python.wrong_column", f"column {old!r} -> {name!r}", node.slice, repr(name))
        elif isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Name) and node.iter.id == "rows":
            yield edit("python.off_by_one", "skips the first row", node.iter, "rows[1:]")
            yield edit("python.off_by_one", "skips the last row", node.iter, "rows[:-1]")
        elif isinstance(node, ast.Slice) and isinstance(node.lower, ast.UnaryOp) and isinstance(node.lower.operand, ast.Constant):
            k = node.lower.operand.value
            if not isinstance(k, int):
                continue
            yield edit("python.off_by_one", f"slice -{k} -> -{k - 1}", node.lower, f"-{k - 1}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Call):
            yield edit("python.off_by_one", "denominator minus one", node.right, f"({ast.unparse(node.right)} - 1)")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "round" and len(node.args) == 2:
            later.append(edit("python.off_by_one", "rounds to 1 decimal", node.args[1], "1"))
        elif isinstance(node, ast.Compare) and isinstance(node.comparators[0], ast.Constant):
            target = node.left
            if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and target.slice.value in header:
                j = header.index(target.slice.value)
                pool = sorted({r[j] for r in records[1:] if len(r) > j} - {node.comparators[0].value})
                for k in rng.permutation(len(pool))[:3]:
                    yield edit("python.wrong_filter", f"filter -> {pool[k]!r}", node.comparators[0], repr(pool[k]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"\d{4}-\d{2}", node.value):
            m = int(node.value[5:])
            new = f"{node.value[:5]}{m + 1 if m < 12 else m - 1:02d}"
            yield edit("python.wrong_filter", f"month {node.value} -> {new}", node, repr(new))
        elif isinstance(node, ast.Attribute) and node.attr in _STAT_SWAP and getattr(node.value, "id", "") == "statistics":
            yield edit(
                "python.wrong_statistic", f"{node.attr} -> {_STAT_SWAP[node.attr]}", node, f"statistics.{_STAT_SWAP[node.attr]}"
            )
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Name):
            names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
            names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
            for name in sorted(names - {node.right.id, "rows", "f"}):
                yield edit("python.wrong_statistic", f"divides by {name} instead of {node.right.id}", node.right, name)
    yield from later


# -- SMTP ----------------------------------------------------------------------------------------


def _smtp_variants(
    arguments: dict[str, Any], sub: SubTask, tables: dict[str, Any], rng: np.random.Generator
) -> Iterator[Variant]:
    to = list(arguments["to"]) if isinstance(arguments["to"], list) else [arguments["to"]]
    cc = list(arguments.get("cc", []))
    staff = [(r[2], r[3], r[4]) for r in tables.get("staff", {}).get("rows", [])]  # email, role, unit
    role = {e: (ro, u) for e, ro, u in staff}
    others = [e for e, _, _ in staff if e not in to and e not in cc]
    same_role = [e for e in others if role[e][0] == role.get(to[0], ("", ""))[0]]
    for email in (same_role + [e for e in others if e not in same_role])[:3]:
        yield "smtp.wrong_recipient", f"{to[0]} -> {email}", {**arguments, "to": [email, *to[1:]]}
    body = arguments["body"]
    for figure in sub.figures:
        text = f"{figure:.2f}"
        if text in body:
            yield "smtp.missing_figure", f"{text} left out", {**arguments, "body": body.replace(text, "", 1)}
    numbers = re.findall(r"-?\d+(?:\.\d+)?", body)
    if numbers:
        yield "smtp.missing_figure", "all figures left out", {**arguments, "body": re.sub(r"-?\d+(?:\.\d+)?", "", body)}
    if cc:
        yield "smtp.missing_cc", f"Cc {', '.join(cc)} left out", {k: v for k, v in arguments.items() if k != "cc"}
    if arguments.get("attachments"):
        yield "smtp.missing_attachment", "attachment left out", {k: v for k, v in arguments.items() if k != "attachments"}
    for k in rng.permutation(len(others))[:2]:
        yield "smtp.extra_recipient", f"also to {others[k]}", {**arguments, "to": [*to, others[k]]}
    for figure in sub.figures:
        text = f"{figure:.2f}"
        if text in body:
            wrong = f"{figure * 1.1 + 1:.2f}"
            yield "smtp.wrong_figure", f"{text} -> {wrong}", {**arguments, "body": body.replace(text, wrong, 1)}


# -- output --------------------------------------------------------------------------------------


def _writable_dir(out_dir: str | Path) -> Path:
    if not str(out_dir).strip():  # Path("") is the current directory: the files would land wherever one stands
        raise ConfigError("the output directory is empty: pass a folder name such as reward-report (. for this one)")
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"cannot write to {str(out_dir)[:200]!r} ({reason}); pass a writable directory") from None
    return path


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"step": pa.int32(), "subtask": pa.int32(), "label": pa.float32(), "errors": pa.bool_()}
    types.update(prompt=pa.large_string(), action=pa.large_string())
    schema = pa.schema([(name, types.get(name, pa.string())) for name in COLUMNS])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
