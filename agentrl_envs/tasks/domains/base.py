"""A task domain: a schema with semantic roles, and a seeded data generator.

Every domain has the same shape, so task templates are written once and read naturally in each:

- a fact table (orders, transactions, payroll, shipments) with an entity key, a category, a unit,
  a date, a money measure and a count,
- an entity table (customers, accounts, employees, clients) with names,
- a ``staff`` table: the people to email (a manager and an analyst per unit, one director).

Adding a domain is one file that builds a :class:`Domain` and one line in ``domains/__init__.py``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Domain", "Staff"]

FIRST = (
    "Ada Alan Bea Carl Dana Eli Faye Gus Hana Ivan Jude Kai Lena Milo Nora Omar Pia Quinn Rosa Sam "
    "Tara Umar Vera Wes Xena Yuri Zoe Arno Beth Cruz Dita Enzo Fern Gil Hugo Iris Joel Kira Luis Maya"
).split()
LAST = (
    "Abbott Baker Chen Diaz Evans Fischer Garcia Haas Ito Jensen Khan Lopez Meyer Novak Ortiz Park "
    "Quint Rossi Silva Tanaka Ueda Vogel Weber Xu Young Zimmer Adler Brandt Costa Dubois"
).split()

MONTHS = tuple(f"2025-{m:02d}" for m in range(1, 13))


@dataclass(frozen=True)
class Staff:
    name: str
    email: str
    role: str
    unit: str


@dataclass(frozen=True)
class Domain:
    """Schema roles and vocabulary of one domain.

    Attributes:
        name: domain id (``retail``).
        fact, fact_noun: fact table and what one row is (``orders``, ``order``).
        entity, entity_noun: entity table and what one row is (``customers``, ``customer``).
        entity_key: the fact table's foreign key to the entity table.
        category, category_noun, categories: a categorical column of the fact table and its values.
        unit, unit_noun, units: the organisational unit column (region, branch, ...) and its values.
        date: ISO date column (2025) of the fact table.
        measure, measure_noun: money column and how to say it (``amount``, ``order amount``).
        count, count_noun: integer column and how to say it.
        mail_domain: the company's email domain.
        scale: typical size of ``measure``.
        rows: number of fact rows.
        company: where the agent works, as the instruction says it (default "a <name> company").
    """

    name: str
    fact: str
    fact_noun: str
    entity: str
    entity_noun: str
    entity_key: str
    category: str
    category_noun: str
    categories: tuple[str, ...]
    unit: str
    unit_noun: str
    units: tuple[str, ...]
    date: str
    measure: str
    measure_noun: str
    count: str
    count_noun: str
    mail_domain: str
    scale: float = 100.0
    rows: int = 600
    company: str = ""

    @property
    def where(self) -> str:
        """Where the agent works, for the instruction ("a retail company")."""
        return self.company or f"a {self.name} company"

    def generate(self, data_seed: int) -> dict[str, dict[str, Any]]:
        """The domain's tables for one data seed, as ``{name: {"columns", "rows", "primary_key", "indexes"}}``."""
        rng = np.random.default_rng([data_seed, _stable(self.name)])
        n_entities = 40
        names = _unique_names(rng, n_entities + len(self.units) * 2 + 2)
        entities = [[i + 1, names[i], str(rng.choice(["gold", "silver", "bronze"]))] for i in range(n_entities)]
        facts = []
        # Each unit and category gets its own level, so aggregates differ and tasks have one answer.
        unit_level = {u: float(rng.uniform(0.6, 1.6)) for u in self.units}
        cat_level = {c: float(rng.uniform(0.5, 1.8)) for c in self.categories}
        for i in range(self.rows):
            unit = self.units[int(rng.integers(len(self.units)))]
            cat = self.categories[int(rng.integers(len(self.categories)))]
            month = int(rng.integers(1, 13))
            day = int(rng.integers(1, 29))
            value = self.scale * unit_level[unit] * cat_level[cat] * float(rng.lognormal(0.0, 0.6))
            facts.append(
                [
                    i + 1,
                    int(rng.integers(1, n_entities + 1)),
                    cat,
                    unit,
                    f"2025-{month:02d}-{day:02d}",
                    round(value, 2),
                    int(rng.integers(1, 20)),
                ]
            )
        staff_rows = []
        people = names[n_entities:]
        k = 0
        for unit in self.units:
            for role in ("manager", "analyst"):
                name = people[k]
                k += 1
                staff_rows.append([k, name, _email(name, self.mail_domain), role, unit])
        director = people[k]
        staff_rows.append([k + 1, director, _email(director, self.mail_domain), "director", "all"])
        return {
            self.entity: {
                "columns": [[self.entity_key, "INTEGER"], ["name", "TEXT"], ["tier", "TEXT"]],
                "rows": entities,
                "primary_key": [self.entity_key],
            },
            self.fact: {
                "columns": [
                    ["id", "INTEGER"],
                    [self.entity_key, "INTEGER"],
                    [self.category, "TEXT"],
                    [self.unit, "TEXT"],
                    [self.date, "TEXT"],
                    [self.measure, "REAL"],
                    [self.count, "INTEGER"],
                ],
                "rows": facts,
                "primary_key": ["id"],
                # Joins to the entity table, and the unit filters and groupings most tasks use.
                "indexes": [[self.entity_key], [self.unit]],
            },
            "staff": {
                "columns": [["staff_id", "INTEGER"], ["name", "TEXT"], ["email", "TEXT"], ["role", "TEXT"], ["unit", "TEXT"]],
                "rows": staff_rows,
                "primary_key": ["staff_id"],
            },
        }

    def schema_text(self, tables: dict[str, dict[str, Any]]) -> str:
        """One line per table: ``name(col, col, ...)``."""
        return "\n".join(f"- {name}({', '.join(c for c, _ in t['columns'])})" for name, t in tables.items())

    @staticmethod
    def staff(tables: dict[str, dict[str, Any]]) -> list[Staff]:
        return [Staff(name=r[1], email=r[2], role=r[3], unit=r[4]) for r in tables["staff"]["rows"]]


def fingerprint(domain: str, data_seed: int, tables: dict[str, dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()[:16]
    return f"{domain}-{data_seed}-{digest}"


def _stable(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def _unique_names(rng: np.random.Generator, n: int) -> list[str]:
    pairs = [f"{first} {last}" for first in FIRST for last in LAST]
    idx = rng.permutation(len(pairs))[:n]
    return [pairs[i] for i in idx]


def _email(name: str, domain: str) -> str:
    first, last = name.lower().split()
    return f"{first}.{last}@{domain}"
