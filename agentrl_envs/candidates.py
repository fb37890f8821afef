"""Candidate actions for ``candidates=K``: the oracle's next action and K-1 plausible wrong ones.

Wrong candidates are perturbations of the right one, the mistakes an agent really makes:
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
  (:func:`_perturb_hard` and the easy one), the K-1 whose :func:`overlap_score` with the context
  (instruction + last observation) is closest to the right call's are kept (ties broken by the
  env's generator), an adversarial filter against the surface heuristic: it then scores like a
  random pick.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl_envs.actions import format_call
from agentrl_envs.tasks.base import Task
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.progress import Progress

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
    """Meaning-changing variants that keep the instruction's entities and figures."""
    domain = DOMAINS[task.domain]
    out: list[str] = []
    if name == "sql":
        query = arguments["query"]
        variants = [
            _swap_words(query, [("SUM(", "AVG("), ("AVG(", "SUM("), ("AVG(", "MAX("), ("SUM(", "MAX(")]),
            _swap_words(query, [("COUNT(DISTINCT ", "COUNT(ALL "), ("COUNT(*)", f"COUNT(DISTINCT {domain.entity_key})")]),
            _swap_words(query, [(f"({domain.measure})", f"({domain.count})"), (f"(f.{domain.measure})", f"(f.{domain.count})")]),
            _swap_words(query, [(" DESC", " ASC"), ("LIMIT 1", "LIMIT 1 OFFSET 1"), (" > ", " <= "), (" > ", " < ")]),
            _each(query, r"(\w+) = '", lambda m: f"{m.group(1)} != '"),
            _each(query, r"'(\d{4})-(\d{2})'", lambda m: f"'{_shift_month(m.group(1), m.group(2), 1)}'"),
            _each(query, r"'(\d{4})-(\d{2})'", lambda m: f"'{_shift_month(m.group(1), m.group(2), -1)}'"),
            _each(query, r" AND [^']*'[^']*'", lambda m: ""),
        ]
        if " BETWEEN '2025-01-01' AND '2025-06-30'" in query:
            variants.append([query.replace("'2025-01-01' AND '2025-06-30'", "'2025-07-01' AND '2025-12-31'")])
        elif " BETWEEN '2025-07-01' AND '2025-12-31'" in query:
            variants.append([query.replace("'2025-07-01' AND '2025-12-31'", "'2025-01-01' AND '2025-06-30'")])
        out += [format_call("sql", {"query": v}) for vs in variants for v in vs]
    elif name == "python":
        code = arguments["code"]
        variants = [
            _swap_words(code, [("statistics.median(", "statistics.mean("), ("statistics.pstdev(", "statistics.stdev(")]),
            _swap_words(code, [("statistics.pstdev(", "statistics.median("), ("sum(vals) / len(vals)", "max(vals)")]),
            _swap_words(code, [(repr(domain.measure), repr(domain.count)), (repr(domain.count), repr(domain.measure))]),
            _each(code, r" == ", lambda m: " != "),
            _swap_words(
                code, [("(b - a) / a", "(a - b) / b"), ("(b - a) / a", "(b - a) / b"), ("part / total", "(total - part) / total")]
            ),
            _swap_words(
                code,
                [
                    ("for r in rows", "for r in rows[1:]"),
                    ("vals[-", "vals[:"),
                    ("sum(vals) / len(vals)", "sum(vals) / (len(vals) + 1)"),
                ],
            ),
        ]
        pairs = re.findall(r"total\('(\d{4}-\d{2})'\), total\('(\d{4}-\d{2})'\)", code)
        for m1, m2 in pairs:
            variants.append([code.replace(f"total({m1!r}), total({m2!r})", f"total({m2!r}), total({m1!r})")])
        out += [format_call("python", {"code": v}) for vs in variants for v in vs]
    elif name == "smtp":
        staff = domain.staff(task.data.tables) if task.data is not None else []
        to, cc = list(_as_list(arguments["to"])), list(arguments.get("cc", []))
        rest = {key: v for key, v in arguments.items() if key not in ("to", "cc")}
        if cc:
            out.append(format_call("smtp", {**rest, "to": cc, "cc": to}))
            out.append(format_call("smtp", {**rest, "to": [*to, *cc]}))
        for person in staff:
            if person.email in to or person.email in cc:
                continue
            if person.role == "director" or person.unit in context:
                out.append(format_call("smtp", {**arguments, "to": [person.email]}))
                out.append(format_call("smtp", {**arguments, "cc": [*cc, person.email]}))
        figures = _numbers(arguments["body"])
        for other in _numbers(context):
            for figure in figures:
                if other != figure and "." in other:
                    out.append(format_call("smtp", {**arguments, "body": arguments["body"].replace(figure, other)}))
        if len(figures) == 2:
            a, b = figures
            out.append(
                format_call("smtp", {**arguments, "body": arguments["body"].replace(a, "\0").replace(b, a).replace("\0", b)})
            )
    if name != "finish":
        out += [format_call("finish", {"answer": n}) for n in _numbers(context)[:4]]  # finishing early
    if name == "finish":
        answer = arguments["answer"]
        for other in _numbers(context):
            if other != answer:
                out.append(format_call("finish", {"answer": other}))
        # Right-looking figures and names from another computation, found nowhere in the context.
        if re.fullmatch(r"-?\d+(?:\.\d+)?", answer):
            x, decimals = float(answer), len(answer.partition(".")[2])
            for y in (x + 1, x - 1, x * 2, x / 2, x * 1.1, x * 0.9):
                out.append(format_call("finish", {"answer": f"{y:.{decimals}f}"}))
        elif task.data is not None and domain.entity in task.data.tables:
            table = task.data.tables[domain.entity]
            columns = [c[0] if isinstance(c, (list, tuple)) else c for c in table["columns"]]
            if "name" in columns:
                col = columns.index("name")
                names = [str(row[col]) for row in table["rows"][:12]]
                out += [format_call("finish", {"answer": n}) for n in names if n != answer]
        for word in re.findall(r"'([^']+)'", context):
            if word != answer:
                out.append(format_call("finish", {"answer": word}))
    return out


def _swap_words(text: str, swaps: list[tuple[str, str]]) -> list[str]:
    return [text.replace(a, b, 1) for a, b in swaps if a in text]


def _each(text: str, pattern: str, make: Any) -> list[str]:
    """One variant per match of ``pattern``, with only that match replaced."""
    return [text[: m.start()] + make(m) + text[m.end() :] for m in re.finditer(pattern, text)]


def _shift_month(year: str, month: str, by: int) -> str:
    index = int(year) * 12 + int(month) - 1 + by
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def _numbers(text: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"-?\d+(?:\.\d+)?", text)))


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _tool_of(action: str) -> str:
    match = re.search(r'"name": "(\w+)"', action)
    return match.group(1) if match else ""


def _perturb(task: Task, name: str, arguments: dict[str, Any]) -> list[str]:
    domain = DOMAINS[task.domain]
    out: list[str] = []
    if name == "sql":
        query = arguments["query"]
        for old in re.findall(r"'([^']*)'", query):
            pool = domain.units if old in domain.units else domain.categories if old in domain.categories else ()
            for other in pool:
                if other != old:
                    out.append(format_call("sql", {"query": query.replace(f"'{old}'", f"'{other}'", 1)}))
                    break
        for a, b in (("SUM(", "AVG("), ("AVG(", "SUM("), ("COUNT(*)", "SUM(1) + 1"), ("DESC", "ASC")):
            if a in query:
                out.append(format_call("sql", {"query": query.replace(a, b, 1)}))
        if " WHERE " in query:
            head = query.split(" WHERE ")[0]
            out.append(format_call("sql", {"query": head}))
        out.append(format_call("sql", {"query": query.replace(f" {domain.fact}", f" {domain.entity}", 1)}))
    elif name == "python":
        code = arguments["code"]
        out.append(format_call("python", {"code": code.replace(repr(domain.measure), repr(domain.count), 1)}))
        out.append(format_call("python", {"code": code.replace("for r in rows", "for r in rows[1:]", 1)}))
        out.append(format_call("python", {"code": code.rstrip().rstrip(")")}))
        out.append(format_call("python", {"code": re.sub(r"'results/q\d+\.csv'", "'results/q0.csv'", code, count=1)}))
    elif name == "smtp":
        staff = [s.email for s in domain.staff(task.data.tables)] if task.data is not None else []
        to = list(arguments["to"])
        others = [e for e in staff if e not in to and e not in arguments.get("cc", [])]
        if others:
            out.append(format_call("smtp", {**arguments, "to": [others[0], *to[1:]]}))
            out.append(format_call("smtp", {**arguments, "to": [*to, others[-1]]}))
        if arguments.get("cc"):
            out.append(format_call("smtp", {k: v for k, v in arguments.items() if k != "cc"}))
        out.append(format_call("smtp", {**arguments, "body": _shift_numbers(arguments["body"])}))
        if arguments.get("attachments"):
            out.append(format_call("smtp", {k: v for k, v in arguments.items() if k != "attachments"}))
    elif name == "finish":
        answer = arguments["answer"]
        shifted = _shift_numbers(answer)
        if shifted != answer:
            out.append(format_call("finish", {"answer": shifted}))
        for sub in task.subtasks:
            for n in sub.names:
                out.append(format_call("finish", {"answer": n.split()[0] + " Unknown"}))
    return out


def _generic(task: Task, name: str) -> list[str]:
    domain = DOMAINS[task.domain]
    out = []
    if name != "finish":
        guess = task.subtasks[0].answer or "done"
        out.append(format_call("finish", {"answer": _shift_numbers(guess) if guess != "done" else guess}))
    out.append(format_call("sql", {"query": f"SELECT * FROM {domain.fact} LIMIT 5"}))
    out.append(format_call("python", {"code": "import os\nprint(sorted(os.listdir('.')))"}))
    return out


def _shift_numbers(text: str) -> str:
    def bump(m: re.Match[str]) -> str:
        value = float(m.group(0))
        return f"{value * 1.1 + 1:.2f}" if "." in m.group(0) else str(int(value) + 1)

    return re.sub(r"\d+(?:\.\d+)?", bump, text, count=0)
