"""The simulated company's internal REST service (CRM and ticketing), built from an episode's tables.

Every table of the episode's database is a collection: ``GET /v1/<table>`` lists its records (filters
by column, ``limit``/``offset`` pagination, ``total`` and ``next_offset`` in the answer) and ``GET
/v1/<table>/<id>`` reads one by its key (the first column). ``tickets`` is writable: ``POST
/v1/tickets`` opens one, ``PATCH /v1/tickets/<id>`` changes fields, ``DELETE /v1/tickets/<id>``
removes it. Writes are validated (types, enums, a known ``assignee`` of the staff table, a key of
another collection that exists) and answered 4xx with ``{"error": {"type", "message"}}`` when
wrong. ``GET /openapi.json`` is the service's own OpenAPI document, written from the tables.

The same class serves the in-process simulator (one per episode) and a real HTTP upstream
(:mod:`simulators.http.upstream`), so both answer the same bytes.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from simulators.http.request import HTTPCall
from simulators.sql import ReadOnlyDatabase, build_database
from simulators.sql.engine import SQLError

__all__ = ["MAX_LIMIT", "PRIORITIES", "STATUSES", "WRITABLE", "Answer", "CompanyAPI"]

#: (HTTP status, JSON body or None for an empty one)
Answer = tuple[int, Any]

WRITABLE = "tickets"
PRIORITIES = ("low", "normal", "high", "urgent")
STATUSES = ("open", "pending", "closed")
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_TEXT_CHARS = 200
_ENUMS = {"priority": PRIORITIES, "status": STATUSES}
_JSON_TYPE = {"integer": "integer", "number": "number", "string": "string"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _error(status: int, kind: str, message: str) -> Answer:
    return status, {"error": {"type": kind, "message": message}}


@dataclass(frozen=True)
class Collection:
    """One table as a REST collection: its columns (the first is the key) and their kinds."""

    name: str
    columns: tuple[str, ...]
    kinds: dict[str, str]

    @property
    def key(self) -> str:
        return self.columns[0]


class CompanyAPI:
    """The company REST service over one database copy (see :meth:`from_database`, :meth:`from_tables`).

    Read-only collections are answered by SQL on the database itself (filters as ``WHERE``,
    pages as ``LIMIT``/``OFFSET``), so an episode's service holds no copy of its tables; only the
    writable ``tickets`` are copied out, on first use, because writes change them. An earlier
    version copied every table into Python per episode: ~55 ms and ~350 KiB at an episode's first
    call (600-row fact table; a 2-core machine at load 9). Now a first write costs ~2 ms and ~23 KiB
    (the tickets), a read of one record ~0.45 ms, a page of 100 rows ~6 ms, on the same machine.
    """

    def __init__(self, database: ReadOnlyDatabase, owns_database: bool = False) -> None:
        self.database = database
        self.collections: dict[str, Collection] = _schema(database)
        self._tickets: dict[Any, dict[str, Any]] | None = None
        self._owns = owns_database

    @classmethod
    def from_database(cls, database: ReadOnlyDatabase) -> CompanyAPI:
        """The service over an episode's database copy (which the caller keeps and closes)."""
        return cls(database)

    @classmethod
    def from_tables(cls, tables: dict[str, dict[str, Any]]) -> CompanyAPI:
        """The service over template tables (``{name: {"columns", "rows"}}``), in a database of its own."""
        return cls(ReadOnlyDatabase(build_database(tables), deadline_s=10.0), owns_database=True)

    def close(self) -> None:
        """Close the database when the service made it (:meth:`from_tables`)."""
        if self._owns:
            self.database.close()

    # -- requests ---------------------------------------------------------------------------------

    def handle(self, call: HTTPCall) -> Answer:
        """Answer one checked call: (status, JSON body or None). Never raises for any input."""
        try:
            return self._handle(call)
        except SQLError as exc:
            return _error(400, "bad_request", f"the service could not read that: {exc.message[:200]}")

    def _handle(self, call: HTTPCall) -> Answer:
        parts = [unquote(p) for p in call.path.split("/") if p]
        if parts == ["openapi.json"]:
            return (200, self.openapi()) if call.method == "GET" else _error(405, "method_not_allowed", "use GET /openapi.json")
        if not parts or parts[0] != "v1":
            return _error(404, "not_found", f"no resource {call.path[:100]!r}; GET /openapi.json lists them")
        if len(parts) == 1:
            if call.method != "GET":
                return _error(405, "method_not_allowed", "use GET /v1")
            return 200, {"collections": list(self.collections)}
        collection = self.collections.get(parts[1])
        if collection is None or len(parts) > 3:
            return _error(404, "not_found", f"no resource {call.path[:100]!r}; the collections are {', '.join(self.collections)}")
        if len(parts) == 2:
            if call.method == "GET":
                return self._list(collection, call.query)
            if call.method == "POST" and collection.name == WRITABLE:
                return self._create(collection, call.body or {}, call.query)
            return _error(405, "method_not_allowed", f"{call.method} /v1/{collection.name} is not allowed; {self._writes()}")
        key = _parse(parts[2], collection.kinds[collection.key])
        record = self._get(collection, key) if key is not None else None
        if record is None:
            return _error(404, "not_found", f"no {collection.name} record {parts[2][:40]!r}")
        if call.query:
            return _error(400, "unknown_parameter", "a single record takes no query parameters")
        if call.method == "GET":
            return 200, dict(record)
        if collection.name != WRITABLE:
            return _error(405, "method_not_allowed", f"{collection.name} is read-only; {self._writes()}")
        if call.method == "PATCH":
            return self._update(collection, record, call.body or {})
        del self.tickets[key]  # DELETE
        return 204, None

    @property
    def tickets(self) -> dict[Any, dict[str, Any]]:
        """The writable records by key, copied out of the database on first use."""
        if self._tickets is None:
            c = self.collections[WRITABLE]
            rows = self.database.query(f'SELECT * FROM "{c.name}" ORDER BY "{c.key}"').rows
            self._tickets = {r[0]: dict(zip(c.columns, r)) for r in rows}
        return self._tickets

    def _select(self, c: Collection, filters: dict[str, Any], limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        """A page of the records matching ``filters`` (exact), and how many match in all."""
        if c.name == WRITABLE:
            matched = [r for r in self.tickets.values() if all(r[k] == v for k, v in filters.items())]
            return [dict(r) for r in matched[offset : offset + limit]], len(matched)
        where = " AND ".join(f'"{k}" = {_literal(v)}' for k, v in filters.items())
        clause = f" WHERE {where}" if where else ""
        total = int(self.database.query(f'SELECT COUNT(*) FROM "{c.name}"{clause}').rows[0][0])
        page = self.database.query(f'SELECT * FROM "{c.name}"{clause} ORDER BY "{c.key}" LIMIT {limit} OFFSET {offset}')
        return [dict(zip(c.columns, r)) for r in page.rows], total

    def _get(self, c: Collection, key: Any) -> dict[str, Any] | None:
        if c.name == WRITABLE:
            return self.tickets.get(key)
        items, _ = self._select(c, {c.key: key}, 1, 0)
        return items[0] if items else None

    def _exists(self, c: Collection, column: str, value: Any) -> bool:
        return bool(self._select(c, {column: value}, 1, 0)[0])

    def _writes(self) -> str:
        return (
            f"only /v1/{WRITABLE} takes POST, PATCH and DELETE" if WRITABLE in self.collections else "this service is read-only"
        )

    def _list(self, collection: Collection, query: dict[str, Any]) -> Answer:
        limit, offset = query.get("limit", DEFAULT_LIMIT), query.get("offset", 0)
        if not _whole(limit) or not 1 <= int(_parse(limit, "integer")) <= MAX_LIMIT:
            return _error(400, "bad_parameter", f"limit must be a whole number from 1 to {MAX_LIMIT}")
        if not _whole(offset) or int(_parse(offset, "integer")) < 0:
            return _error(400, "bad_parameter", "offset must be a whole number >= 0")
        filters: dict[str, Any] = {}
        for name, raw in query.items():
            if name in ("limit", "offset"):
                continue
            if name not in collection.kinds:
                allowed = ", ".join(["limit", "offset", *collection.columns])
                return _error(
                    400, "unknown_parameter", f"{collection.name} has no field {name[:40]!r}; filter by one of {allowed}"
                )
            value = _parse(raw, collection.kinds[name])
            if value is None:
                return _error(400, "bad_parameter", f"{name} must be {_a(collection.kinds[name])}")
            filters[name] = value
        start, size = int(_parse(offset, "integer")), int(_parse(limit, "integer"))
        page, total = self._select(collection, filters, size, start)
        return 200, {
            "items": page,
            "total": total,
            "limit": size,
            "offset": start,
            "next_offset": start + size if start + size < total else None,
        }

    def _create(self, collection: Collection, body: dict[str, Any], query: dict[str, Any]) -> Answer:
        if query:
            return _error(400, "unknown_parameter", "POST takes its fields in the body, not in query")
        fields = [c for c in collection.columns if c != collection.key]
        missing = [c for c in fields if c not in body and c != "status"]
        if missing:
            return _error(422, "validation", f"missing field(s) {missing}; required: {[c for c in fields if c != 'status']}")
        problem = self._check_fields(collection, body)
        if problem is not None:
            return problem
        record = {collection.key: max(self.tickets, default=0) + 1, **{c: None for c in fields}, "status": "open"}
        record.update(body)
        self.tickets[record[collection.key]] = record
        return 201, dict(record)

    def _update(self, collection: Collection, record: dict[str, Any], body: dict[str, Any]) -> Answer:
        if not body:
            return _error(422, "validation", f"PATCH needs a body with the fields to change: {list(collection.columns[1:])}")
        if collection.key in body:
            return _error(422, "validation", f"{collection.key} cannot be changed")
        problem = self._check_fields(collection, body)
        if problem is not None:
            return problem
        record.update(body)
        return 200, dict(record)

    def _check_fields(self, collection: Collection, body: dict[str, Any]) -> Answer | None:
        for name, value in body.items():
            if name not in collection.kinds or name == collection.key:
                return _error(
                    422, "validation", f"unknown field {str(name)[:40]!r}; the fields are {list(collection.columns[1:])}"
                )
            kind = collection.kinds[name]
            if not _is(value, kind):
                return _error(422, "validation", f"{name} must be {_a(kind)}")
            if kind == "string" and not 0 < len(value) <= MAX_TEXT_CHARS:
                return _error(422, "validation", f"{name} must be 1 to {MAX_TEXT_CHARS} characters")
            if name in _ENUMS and value not in _ENUMS[name]:
                return _error(422, "validation", f"{name} must be one of {', '.join(_ENUMS[name])}")
            staff = self.collections.get("staff")
            if name == "assignee" and staff is not None and "email" in staff.kinds and not self._exists(staff, "email", value):
                return _error(422, "validation", f"assignee {value[:80]!r} is not the email of anyone in /v1/staff")
            owner = next((c for c in self.collections.values() if c is not collection and c.key == name), None)
            if owner is not None and not self._exists(owner, name, value):
                return _error(422, "validation", f"{name} {value!r} is not a record of /v1/{owner.name}")
        return None

    # -- the document -----------------------------------------------------------------------------

    def openapi(self) -> dict[str, Any]:
        """The service's OpenAPI 3.1 document (collections, fields, pagination, writes)."""
        paths: dict[str, Any] = {}
        schemas: dict[str, Any] = {"Error": {"type": "object", "properties": {"error": {"type": "object"}}}}
        for c in self.collections.values():
            props: dict[str, Any] = {}
            for name in c.columns:
                props[name] = {"type": _JSON_TYPE[c.kinds[name]]}
                if name in _ENUMS and c.name == WRITABLE:
                    props[name]["enum"] = list(_ENUMS[name])
            schemas[c.name] = {"type": "object", "properties": props}
            filters = [{"name": n, "in": "query", "schema": {"type": _JSON_TYPE[c.kinds[n]]}} for n in c.columns]
            page = [
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
                {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
            ]
            ref = {"$ref": f"#/components/schemas/{c.name}"}
            listing = {
                "type": "object",
                "properties": {
                    "items": {"type": "array", "items": ref},
                    "total": {"type": "integer"},
                    "limit": {"type": "integer"},
                    "offset": {"type": "integer"},
                    "next_offset": {"type": ["integer", "null"]},
                },
            }
            item = {"name": "id", "in": "path", "required": True, "schema": {"type": _JSON_TYPE[c.kinds[c.key]]}}
            paths[f"/v1/{c.name}"] = {
                "get": {
                    "summary": f"list {c.name} (exact-match filters on any field, paginated)",
                    "parameters": page + filters,
                    "responses": {"200": _body(listing), "400": _body({"$ref": "#/components/schemas/Error"})},
                }
            }
            paths[f"/v1/{c.name}/{{id}}"] = {
                "get": {"summary": f"one {c.name} record by {c.key}", "parameters": [item], "responses": {"200": _body(ref)}}
            }
            if c.name == WRITABLE:
                fields = {k: v for k, v in props.items() if k != c.key}
                required = [k for k in fields if k != "status"]
                paths[f"/v1/{c.name}"]["post"] = {
                    "summary": "open a ticket (status defaults to open)",
                    "requestBody": _body({"type": "object", "properties": fields, "required": required}),
                    "responses": {"201": _body(ref), "422": _body({"$ref": "#/components/schemas/Error"})},
                }
                paths[f"/v1/{c.name}/{{id}}"]["patch"] = {
                    "summary": "change fields of a ticket",
                    "parameters": [item],
                    "requestBody": _body({"type": "object", "properties": fields}),
                    "responses": {"200": _body(ref), "422": _body({"$ref": "#/components/schemas/Error"})},
                }
                paths[f"/v1/{c.name}/{{id}}"]["delete"] = {
                    "summary": "delete a ticket",
                    "parameters": [item],
                    "responses": {"204": {"description": "deleted"}},
                }
        return copy.deepcopy(
            {
                "openapi": "3.1.0",
                "info": {"title": "company internal API (CRM and ticketing)", "version": "1"},
                "paths": paths,
                "components": {"schemas": schemas},
            }
        )


@functools.lru_cache(maxsize=64)
def _schema_of(image: bytes) -> dict[str, Collection]:
    """The collections of a template image: table names, columns and kinds (read once per image)."""
    database = ReadOnlyDatabase(image, deadline_s=10.0)
    try:
        names = [str(r[0]) for r in database.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid").rows]
        out: dict[str, Collection] = {}
        for name in names:
            if not _NAME.fullmatch(name):
                continue
            columns = [c for c in database.query(f'SELECT * FROM "{name}" LIMIT 0').columns if _NAME.fullmatch(c)]
            if not columns:
                continue
            kinds_sql = ", ".join(f'group_concat(DISTINCT typeof("{c}"))' for c in columns)
            found = database.query(f'SELECT {kinds_sql} FROM "{name}"').rows[0]
            kinds = {c: _kind(set(str(k or "").split(",")) - {"null", ""}) for c, k in zip(columns, found)}
            out[name] = Collection(name, tuple(columns), kinds)
        return out
    finally:
        database.close()


def _schema(database: ReadOnlyDatabase) -> dict[str, Collection]:
    return _schema_of(database.image)


def _literal(value: Any) -> str:
    """``value`` (an int, a finite float or a str, as :func:`_parse` gives) as an SQL literal."""
    if isinstance(value, bool):
        raise TypeError("booleans are not field values")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": "JSON", "content": {"application/json": {"schema": schema}}}


def _kind(types: set[str]) -> str:
    """A field's kind from the SQLite types (``typeof``) of its values."""
    if types == {"integer"}:
        return "integer"
    if types and types <= {"integer", "real"}:
        return "number"
    return "string"


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _whole(value: Any) -> bool:
    return _parse(value, "integer") is not None


def _parse(raw: Any, kind: str) -> Any:
    """A query or path value as a field of ``kind`` (None when it is not one)."""
    if isinstance(raw, bool):
        return None
    if kind == "string":
        return raw if isinstance(raw, str) else None
    if isinstance(raw, str):
        text = raw.strip()
        if kind == "integer":
            return int(text) if re.fullmatch(r"-?\d{1,18}", text) else None
        return float(text) if re.fullmatch(r"-?\d{1,18}(\.\d{1,12})?", text) else None
    if kind == "integer":
        return raw if isinstance(raw, int) else int(raw) if isinstance(raw, float) and raw.is_integer() else None
    return raw if isinstance(raw, (int, float)) else None


def _a(kind: str) -> str:
    return {"integer": "a whole number", "number": "a number", "string": "a string"}[kind]
