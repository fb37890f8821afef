"""The ``http`` tool: one call to the company's internal REST service (CRM and ticketing)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agentrl_envs.backends.base import Backend, ToolResponse
from agentrl_envs.errors import ActionError
from agentrl_envs.tasks.base import APISpec, SubTask, Task
from agentrl_envs.tasks.state import StepState
from agentrl_envs.text.observation import clip
from agentrl_envs.tools.base import Tool, check_arguments, pick, render_error
from simulators.http.request import METHODS, RequestError, check_call
from simulators.http.service import PRIORITIES, STATUSES

__all__ = ["HTTPTool", "api_matches"]


@dataclass(frozen=True)
class HTTPTool(Tool):
    """A REST call with a method, a path relative to the service, a JSON body and query parameters."""

    name: ClassVar[str] = "http"
    description: ClassVar[str] = (
        "Call the company's internal REST service (CRM and ticketing). 'path' is relative to the "
        "service (GET /openapi.json describes every resource, its fields and filters); lists are "
        "paginated with limit and offset; POST and PATCH take a JSON object 'body'."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "method": {"type": "string", "enum": list(METHODS), "description": "the HTTP method"},
            "path": {"type": "string", "description": "the path, e.g. /v1/tickets/12"},
            "body": {"type": "object", "description": "the JSON body of a POST or PATCH"},
            "query": {"type": "object", "description": "query parameters: filters, limit, offset"},
        },
        "required": ["method", "path"],
    }
    aux_term: ClassVar[float | None] = 0.5
    log_names: ClassVar[tuple[str, ...]] = ("http", "rest", "crm", "ticket")
    backend_schemes: ClassVar[tuple[str, ...]] = ("http://", "https://")
    component: ClassVar[str | None] = "api"
    max_chars: int = 8000

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Types from the schema, then the request checks every backend applies (relative path, sizes).

        A ``null`` body or query is dropped (as if left out), as function-calling models often send them.
        """
        arguments = {k: v for k, v in arguments.items() if not (k in ("body", "query") and v is None)}
        check_arguments(self.name, self.parameters, arguments)
        try:
            check_call(arguments)
        except RequestError as exc:
            raise ActionError("bad_arguments", f"http: {exc.message}") from None
        return arguments

    def succeeded(self, response: ToolResponse) -> bool:
        """The service answered 2xx."""
        return response.ok and isinstance(response.result.get("status"), int) and 200 <= response.result["status"] < 300

    def details(self, response: ToolResponse) -> dict[str, Any]:
        # Only fields of one type in every answer (vector envs merge info keys across sub-envs).
        status = response.result.get("status")
        return {"http_status": status if isinstance(status, int) else 0}

    def render(self, response: ToolResponse) -> str:
        if not response.ok:
            return render_error(self.name, response)
        status, body = response.result.get("status"), response.result.get("body")
        text = "(no content)" if body is None else json.dumps(body, ensure_ascii=False)
        return f"http ok [HTTP {status}]\n{clip(text, self.max_chars)}"

    def real_backend(self, url: str, **options: Any) -> Backend:
        from agentrl_envs.backends.rest import RESTBackend

        return RESTBackend(url)

    # -- progress -------------------------------------------------------------------------------------

    def observe(
        self, subs: Sequence[SubTask], states: Sequence[StepState], arguments: dict[str, Any], response: ToolResponse
    ) -> list[int]:
        """A successful answer that shows a sub-task's required state (or count) completes its step."""
        moved: list[int] = []
        if not self.succeeded(response):
            return moved
        for i, (sub, st) in enumerate(zip(subs, states)):
            if self.name in sub.steps and not st.done[self.name] and sub.api is not None:
                if api_matches(sub.api, arguments, response.result.get("body")):
                    st.done[self.name] = True
                    moved.append(i)
        return moved

    def gold_call(self, sub: SubTask, state: StepState) -> dict[str, Any] | None:
        if state.done[self.name] or sub.api is None:
            return None
        return _call(sub.api.method, sub.api.path, dict(sub.api.query), dict(sub.api.body))

    # -- candidates ------------------------------------------------------------------------------------

    def perturb(self, task: Task, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """Another record, another field value, a read instead of the write, a missing field or filter."""
        method, path = arguments["method"], arguments["path"]
        body, query = dict(arguments.get("body", {})), dict(arguments.get("query", {}))
        out: list[dict[str, Any]] = []
        head, _, last = path.rpartition("/")
        if last.isdigit():
            out.append(_call(method, f"{head}/{int(last) + 1}", query, body))
            out.append(_call(method, f"{head}/{max(1, int(last) - 1)}", query, body))
        if method != "GET":
            out.append(_call("GET", path, {}, {}))
        for name, pool in (("priority", PRIORITIES), ("status", STATUSES)):
            if name in body:
                out.append(_call(method, path, query, {**body, name: next(v for v in pool if v != body[name])}))
            if name in query:
                out.append(_call(method, path, {**query, name: next(v for v in pool if v != query[name])}, body))
        if "name" in query:
            out += [_call(method, path, {**query, "name": other}, body) for other in _other_names(task, query["name"])]
        for key in list(body)[:2]:
            out.append(_call(method, path, query, {k: v for k, v in body.items() if k != key}))
        for key in [k for k in query if k not in ("limit", "offset")][:2]:
            out.append(_call(method, path, {k: v for k, v in query.items() if k != key}, body))
        return out

    def perturb_hard(self, task: Task, arguments: dict[str, Any], context: str) -> list[dict[str, Any]]:
        """The same call on a neighbouring record, with a swapped enum value, or as DELETE."""
        out = self.perturb(task, arguments)
        if arguments["method"] == "PATCH":
            out.append(_call("DELETE", arguments["path"], {}, {}))
        return out

    def guess(self, task: Task) -> dict[str, Any] | None:
        return {"method": "GET", "path": "/openapi.json"}

    def random_arguments(self, task: Task | None, rng: np.random.Generator, number: float) -> dict[str, Any]:
        tables = list(task.data.tables) if task is not None and task.data is not None else ["tickets"]
        ticket = int(rng.integers(1, 40))
        return pick(
            rng,
            [
                {"method": "GET", "path": "/openapi.json"},
                {"method": "GET", "path": f"/v1/{pick(rng, tables)}", "query": {"limit": int(rng.integers(1, 30))}},
                {"method": "GET", "path": f"/v1/tickets/{ticket}"},
                {"method": "PATCH", "path": f"/v1/tickets/{ticket}", "body": {"status": pick(rng, STATUSES)}},
                {"method": "DELETE", "path": f"/v1/tickets/{ticket}"},
                {"method": "POST", "path": "/v1/tickets", "body": {"title": "Issue", "priority": pick(rng, PRIORITIES)}},
            ],
        )


def _other_names(task: Task, name: str, k: int = 2) -> list[str]:
    """Names of ``k`` other records of the task's entity table (a lookup of the wrong one)."""
    from agentrl_envs.tasks.domains import DOMAINS

    table = task.data.tables.get(DOMAINS[task.domain].entity) if task.data is not None else None
    names = [str(row[1]) for row in table["rows"]] if table else []
    return [n for n in names if n != name][:k]


def _call(method: str, path: str, query: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"method": method, "path": path}
    if body:
        out["body"] = body
    if query:
        out["query"] = query
    return out


def api_matches(spec: APISpec, arguments: dict[str, Any], body: Any) -> bool:
    """Whether a successful answer ``body`` (to a call with ``arguments``) shows what ``spec`` requires.

    A count (``spec.total``) needs a listing of the gold path with the gold filters answering that
    total; a state (``spec.expect``) needs one record of the answer (the record, or an item of a
    listing) holding every expected field.
    """
    if not isinstance(body, dict):
        return False
    if spec.total is not None:
        filters = {k: v for k, v in (arguments.get("query") or {}).items() if k not in ("limit", "offset")}
        gold = {k: v for k, v in spec.query if k not in ("limit", "offset")}
        same = arguments.get("path") == spec.path and {k: str(v) for k, v in filters.items()} == {
            k: str(v) for k, v in gold.items()
        }
        return same and body.get("total") == spec.total
    items = body.get("items")
    records = items if isinstance(items, list) else [body]
    expect = dict(spec.expect)
    return bool(expect) and any(isinstance(r, dict) and all(r.get(k) == v for k, v in expect.items()) for r in records)
