"""Candidate actions for ``candidates=K``: the oracle's next action and K-1 plausible wrong ones.

Wrong candidates are perturbations of the right one, the mistakes an agent really makes:
SQL with another filter value, another aggregate or no filter; Python reading the wrong column,
dropping a row or not parsing; email to the wrong person, without the Cc or with a wrong figure;
and finishing early or with a wrong answer. None of them ends the episode except a ``finish``,
so the oracle can still solve the task from wherever a wrong candidate leads.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl_envs.actions import format_call
from agentrl_envs.tasks.base import Task
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.progress import Progress

__all__ = ["make_candidates"]


def make_candidates(
    task: Task, progress: Progress, oracle: str, k: int, rng: np.random.Generator, tools: tuple[str, ...]
) -> list[str]:
    """K distinct action strings, shuffled by ``rng``, exactly one of which is ``oracle``."""
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
