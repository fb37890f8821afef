"""The simulator's REST API through ``httpx.MockTransport``: routes, status codes, JSON errors, workspaces."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulators import SimulatorApp
from simulators.app import EPISODE_TOKEN_HEADER, template_fingerprint
from simulators.python import RunLimits
from simulators.sql import build_database, format_rows

TABLES: dict[str, Any] = {
    "sales": {
        "columns": [["id", "INTEGER"], ["region", "TEXT"], ["amount", "REAL"], ["note", "TEXT"]],
        "rows": [
            [1, "north", 120.5, "plain"],
            [2, "south", 99.99, 'has "quotes", commas'],
            [3, "north", 1000.0, None],
            [4, "east", 7.25, "multi\nline"],
        ],
    }
}
FP = template_fingerprint("fp-sales", TABLES)


class OwnerClient(httpx.Client):
    """An httpx client that keeps the episode tokens it was given and sends them back, as the backends do."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokens: dict[str, str] = {}

    def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        parts = [p for p in request.url.path.split("/") if p]
        episode_id = parts[2] if len(parts) >= 3 and parts[:2] == ["v1", "episodes"] else None
        if request.url.path == "/v1/episodes" and request.method == "POST":
            try:
                episode_id = json.loads(request.content)["episode_id"]
            except (ValueError, KeyError, TypeError):
                episode_id = None
        if isinstance(episode_id, str) and episode_id in self.tokens:
            request.headers[EPISODE_TOKEN_HEADER] = self.tokens[episode_id]
        response = super().send(request, **kwargs)
        if request.url.path == "/v1/episodes" and request.method == "POST" and response.status_code == 201:
            result = response.json()["result"]
            self.tokens[result["episode_id"]] = result["episode_token"]
        return response


@pytest.fixture
def ws_root(tmp_path: Path) -> Path:
    root = tmp_path / "workspaces"
    root.mkdir()
    return root


@pytest.fixture
def app(ws_root: Path):
    a = SimulatorApp(sql_deadline_s=0.5, python_limits=RunLimits(wall_s=3.0, cpu_s=3), workspace_root=str(ws_root))
    yield a
    a.close()


@pytest.fixture
def client(app: SimulatorApp):
    with OwnerClient(transport=httpx.MockTransport(app.handle), base_url="http://agentrl.sim") as c:
        yield c


@pytest.fixture
def stranger(app: SimulatorApp):
    """Another client of the same server: it knows episode ids, not their tokens."""
    with httpx.Client(transport=httpx.MockTransport(app.handle), base_url="http://agentrl.sim") as c:
        yield c


@pytest.fixture
def episode(client: httpx.Client) -> str:
    assert client.put(f"/v1/databases/{FP}", json={"tables": TABLES}).status_code == 204
    r = client.post("/v1/episodes", json={"episode_id": "ep-1", "database": FP})
    assert r.status_code == 201, r.text
    return "ep-1"


def _error(r: httpx.Response, status: int, kind: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["ok"] is False
    assert isinstance(body["error"]["message"], str)
    if kind is not None:
        assert body["error"]["type"] == kind, body
    return body["error"]


def _workspace(app: SimulatorApp, episode_id: str) -> Path:
    return Path(app._episodes[episode_id].workspace)


# -- databases and episodes ------------------------------------------------------------------------


def test_put_database_then_open_episode(client: httpx.Client, app: SimulatorApp) -> None:
    r = client.put(f"/v1/databases/{FP}", json={"tables": TABLES})
    assert r.status_code == 204
    assert FP in app.templates
    r = client.post("/v1/episodes", json={"episode_id": "e1", "database": FP, "sender": "bot@agentrl.example"})
    assert r.status_code == 201
    result = r.json()["result"]
    assert result["episode_id"] == "e1" and isinstance(result["episode_token"], str) and len(result["episode_token"]) >= 24
    r = client.post("/v1/episodes/e1/sql", json={"query": "SELECT count(*) AS n FROM sales"})
    assert r.status_code == 200
    result = r.json()["result"]
    assert result["columns"] == ["n"]
    assert result["rows"] == [[4]]
    assert result["truncated"] is False
    health = client.get("/health").json()
    assert health["ok"] is True and health["result"]["episodes"] == 1
    assert health["result"]["sandbox_tier"] in ("FULL", "REDUCED", "UNSAFE", "BASIC")


def test_unknown_database_is_409(client: httpx.Client, ws_root: Path) -> None:
    _error(client.post("/v1/episodes", json={"episode_id": "e1", "database": "never-put"}), 409, "unknown_database")
    assert os.listdir(ws_root) == []


def test_episode_without_database(client: httpx.Client) -> None:
    assert client.post("/v1/episodes", json={"episode_id": "e1"}).status_code == 201
    _error(client.post("/v1/episodes/e1/sql", json={"query": "SELECT 1"}), 404, "no_database")
    r = client.post("/v1/episodes/e1/python", json={"code": "print('hi')"})
    assert r.status_code == 200 and r.json()["result"]["stdout"] == "hi\n"


@pytest.mark.parametrize(
    "tables",
    [None, [], "x", {"1bad": {"columns": [["a", "TEXT"]], "rows": []}}, {"t": {"columns": [["a", "BLOB"]], "rows": []}}],
)
def test_bad_database_is_400(client: httpx.Client, tables: Any) -> None:
    fingerprint = template_fingerprint("bad", tables) if isinstance(tables, dict) else "bad-0123456789abcdef"
    r = client.put(f"/v1/databases/{fingerprint}", json={"tables": tables})
    assert r.status_code == 400, r.text
    assert r.json()["ok"] is False


@pytest.mark.parametrize(
    "tables",
    [{"t": {"columns": [["a", "TEXT"]], "rows": [["x", "y"]]}}, {}],
    ids=["row-arity", "no-tables"],
)
def test_unbuildable_database_is_400(client: httpx.Client, tables: Any) -> None:
    _error(client.put(f"/v1/databases/{template_fingerprint('bad', tables)}", json={"tables": tables}), 400, "bad_database")


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({"columns": [["a"]], "rows": []}, "columns[0]"),
        ({"columns": ["a"], "rows": []}, "columns[0]"),
        ({"columns": [["a", "TEXT", "x"]], "rows": []}, "columns[0]"),
        ({"columns": [["a", "TEXT"], 5], "rows": []}, "columns[1]"),
        ({"columns": "ab", "rows": []}, "columns must be a list"),
        ({"columns": {"a": "TEXT"}, "rows": []}, "columns must be a list"),
        ({"columns": [["a", ["TEXT"]]], "rows": []}, "unsupported type"),
        ({"columns": [["a", "INTEGER"]], "rows": "abc"}, "rows must be a list"),
        ({"columns": [["a", "INTEGER"]], "rows": {"a": 1}}, "rows must be a list"),
        ({"columns": [["a", "INTEGER"]], "rows": [5]}, "rows[0] must be a list of 1 values"),
        ({"columns": [["a", "INTEGER"]], "rows": [[1], [1, 2]]}, "rows[1] must be a list of 1 values"),
        ({"columns": [["a", "INTEGER"]], "rows": [[{"x": 1}]]}, "rows[0] column 'a': a dict"),
        ({"columns": [["a", "INTEGER"]], "rows": [[[1]]]}, "rows[0] column 'a': a list"),
        ({"columns": [["a", "INTEGER"]], "rows": [], "primary_key": [["a"]]}, "primary_key names"),
        ({"columns": [["a", "INTEGER"]], "rows": [], "indexes": [[{"a": 1}]]}, "index 0 names"),
    ],
)
def test_a_table_that_cannot_be_laid_out_is_400_naming_the_field(client: httpx.Client, table: Any, names: str) -> None:
    tables = {"t": table}
    error = _error(
        client.put(f"/v1/databases/{template_fingerprint('bad', tables)}", json={"tables": tables}), 400, "bad_database"
    )
    assert names in error["message"] and "unpack" not in error["message"] and "unhashable" not in error["message"]


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64, 10**400], ids=["2**63", "-2**63-1", "2**64", "10**400"])
def test_an_integer_past_64_bits_is_400_bad_database(client: httpx.Client, value: int) -> None:
    tables = {"t": {"columns": [["id", "INTEGER"], ["n", "INTEGER"]], "rows": [[1, 0], [2, value]]}}
    body = json.dumps({"tables": tables})  # a raw body: httpx's json= may refuse 400 digits
    r = client.put(
        f"/v1/databases/{template_fingerprint('big', tables)}", content=body, headers={"content-type": "application/json"}
    )
    error = _error(r, 400, "bad_database")
    assert "rows[1] column 'n'" in error["message"] and "64-bit" in error["message"]


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63)])
def test_the_64_bit_extremes_are_kept(client: httpx.Client, value: int) -> None:
    tables = {"t": {"columns": [["n", "INTEGER"]], "rows": [[value]]}}
    fp = template_fingerprint("edge", tables)
    assert client.put(f"/v1/databases/{fp}", json={"tables": tables}).status_code == 204
    assert client.post("/v1/episodes", json={"episode_id": "e1", "database": fp}).status_code == 201
    assert client.post("/v1/episodes/e1/sql", json={"query": "SELECT n FROM t"}).json()["result"]["rows"] == [[value]]


def test_files_are_written_into_the_workspace(client: httpx.Client, app: SimulatorApp) -> None:
    files = {"data/notes.txt": "héllo\r\nworld", "top.csv": "a,b\n1,2\n"}
    assert client.post("/v1/episodes", json={"episode_id": "e1", "files": files}).status_code == 201
    ws = _workspace(app, "e1")
    assert (ws / "data" / "notes.txt").read_bytes() == "héllo\r\nworld".encode()
    assert (ws / "top.csv").read_text() == "a,b\n1,2\n"
    assert (ws / "results").is_dir()


@pytest.mark.parametrize("rel", ["../escape.txt", "data/../../escape.txt", "/tmp/agentrl-abs.txt", ""])
def test_files_outside_the_workspace_are_refused(client: httpx.Client, ws_root: Path, rel: str) -> None:
    r = client.post("/v1/episodes", json={"episode_id": "e1", "files": {rel: "x"}})
    _error(r, 400, "bad_request")
    assert os.listdir(ws_root) == []
    assert not (ws_root.parent / "escape.txt").exists()
    assert not os.path.exists("/tmp/agentrl-abs.txt")


@pytest.mark.parametrize(
    ("files", "names"),
    [
        ({"a": "x", "a/b": "y"}, "'a' is also the folder of file 'a/b'"),
        ({"d/e/f.txt": "y", "d/e": "x"}, "'d/e' is also the folder of file 'd/e/f.txt'"),
        ({"results": "x"}, "in results/"),
        ({"d/": "x"}, "names a folder"),
        ({".": "x"}, "names a folder"),
        ({"a.txt": "x", "./a.txt": "y"}, "are the same file"),
        ({"x" * 300: "x"}, "the limit is 255"),
        ({"a\x00b": "x"}, "outside the workspace"),
    ],
)
def test_setup_files_that_cannot_be_laid_out_are_400_naming_them(
    client: httpx.Client, ws_root: Path, files: dict[str, str], names: str
) -> None:
    error = _error(client.post("/v1/episodes", json={"episode_id": "e1", "files": files}), 400, "bad_request")
    assert "files:" in error["message"] and names in error["message"], error
    assert os.listdir(ws_root) == []
    _error(client.post("/v1/episodes/e1/python", json={"code": "print(1)"}), 404, "unknown_episode")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sender", ["a@b.example"]),
        ("sender", {"a": 1}),
        ("sender", 5),
        ("sender", "a" * 321),
        ("database", ["x"]),
        ("database", 5),
    ],
)
def test_setup_fields_of_the_wrong_type_are_400_naming_the_field(
    client: httpx.Client, ws_root: Path, field: str, value: Any
) -> None:
    error = _error(client.post("/v1/episodes", json={"episode_id": "e1", field: value}), 400, "bad_request")
    assert error["message"].startswith(field), error


@pytest.mark.parametrize("files", [["a.txt"], {"a.txt": 5}, {"a.txt": None}], ids=["list", "int", "null"])
def test_malformed_files_are_400_and_leave_nothing_behind(client: httpx.Client, ws_root: Path, files: Any) -> None:
    r = client.post("/v1/episodes", json={"episode_id": "e1", "files": files})
    assert r.status_code == 400, r.text
    assert os.listdir(ws_root) == []


def test_reopening_an_episode_replaces_it(client: httpx.Client, app: SimulatorApp, episode: str) -> None:
    old = _workspace(app, episode)
    assert client.post("/v1/episodes", json={"episode_id": episode}).status_code == 201
    assert not old.exists()
    assert _workspace(app, episode) != old


# -- 404s ------------------------------------------------------------------------------------------


def test_unknown_episode_is_404(client: httpx.Client, episode: str) -> None:
    for tool, body in (("sql", {"query": "SELECT 1"}), ("python", {"code": "print(1)"}), ("smtp", {})):
        _error(client.post(f"/v1/episodes/nope/{tool}", json=body), 404, "unknown_episode")


def test_unknown_tool_is_404(client: httpx.Client, episode: str) -> None:
    err = _error(client.post(f"/v1/episodes/{episode}/ftp", json={}), 404, "unknown_tool")
    assert "ftp" in err["message"]


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/"),
        ("GET", "/v2/episodes"),
        ("GET", "/v1/episodes"),
        ("PUT", "/v1/episodes"),
        ("GET", "/v1/databases/fp"),
        ("POST", "/v1/databases/fp"),
        ("POST", "/v1/episodes/ep-1/sql/extra"),
        ("GET", "/v1/episodes/ep-1/sql"),
    ],
)
def test_unknown_route_is_404(client: httpx.Client, episode: str, method: str, path: str) -> None:
    _error(client.request(method, path, json={}), 404, "not_found")


def test_delete_is_idempotent(client: httpx.Client) -> None:
    assert client.delete("/v1/episodes/never-opened").status_code == 204


# -- malformed bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"query": ', b"\xff\xfe\x00", b"{'single': 'quotes'}", b'{"a": 1} {"b": 2}', b"\x00"],
)
def test_malformed_json_is_400(client: httpx.Client, episode: str, content: bytes) -> None:
    r = client.post(f"/v1/episodes/{episode}/sql", content=content, headers={"content-type": "application/json"})
    _error(r, 400, "bad_request")


@pytest.mark.parametrize("content", [b"[1, 2]", b'"SELECT 1"', b"5", b"null", b"true", b"[]"])
def test_non_object_body_is_400(client: httpx.Client, episode: str, content: bytes) -> None:
    err = _error(client.post(f"/v1/episodes/{episode}/sql", content=content), 400, "bad_request")
    assert "object" in err["message"]


@pytest.mark.parametrize("opener, closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_deeply_nested_json_is_400(client: httpx.Client, episode: str, opener: bytes, closer: bytes) -> None:
    depth = 100_000
    content = opener * depth + b"1" * (opener == b'{"a":') + closer * depth
    _error(client.post(f"/v1/episodes/{episode}/sql", content=content), 400, "bad_request")
    # The server is still healthy afterwards.
    assert client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT 1"}).status_code == 200


def test_empty_body_is_an_empty_object(client: httpx.Client, episode: str) -> None:
    _error(client.post(f"/v1/episodes/{episode}/sql", content=b""), 422, "bad_arguments")
    _error(client.post("/v1/episodes", content=b""), 400, "bad_request")


@pytest.mark.parametrize("query", [None, 5, ["SELECT 1"], {"q": 1}])
def test_sql_query_must_be_a_string(client: httpx.Client, episode: str, query: Any) -> None:
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": query}), 422, "bad_arguments")


# -- tools -----------------------------------------------------------------------------------------


def test_sql_saves_results_csv_like_format_rows(client: httpx.Client, app: SimulatorApp, episode: str) -> None:
    ws = _workspace(app, episode)
    queries = [
        "SELECT id, region, amount, note FROM sales ORDER BY id",
        "SELECT region, round(sum(amount), 2) AS total FROM sales GROUP BY region ORDER BY total DESC",
        "SELECT * FROM sales WHERE 0",
    ]
    for n, query in enumerate(queries, start=1):
        r = client.post(f"/v1/episodes/{episode}/sql", json={"query": query})
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        assert result["csv_path"] == f"results/q{n}.csv"
        assert result["row_count"] == len(result["rows"])
        # Results reach the disk before anything can look at the workspace (here: the files API).
        assert client.get(f"/v1/episodes/{episode}/files/results/q{n}.csv").status_code == 200
        text = (ws / "results" / f"q{n}.csv").read_text(encoding="utf-8")
        assert text == format_rows(result["columns"], result["rows"])
    # The saved CSV parses back to the rows (NULL as an empty field).
    first = list(csv.reader(io.StringIO((ws / "results" / "q1.csv").read_text(encoding="utf-8"))))
    assert first[0] == ["id", "region", "amount", "note"]
    assert first[2] == ["2", "south", "99.99", 'has "quotes", commas']
    assert first[3][3] == ""
    assert first[4][3] == "multi\nline"
    assert (ws / "results" / "q3.csv").read_text() == "id,region,amount,note\n"


def test_failed_sql_does_not_save_or_count(client: httpx.Client, app: SimulatorApp, episode: str) -> None:
    ws = _workspace(app, episode)
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": "DELETE FROM sales"}), 403, "denied")
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELEC 1"}), 400, "syntax")
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT * FROM nope"}), 400, "unknown_name")
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": "x" * 20_001}), 413, "too_large")
    assert os.listdir(ws / "results") == []
    r = client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT 1"})
    assert r.json()["result"]["csv_path"] == "results/q1.csv"


def test_sql_timeout_is_408(client: httpx.Client, episode: str) -> None:
    query = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": query}), 408, "timeout")


def test_python_reads_the_sql_csv(client: httpx.Client, app: SimulatorApp, episode: str) -> None:
    client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT amount FROM sales"})
    code = (
        "import csv\nrows = list(csv.DictReader(open('results/q1.csv')))\nprint(round(sum(float(r['amount']) for r in rows), 2))"
    )
    r = client.post(f"/v1/episodes/{episode}/python", json={"code": code})
    assert r.status_code == 200
    assert r.json()["result"] == {
        "exit_code": 0,
        "stdout": "1227.74\n",
        "stderr": "",
        "timed_out": False,
        "output_truncated": False,
        "sandbox_tier": app.sandbox_tier,
    }


@pytest.mark.parametrize(
    "body, status, kind",
    [
        ({"code": 5}, 422, "bad_arguments"),
        ({"code": "x" * 100_001}, 413, "too_large"),
        ({"code": "print(1)\x00"}, 400, "bad_request"),
    ],
)
def test_python_argument_errors(client: httpx.Client, episode: str, body: dict[str, Any], status: int, kind: str) -> None:
    _error(client.post(f"/v1/episodes/{episode}/python", json=body), status, kind)


def test_smtp_delivery_and_errors(client: httpx.Client, app: SimulatorApp, episode: str) -> None:
    client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT region FROM sales"})
    r = client.post(
        f"/v1/episodes/{episode}/smtp",
        json={"to": ["bob@example.com"], "subject": "Totals", "body": "See attached.", "attachments": ["results/q1.csv"]},
    )
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["to"] == ["bob@example.com"]
    assert result["attachments"][0]["path"] == "results/q1.csv"
    assert len(app._episodes[episode].mailbox.deliveries) == 1
    err = _error(
        client.post(f"/v1/episodes/{episode}/smtp", json={"to": "a@b.com\r\nBcc: e@v.com", "subject": "s", "body": "b"}),
        422,
        "header_injection",
    )
    assert err["smtp_code"] == 501
    err = _error(client.post(f"/v1/episodes/{episode}/smtp", json={"to": "a@b.com", "subject": "s", "body": "b", "bcc": []}), 422)
    assert err["type"] == "bad_arguments"


# -- closing ---------------------------------------------------------------------------------------


def test_closing_an_episode_removes_its_workspace(client: httpx.Client, app: SimulatorApp, ws_root: Path, episode: str) -> None:
    ws = _workspace(app, episode)
    client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT 1"})
    client.post(f"/v1/episodes/{episode}/python", json={"code": "open('mine.txt', 'w').write('x')"})
    assert (ws / "results" / "q1.csv").exists() and (ws / "mine.txt").exists()
    assert client.delete(f"/v1/episodes/{episode}").status_code == 204
    assert not ws.exists()
    assert os.listdir(ws_root) == []
    _error(client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT 1"}), 404, "unknown_episode")
    assert client.get("/health").json()["result"]["episodes"] == 0


def test_app_close_removes_every_workspace(ws_root: Path) -> None:
    app = SimulatorApp(workspace_root=str(ws_root))
    client = httpx.Client(transport=httpx.MockTransport(app.handle), base_url="http://agentrl.sim")
    for i in range(3):
        assert client.post("/v1/episodes", json={"episode_id": f"e{i}"}).status_code == 201
    assert os.listdir(ws_root) == []  # workspaces are created on first use
    for i in range(3):
        app.workspace_of(f"e{i}")
    assert len(os.listdir(ws_root)) == 3
    app.close()
    client.close()
    assert os.listdir(ws_root) == []


def test_episode_databases_are_isolated(client: httpx.Client, app: SimulatorApp) -> None:
    client.put(f"/v1/databases/{FP}", json={"tables": TABLES})
    for eid in ("a", "b"):
        assert client.post("/v1/episodes", json={"episode_id": eid, "database": FP}).status_code == 201
    db_a, db_b = app._episodes["a"].database, app._episodes["b"].database
    assert db_a is not None and db_b is not None and db_a is not db_b
    assert _workspace(app, "a") != _workspace(app, "b")
    client.delete("/v1/episodes/a")
    r = client.post("/v1/episodes/b/sql", json={"query": "SELECT count(*) FROM sales"})
    assert r.json()["result"]["rows"] == [[4]]


# -- episode ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("episode_id", ["a", "Ep-1_2.x", "x" * 64, "..."])
def test_valid_episode_ids(client: httpx.Client, episode_id: str) -> None:
    assert client.post("/v1/episodes", json={"episode_id": episode_id}).status_code == 201


@pytest.mark.parametrize(
    "episode_id",
    ["", "x" * 65, "../etc", "a/b", "a b", "é", "a\x00", "a;b", 5, None, ["a"], {"id": "a"}],
)
def test_invalid_episode_ids_are_400(client: httpx.Client, ws_root: Path, episode_id: Any) -> None:
    _error(client.post("/v1/episodes", json={"episode_id": episode_id}), 400, "bad_request")
    assert os.listdir(ws_root) == []


def test_episode_id_with_trailing_newline_is_400(client: httpx.Client) -> None:
    _error(client.post("/v1/episodes", json={"episode_id": "ep\n"}), 400, "bad_request")


def test_build_database_image_matches_put(app: SimulatorApp, client: httpx.Client) -> None:
    client.put(f"/v1/databases/{FP}", json={"tables": TABLES})
    assert app.templates.get(FP) == build_database(TABLES)


def test_openapi_document_describes_every_route() -> None:
    from simulators import SimulatorApp

    app = SimulatorApp()
    try:
        client = httpx.Client(transport=httpx.MockTransport(app.handle), base_url="http://sim")
        doc = client.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.1")
        paths = doc["paths"]
        for path in (
            "/v1/episodes",
            "/v1/episodes/{episode_id}/sql",
            "/v1/episodes/{episode_id}/python",
            "/v1/episodes/{episode_id}/smtp",
            "/v1/episodes/{episode_id}/files/{path}",
            "/v1/databases/{fingerprint}",
        ):
            assert path in paths, path
        refs = {v for p in paths.values() for op in p.values() for v in _refs(op)}
        assert refs <= {f"#/components/schemas/{name}" for name in doc["components"]["schemas"]}
    finally:
        app.close()


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if "$ref" in node else []
        return out + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


# -- content-addressed templates (template poisoning) ----------------------------------------------

POISON: dict[str, Any] = {"sales": {"columns": [["id", "INTEGER"], ["region", "TEXT"]], "rows": [[1, "poisoned"]]}}


def _digest(tables: dict[str, Any]) -> str:
    return template_fingerprint("x", tables).split("-")[-1]


@pytest.mark.parametrize(
    "forged",
    [
        FP,  # the victim's fingerprint, computed offline
        "fp-sales",  # no digest at all
        FP.upper(),  # the digest in another case
        FP[:-1],  # a digest shortened below 16 hex digits
        FP + "0",  # a digest longer than the real one
        "fp-sales-" + _digest(TABLES)[:15] + "g",  # not hex
        "../" + FP,
    ],
)
def test_a_forged_fingerprint_cannot_poison_a_template(
    client: httpx.Client, stranger: httpx.Client, app: SimulatorApp, episode: str, forged: str
) -> None:
    r = stranger.put(f"/v1/databases/{forged}", json={"tables": POISON})
    assert 400 <= r.status_code < 500, r.text
    assert app.templates.get(FP) == build_database(TABLES)
    # An episode opened after the attempt still runs on the victim's data.
    assert client.post("/v1/episodes", json={"episode_id": "victim-2", "database": FP}).status_code == 201
    rows = client.post("/v1/episodes/victim-2/sql", json={"query": "SELECT count(*) FROM sales"}).json()["result"]["rows"]
    assert rows == [[4]]


def test_a_mismatch_names_the_fingerprint_that_would_be_accepted(stranger: httpx.Client) -> None:
    err = _error(stranger.put(f"/v1/databases/{FP}", json={"tables": POISON}), 422, "fingerprint_mismatch")
    assert _digest(POISON) in err["message"]


def test_templates_are_content_addressed_and_uploads_idempotent(client: httpx.Client, app: SimulatorApp) -> None:
    full = "fp-sales-" + hashlib.sha256(json.dumps(TABLES, sort_keys=True).encode()).hexdigest()
    for fingerprint in (FP, full, _digest(TABLES)):  # 16 hex digits, the full digest, no label
        assert client.put(f"/v1/databases/{fingerprint}", json={"tables": TABLES}).status_code == 204
        assert app.templates.get(fingerprint) == build_database(TABLES)
    # Key order does not change the content, so the same fingerprint is accepted.
    reordered = {"sales": {"rows": TABLES["sales"]["rows"], "columns": TABLES["sales"]["columns"]}}
    assert client.put(f"/v1/databases/{FP}", json={"tables": reordered}).status_code == 204
    # Anyone may store other tables, but only under their own fingerprint.
    assert client.put(f"/v1/databases/{template_fingerprint('fp-sales', POISON)}", json={"tables": POISON}).status_code == 204
    assert app.templates.get(FP) == build_database(TABLES)


# -- episode ownership (hijack by id) --------------------------------------------------------------


def _hijacks(episode: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("POST", f"/v1/episodes/{episode}/sql", {"query": "SELECT 1"}),
        ("POST", f"/v1/episodes/{episode}/python", {"code": "print(1)"}),
        ("POST", f"/v1/episodes/{episode}/smtp", {"to": "a@example.com", "subject": "s", "body": "b"}),
        ("PUT", f"/v1/episodes/{episode}/files/notes.txt", {"text": "planted"}),
        ("GET", f"/v1/episodes/{episode}/files/results/q1.csv", None),
        ("DELETE", f"/v1/episodes/{episode}", None),
        ("POST", "/v1/episodes", {"episode_id": episode}),  # replace it with an episode of our own
    ]


@pytest.mark.parametrize(
    "token", [None, "", "wrong-token-0123456789abcdef", "other-episode"], ids=["none", "empty", "wrong", "other"]
)
@pytest.mark.parametrize("call", range(7), ids=["sql", "python", "smtp", "put-file", "get-file", "delete", "replace"])
def test_another_client_cannot_touch_an_episode(
    client: OwnerClient, stranger: httpx.Client, app: SimulatorApp, episode: str, token: str | None, call: int
) -> None:
    client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT 1"})
    ws = _workspace(app, episode)
    if token == "other-episode":  # the stranger's own, valid token, for another episode
        r = stranger.post("/v1/episodes", json={"episode_id": "mine"})
        token = r.json()["result"]["episode_token"]
    method, path, body = _hijacks(episode)[call]
    headers = {EPISODE_TOKEN_HEADER: token} if token is not None else {}
    err = _error(stranger.request(method, path, json=body, headers=headers), 403, "forbidden")
    assert EPISODE_TOKEN_HEADER in err["message"]
    # Nothing changed: the episode, its workspace and its mailbox are the owner's.
    assert ws.exists() and not (ws / "notes.txt").exists()
    assert app._episodes[episode].token == client.tokens[episode]
    assert app._episodes[episode].mailbox.deliveries == []
    r = client.post(f"/v1/episodes/{episode}/sql", json={"query": "SELECT count(*) FROM sales"})
    assert r.status_code == 200 and r.json()["result"]["csv_path"] == "results/q2.csv"


def test_the_owner_can_replace_and_close_and_then_the_id_is_free(
    client: OwnerClient, stranger: httpx.Client, app: SimulatorApp, episode: str
) -> None:
    old_token = client.tokens[episode]
    assert client.post("/v1/episodes", json={"episode_id": episode}).status_code == 201
    assert client.tokens[episode] != old_token  # a new episode, a new token
    _error(stranger.post(f"/v1/episodes/{episode}/python", json={"code": "1"}, headers={EPISODE_TOKEN_HEADER: old_token}), 403)
    assert client.delete(f"/v1/episodes/{episode}").status_code == 204
    r = stranger.post("/v1/episodes", json={"episode_id": episode})
    assert r.status_code == 201
    # The first owner's token does not open the stranger's new episode.
    _error(client.post(f"/v1/episodes/{episode}/python", json={"code": "print(1)"}), 403, "forbidden")


def test_the_python_surface_is_trusted_and_needs_no_token(app: SimulatorApp, client: OwnerClient, episode: str) -> None:
    status, reply = app.tool(episode, "sql", {"query": "SELECT 1"})
    assert status == 200, reply


# -- lazy_python: the runner starts at the first Python run, not with the app ----------------------


def test_a_lazy_app_starts_no_runner_until_python_runs(ws_root: Path) -> None:
    app = SimulatorApp(python_limits=RunLimits(wall_s=3.0, cpu_s=3), workspace_root=str(ws_root), lazy_python=True)
    try:
        assert not app.python_started
        with OwnerClient(transport=httpx.MockTransport(app.handle), base_url="http://agentrl.sim") as c:
            assert c.put(f"/v1/databases/{FP}", json={"tables": TABLES}).status_code == 204
            assert c.post("/v1/episodes", json={"episode_id": "e1", "database": FP}).status_code == 201
            assert c.post("/v1/episodes/e1/sql", json={"query": "SELECT COUNT(*) FROM sales"}).status_code == 200
            assert c.delete("/v1/episodes/e1").status_code == 204
            assert not app.python_started  # SQL, workspaces and episodes never need it
            assert c.post("/v1/episodes", json={"episode_id": "e2"}).status_code == 201
            r = c.post("/v1/episodes/e2/python", json={"code": "print(6 * 7)"})
            assert r.status_code == 200, r.text
            assert r.json()["result"]["stdout"] == "42\n"
            assert app.python_started
            assert r.json()["result"]["sandbox_tier"] == app.sandbox_tier
    finally:
        app.close()


def test_a_lazy_app_reports_its_tier_by_starting_the_runner(ws_root: Path) -> None:
    app = SimulatorApp(python_sandbox=False, workspace_root=str(ws_root), lazy_python=True)
    try:
        assert not app.python_started
        health = httpx.Client(transport=httpx.MockTransport(app.handle), base_url="http://agentrl.sim").get("/health")
        assert health.json()["result"]["sandbox_tier"] == "BASIC"  # a health check answers with the real tier
        assert app.python_started
    finally:
        app.close()


def test_a_closed_lazy_app_starts_nothing_and_answers_python_with_an_error(ws_root: Path) -> None:
    app = SimulatorApp(workspace_root=str(ws_root), lazy_python=True)
    with OwnerClient(transport=httpx.MockTransport(app.handle), base_url="http://agentrl.sim") as c:
        assert c.post("/v1/episodes", json={"episode_id": "e1"}).status_code == 201
        app.close()
        assert not app.python_started
        with pytest.raises(RuntimeError, match="closed"):
            app.runner  # noqa: B018
        r = c.post("/v1/episodes/e1/python", json={"code": "print(1)"})
        assert r.status_code >= 400  # the episode is gone with the app: a JSON error, not a crash
        assert not app.python_started
