"""The simulated company REST service behind the ``http`` tool: resources, pagination, validation, writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.http_templates import TICKETS, with_tickets
from simulators import SimulatorApp
from simulators.http import CompanyAPI, RequestError, check_call
from simulators.http.request import MAX_BODY_BYTES
from simulators.http.route import reply_of

DOMAIN = DOMAINS["retail"]


@pytest.fixture(scope="module")
def tables() -> dict[str, Any]:
    return with_tickets(DOMAIN, DOMAIN.generate(0), 0)


@pytest.fixture
def api(tables: dict[str, Any]) -> CompanyAPI:
    return CompanyAPI.from_tables(tables)


def call(api: CompanyAPI, method: str, path: str, body: Any = None, query: Any = None) -> tuple[int, Any]:
    payload: dict[str, Any] = {"method": method, "path": path}
    if body is not None:
        payload["body"] = body
    if query is not None:
        payload["query"] = query
    return api.handle(check_call(payload))


def test_collections_come_from_the_episode_tables(api: CompanyAPI, tables: dict[str, Any]) -> None:
    status, body = call(api, "GET", "/v1")
    assert status == 200 and body["collections"] == list(tables)
    status, body = call(api, "GET", "/v1/customers/3")
    assert status == 200 and body == dict(zip([c for c, _ in tables["customers"]["columns"]], tables["customers"]["rows"][2]))


def test_pagination_and_filters(api: CompanyAPI, tables: dict[str, Any]) -> None:
    seen: list[int] = []
    offset: int | None = 0
    while offset is not None:
        status, page = call(api, "GET", "/v1/orders", query={"limit": 100, "offset": offset, "region": "north"})
        assert status == 200 and page["limit"] == 100 and page["offset"] == offset
        seen += [r["id"] for r in page["items"]]
        offset = page["next_offset"]
    north = [r[0] for r in tables["orders"]["rows"] if r[3] == "north"]
    assert seen == north and page["total"] == len(north)
    status, page = call(api, "GET", "/v1/tickets", query={"limit": "5", "offset": "2"})  # numbers as text work too
    assert status == 200 and [t["ticket_id"] for t in page["items"]] == [3, 4, 5, 6, 7] and page["total"] == TICKETS


@pytest.mark.parametrize(
    ("method", "path", "body", "query", "status", "kind"),
    [
        ("GET", "/v1/nope", None, None, 404, "not_found"),
        ("GET", "/v2/customers", None, None, 404, "not_found"),
        ("GET", "/v1/customers/999", None, None, 404, "not_found"),
        ("GET", "/v1/customers/abc", None, None, 404, "not_found"),
        ("GET", "/v1/customers", None, {"limit": 0}, 400, "bad_parameter"),
        ("GET", "/v1/customers", None, {"limit": 101}, 400, "bad_parameter"),
        ("GET", "/v1/customers", None, {"offset": -1}, 400, "bad_parameter"),
        ("GET", "/v1/customers", None, {"colour": "red"}, 400, "unknown_parameter"),
        ("GET", "/v1/customers", None, {"customer_id": "x"}, 400, "bad_parameter"),
        ("POST", "/v1/customers", {"name": "x"}, None, 405, "method_not_allowed"),
        ("DELETE", "/v1/orders/1", None, None, 405, "method_not_allowed"),
        ("POST", "/v1/tickets", {"title": "x"}, None, 422, "validation"),
        ("POST", "/v1/tickets", {"customer_id": 1, "title": "x", "priority": "asap", "assignee": "a@b"}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {"status": "done"}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {"assignee": "nobody@retail.example"}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {"customer_id": 999}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {"ticket_id": 2}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {"priority": 3}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {"title": "x" * 201}, None, 422, "validation"),
        ("PATCH", "/v1/tickets/1", {}, None, 422, "validation"),
        ("POST", "/openapi.json", {}, None, 405, "method_not_allowed"),
    ],
)
def test_bad_requests_get_4xx_with_a_reason(
    api: CompanyAPI, method: str, path: str, body: Any, query: Any, status: int, kind: str
) -> None:
    got, answer = call(api, method, path, body, query)
    assert got == status and answer["error"]["type"] == kind and answer["error"]["message"], answer
    _, ticket = call(api, "GET", "/v1/tickets/1")
    assert ticket["status"] in ("open", "pending", "closed")  # a refused write changed nothing


def test_writes_change_the_state(api: CompanyAPI, tables: dict[str, Any]) -> None:
    manager = next(r[2] for r in tables["staff"]["rows"] if r[3] == "manager")
    status, made = call(
        api, "POST", "/v1/tickets", {"customer_id": 4, "title": "Call back", "priority": "high", "assignee": manager}
    )
    assert status == 201 and made["ticket_id"] == TICKETS + 1 and made["status"] == "open"
    status, changed = call(api, "PATCH", f"/v1/tickets/{made['ticket_id']}", {"status": "closed"})
    assert status == 200 and changed == {**made, "status": "closed"}
    assert call(api, "GET", f"/v1/tickets/{made['ticket_id']}")[1]["status"] == "closed"
    assert call(api, "DELETE", f"/v1/tickets/{made['ticket_id']}") == (204, None)
    assert call(api, "GET", f"/v1/tickets/{made['ticket_id']}")[0] == 404
    assert call(api, "GET", "/v1/tickets", query={"limit": 1})[1]["total"] == TICKETS


def test_filters_are_values_not_sql(api: CompanyAPI) -> None:
    """Read-only collections are answered by SQL on the episode's copy; a filter is a literal, never code."""
    for hostile in ("x' OR '1'='1", "x'; DROP TABLE customers; --", "' UNION SELECT * FROM staff --"):
        status, page = call(api, "GET", "/v1/customers", query={"name": hostile})
        assert status == 200 and page["total"] == 0 and page["items"] == []
    status, answer = call(api, "PATCH", "/v1/tickets/1", {"assignee": "a' OR 1=1 --"})
    assert status == 422 and "not the email" in answer["error"]["message"]
    status, answer = call(api, "PATCH", "/v1/tickets/1", {"assignee": "a\x00b"})
    assert 400 <= status < 500
    assert call(api, "GET", "/v1/customers", query={"limit": 1})[1]["total"] == 40


def test_openapi_document_lists_every_collection(api: CompanyAPI, tables: dict[str, Any]) -> None:
    status, doc = call(api, "GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    for name in tables:
        assert f"/v1/{name}" in doc["paths"] and f"/v1/{name}/{{id}}" in doc["paths"]
    assert set(doc["paths"]["/v1/tickets"]) == {"get", "post"} and "patch" in doc["paths"]["/v1/tickets/{id}"]
    assert doc["components"]["schemas"]["tickets"]["properties"]["priority"]["enum"] == ["low", "normal", "high", "urgent"]
    json.dumps(doc)


@pytest.mark.parametrize(
    ("payload", "status", "kind"),
    [
        ({"method": "GET", "path": "http://evil.example/x"}, 400, "bad_path"),
        ({"method": "GET", "path": "//evil.example/x"}, 400, "bad_path"),
        ({"method": "GET", "path": "v1/customers"}, 400, "bad_path"),
        ({"method": "GET", "path": "/v1/../../etc/passwd"}, 400, "bad_path"),
        ({"method": "GET", "path": "/v1/%2e%2e/%2E%2E/etc/passwd"}, 400, "bad_path"),
        ({"method": "GET", "path": "/v1/customers\r\nX-Injected: 1"}, 400, "bad_path"),
        ({"method": "GET", "path": "/v1/customers%0d%0aX-Injected:%201"}, 400, "bad_path"),
        ({"method": "GET", "path": "/v1\\customers"}, 400, "bad_path"),
        ({"method": "GET", "path": "/v1/customers?name=x"}, 400, "bad_path"),
        ({"method": "GET", "path": "/" + "a" * 5000}, 413, "too_large"),
        ({"method": "GET", "path": "/v1/customers", "query": {"name": "a\r\nb"}}, 400, "bad_request"),
        ({"method": "GET", "path": "/v1/customers", "query": {"bad key": 1}}, 422, "bad_arguments"),
        ({"method": "GET", "path": "/v1/customers", "query": {"name": ["a"]}}, 422, "bad_arguments"),
        ({"method": "GET", "path": "/v1/customers", "body": {"a": 1}}, 400, "bad_request"),
        ({"method": "POST", "path": "/v1/tickets", "body": {"title": "x" * (MAX_BODY_BYTES + 1)}}, 413, "too_large"),
        ({"method": "POST", "path": "/v1/tickets", "body": {"x": float("nan")}}, 422, "bad_arguments"),
        ({"method": "PUT", "path": "/v1/tickets/1"}, 422, "bad_arguments"),
        ({"method": "TRACE", "path": "/"}, 422, "bad_arguments"),
        ({"method": "GET", "path": "/", "headers": {"Host": "evil"}}, 422, "bad_arguments"),
        ({"path": "/"}, 422, "bad_arguments"),
        ("GET /", 422, "bad_arguments"),
    ],
)
def test_hostile_requests_are_refused(payload: Any, status: int, kind: str) -> None:
    with pytest.raises(RequestError) as caught:
        check_call(payload)
    assert (caught.value.status, caught.value.kind) == (status, kind), caught.value.message


def test_null_and_empty_body_or_query_are_left_out() -> None:
    from agentrl_envs.tools import get_tool

    assert check_call({"method": "GET", "path": "/v1", "body": {}, "query": None}) == check_call({"method": "GET", "path": "/v1"})
    assert get_tool("http").validate({"method": "GET", "path": "/v1", "body": None}) == {"method": "GET", "path": "/v1"}


def test_method_allow_list() -> None:
    with pytest.raises(RequestError) as caught:
        check_call({"method": "DELETE", "path": "/v1/tickets/1"}, methods=("GET",))
    assert caught.value.status == 405 and caught.value.kind == "method_not_allowed"


@settings(max_examples=150, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PATCH", "DELETE"]),
    path=st.text(max_size=40).map(lambda s: "/" + s),
    body=st.none() | st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text(max_size=8), max_size=4),
    query=st.none() | st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=4),
)
def test_any_call_gets_an_answer_never_an_exception(method: str, path: str, body: Any, query: Any) -> None:
    api = _API
    payload: dict[str, Any] = {"method": method, "path": path, "body": body, "query": query}
    try:
        checked = check_call(payload)
    except RequestError as exc:
        assert 400 <= exc.status < 500
        return
    status, answer = api.handle(checked)
    assert 200 <= status < 500
    json.dumps(answer)
    reply_status, reply = reply_of(status, answer)
    assert reply is not None and reply["ok"] is (200 <= status < 300) and reply_status in (200, status)


_API = CompanyAPI.from_tables(with_tickets(DOMAIN, DOMAIN.generate(1), 1))


def test_the_app_keeps_one_service_per_episode(tables: dict[str, Any]) -> None:
    app = SimulatorApp(python_sandbox=False)
    try:
        from simulators.app import template_fingerprint

        fingerprint = template_fingerprint("t", tables)
        assert app.put_database(fingerprint, {"tables": tables})[0] == 204
        for episode in ("a", "b"):
            assert app.open_episode({"episode_id": episode, "database": fingerprint})[0] == 201
        close = {"method": "PATCH", "path": "/v1/tickets/1", "body": {"status": "closed"}}
        status, reply = app.tool("a", "http", close)
        assert status == 200 and reply is not None and reply["result"]["body"]["status"] == "closed"
        get = {"method": "GET", "path": "/v1/tickets/1"}
        assert app.tool("b", "http", get)[1]["result"]["body"] == dict(  # type: ignore[index]
            zip([c for c, _ in tables["tickets"]["columns"]], tables["tickets"]["rows"][0])
        )
        assert app.tool("a", "http", get)[1]["result"]["body"]["status"] == "closed"  # type: ignore[index]
        status, reply = app.tool("a", "http", {"method": "GET", "path": "/../x"})
        assert status == 400 and reply is not None and reply["error"]["type"] == "bad_path"
        assert app.open_episode({"episode_id": "c"})[0] == 201
        assert app.tool("c", "http", get)[0] == 404
    finally:
        app.close()
