"""Task templates of the ``http`` tool: the company's CRM and ticketing service.

The data of an ``http`` task is the domain's tables plus a ``tickets`` table (:func:`with_tickets`),
which the simulated service serves as collections (:mod:`simulators.http.service`). Five templates:
two answered with ``finish`` (an entity's key looked up by name; a count of tickets, read from a
listing's ``total``) and three that change the service's state (open a ticket, close one, reassign
one), checked on what the service answers (:func:`agentrl_envs.tools.http.api_matches`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl_envs.tasks.base import APISpec, SubTask
from agentrl_envs.tasks.domains.base import Domain
from agentrl_envs.tasks.template_base import Context, Retry, TaskKind, Template, fmt
from simulators.http.service import PRIORITIES, STATUSES

__all__ = ["HTTP_TEMPLATES", "HTTP_WRITES", "TASK_KIND", "TICKETS", "with_tickets"]

#: Tickets in an http task's data.
TICKETS = 36
_ISSUES = ("Billing question", "Late delivery", "Account access", "Data correction", "Contract renewal", "Complaint")


def with_tickets(domain: Domain, tables: dict[str, dict[str, Any]], data_seed: int) -> dict[str, dict[str, Any]]:
    """``tables`` plus a ``tickets`` table drawn from ``data_seed`` (entities and staff of the same data)."""
    rng = np.random.default_rng([data_seed, 0x71C7])
    staff = [s.email for s in Domain.staff(tables) if s.role != "director"]
    n_entities = len(tables[domain.entity]["rows"])
    rows = []
    for i in range(TICKETS):
        entity = int(rng.integers(1, n_entities + 1))
        issue = _ISSUES[int(rng.integers(len(_ISSUES)))]
        rows.append(
            [
                i + 1,
                entity,
                f"{issue} ({domain.entity_noun} {entity})",
                PRIORITIES[int(rng.integers(len(PRIORITIES)))],
                STATUSES[int(rng.integers(len(STATUSES)))],
                staff[int(rng.integers(len(staff)))],
            ]
        )
    tickets = {
        "columns": [
            ["ticket_id", "INTEGER"],
            [domain.entity_key, "INTEGER"],
            ["title", "TEXT"],
            ["priority", "TEXT"],
            ["status", "TEXT"],
            ["assignee", "TEXT"],
        ],
        "rows": rows,
        "primary_key": ["ticket_id"],
    }
    return {**tables, "tickets": tickets}


def _tickets(c: Context) -> list[dict[str, Any]]:
    table = c.tables["tickets"]
    names = [col[0] for col in table["columns"]]
    return [dict(zip(names, row)) for row in table["rows"]]


def _entity(c: Context) -> tuple[int, str]:
    rows = c.tables[c.domain.entity]["rows"]
    row = rows[int(c.rng.integers(len(rows)))]
    return int(row[0]), str(row[1])


def _pairs(d: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(d.items()))


def http_lookup(c: Context) -> SubTask:
    d = c.domain
    key, name = _entity(c)
    params = c.check_split("http.lookup", {"name": name})
    return SubTask(
        "http.lookup",
        ("http",),
        f"Look up the {d.entity_noun} '{name}' in the CRM. What is their {d.entity_key}?",
        figures=(float(key),),
        answer=fmt(key),
        params=params,
        api=APISpec("GET", f"/v1/{d.entity}", query=_pairs({"name": name}), expect=_pairs({"name": name, d.entity_key: key})),
    )


def http_ticket_count(c: Context) -> SubTask:
    status, priority = c.choice(STATUSES), c.choice(PRIORITIES)
    params = c.check_split("http.ticket_count", {"status": status, "priority": priority})
    n = sum(1 for t in _tickets(c) if t["status"] == status and t["priority"] == priority)
    if n == 0:
        raise Retry
    return SubTask(
        "http.ticket_count",
        ("http",),
        f"How many tickets in the ticketing service have status '{status}' and priority '{priority}'?",
        figures=(float(n),),
        answer=fmt(n),
        params=params,
        api=APISpec("GET", "/v1/tickets", query=_pairs({"status": status, "priority": priority, "limit": 1}), total=n),
    )


def http_create_ticket(c: Context) -> SubTask:
    d = c.domain
    key, name = _entity(c)
    unit, priority = c.choice(d.units), c.choice(PRIORITIES)
    params = c.check_split("http.create_ticket", {"name": name, "unit": unit, "priority": priority})
    assignee = c.manager(unit).email
    expect = {d.entity_key: key, "priority": priority, "assignee": assignee, "status": "open"}
    if any(all(t.get(k) == v for k, v in expect.items()) for t in _tickets(c)):
        raise Retry  # the state would hold before the agent does anything
    title = f"Follow-up for {name}"
    body = {d.entity_key: key, "title": title, "priority": priority, "assignee": assignee}
    return SubTask(
        "http.create_ticket",
        ("http",),
        f"Open a ticket in the ticketing service for the {d.entity_noun} '{name}' ({d.entity_key} {key}) titled "
        f"'{title}', with priority '{priority}', assigned to the manager of the {d.unit_noun} '{unit}' (the staff "
        "directory is in the CRM).",
        params=params,
        api=APISpec("POST", "/v1/tickets", body=_pairs(body), expect=_pairs(expect)),
    )


def http_close_ticket(c: Context) -> SubTask:
    ticket = c.choice([t for t in _tickets(c) if t["status"] != "closed"])
    params = c.check_split("http.close_ticket", {"ticket": ticket["ticket_id"]})
    tid = ticket["ticket_id"]
    return SubTask(
        "http.close_ticket",
        ("http",),
        f"Ticket #{tid} ('{ticket['title']}') has been resolved: close it in the ticketing service (status 'closed').",
        params=params,
        api=APISpec(
            "PATCH",
            f"/v1/tickets/{tid}",
            body=_pairs({"status": "closed"}),
            expect=_pairs({"ticket_id": tid, "status": "closed"}),
        ),
    )


def http_reassign(c: Context) -> SubTask:
    d = c.domain
    ticket = c.choice([t for t in _tickets(c) if t["status"] != "closed"])
    unit = c.choice(d.units)
    analyst = next(s for s in c.analysts() if s.unit == unit)
    if ticket["assignee"] == analyst.email:
        raise Retry
    tid = ticket["ticket_id"]
    params = c.check_split("http.reassign", {"ticket": tid, "unit": unit})
    return SubTask(
        "http.reassign",
        ("http",),
        f"Reassign ticket #{tid} ('{ticket['title']}') to the analyst of the {d.unit_noun} '{unit}' (the staff "
        "directory is in the CRM).",
        params=params,
        api=APISpec(
            "PATCH",
            f"/v1/tickets/{tid}",
            body=_pairs({"assignee": analyst.email}),
            expect=_pairs({"ticket_id": tid, "assignee": analyst.email}),
        ),
    )


HTTP_TEMPLATES: tuple[Template, ...] = (http_lookup, http_ticket_count, http_create_ticket, http_close_ticket, http_reassign)
#: The templates that change the service's state (no final answer): the http part of ``Workplace-v1``.
HTTP_WRITES: tuple[Template, ...] = (http_create_ticket, http_close_ticket, http_reassign)

#: The ``http`` kind of task (``AgentRL/HTTP-v0``), found by :func:`~agentrl_envs.tasks.templates.discover_kinds`.
TASK_KIND = TaskKind(
    name="http",
    templates=HTTP_TEMPLATES,
    code=5,
    title="HTTP",
    database=True,  # the company service is built from the episode's database
    prepare=with_tickets,
    notes=(
        "\nThe company's internal REST service (CRM and ticketing) is reached with the http tool; "
        "GET /openapi.json describes its resources, fields and filters.",
    ),
    done='\nWhen the change is made, call finish with {"answer": "done"}.',
)
