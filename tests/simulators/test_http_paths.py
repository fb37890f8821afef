"""``http`` tool paths a normalizing gateway would resolve outside the base path (issue #33, 11).

Gateways in front of a REST service decode more than RFC 3986 says: percent-escapes twice over
(``%252e``), IIS's ``%u002e``, fullwidth characters (NFKC), a backslash as a slash, Tomcat's and
Spring's ``;`` path parameters (``..;x`` is ``..``), trailing dots and spaces (Windows). Every
spelling of a ``.`` or ``..`` segment, built from those pieces, is refused before anything is sent;
ordinary paths (names with dots, escapes of ordinary characters, matrix parameters, a trailing
slash) still pass unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs.backends.base import ToolRequest
from agentrl_envs.backends.rest import RESTBackend
from simulators.http import CompanyAPI
from simulators.http.request import RequestError, check_call
from simulators.http.upstream import CompanyServer

DOTS = [".", "%2e", "%2E", "%252e", "%25252E", "%u002e", "%U002E", "%25u002e", "%ef%bc%8e", "%EF%BC%8E", "%25ef%25bc%258e"]
SEPARATORS = ["/", "%2f", "%2F", "%252f", "%5c", "%5C", "%255c", "%ef%bc%8f", "%ef%bc%bc"]
NAMES = st.text("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789-_~", min_size=1, max_size=8)
# What a gateway drops or ignores after the dots: path parameters, trailing spaces or dots.
TAILS = ["", ";", ";x", ";jsessionid=ABC", "%3b", "%20", "%2520", ".", "%2e;x"]


@st.composite
def dot_segments(draw: st.DrawFn) -> str:
    dots = draw(st.lists(st.sampled_from(DOTS), min_size=1, max_size=3))
    return "".join(dots) + draw(st.sampled_from(TAILS))


@st.composite
def escaping_paths(draw: st.DrawFn) -> str:
    head = draw(st.lists(NAMES, max_size=3))
    tail = draw(st.lists(NAMES, max_size=3))
    path = "/" + "/".join(head)
    for segment in draw(st.lists(dot_segments(), min_size=1, max_size=3)):
        path += ("" if path.endswith("/") else draw(st.sampled_from(SEPARATORS))) + segment
    for name in tail:
        path += draw(st.sampled_from(SEPARATORS)) + name
    return path


@given(escaping_paths())
@settings(max_examples=600, deadline=None)
def test_every_spelling_of_a_dot_segment_is_refused(path: str) -> None:
    with pytest.raises(RequestError) as refused:
        check_call({"method": "GET", "path": path})
    assert refused.value.status == 400 and refused.value.kind == "bad_path", (path, refused.value.message)


# Escapes of ordinary characters, in a name next to ordinary text (never a whole segment of dots or spaces).
ORDINARY_ESCAPES = ["%20", "%2D", "%41", "%C3%A9", "%E2%82%AC", "%25", "%2B", "%40"]


@st.composite
def ordinary_segments(draw: st.DrawFn) -> str:
    name = draw(NAMES)
    if draw(st.booleans()):
        name += draw(st.sampled_from([".json", ".v2", "...x", ".tar.gz"]))
    if draw(st.booleans()):  # after the text: "%25" + "00" would spell an escaped NUL, rightly refused
        name = name + draw(st.sampled_from(ORDINARY_ESCAPES))
    if draw(st.booleans()):
        name += draw(st.sampled_from([";v=1", ";jsessionid=ABC", ";x"]))
    return name


@given(st.lists(ordinary_segments(), min_size=1, max_size=5), st.booleans())
@settings(max_examples=400, deadline=None)
def test_ordinary_paths_still_pass_unchanged(segments: list[str], trailing_slash: bool) -> None:
    path = "/" + "/".join(segments) + ("/" if trailing_slash else "")
    assert check_call({"method": "GET", "path": path}).path == path


@pytest.mark.parametrize(
    "path",
    ["/", "/openapi.json", "/v1/tickets", "/v1/tickets/", "/v1/tickets/12", "/v1/customers;v=2/3", "/v1/search/100%25"],
)
def test_the_services_own_paths_pass(path: str) -> None:
    assert check_call({"method": "GET", "path": path}).path == path


REVIEW_PATHS = [
    "/v1/..;/admin",
    "/v1/tickets/..;/..;/admin",
    "/v1/%252e%252e/%252e%252e/admin",
    "/v1/%2e%2e%2fadmin",
    "/v1/..%2f..%2fadmin",
    "/v1/..%5c..%5cadmin",
    "/v1/%255c..%255cadmin",
    "/v1/%u002e%u002e/admin",
    "/v1/%c0%ae%c0%ae/admin",  # overlong UTF-8 for '.', a dot to some decoders
    "/v1/%ef%bc%8e%ef%bc%8e/admin",
    "/v1/..%20/admin",
    "/v1/.../admin",
    "/v1/;/admin",
    "/v1/%2f%2fevil.example/x",
    "/v1/%25252525252e%25252525252e/admin",  # encoded five times over
    "/v1/a%00.json",
    "/v1/a%c2%85",  # NEL, a C1 control
]


@pytest.fixture
def upstream() -> Iterator[CompanyServer]:
    server = CompanyServer(CompanyAPI.from_tables({"tickets": {"columns": [["ticket_id", "INTEGER"]], "rows": [[1]]}}))
    yield server
    server.close()


def test_the_review_paths_never_reach_the_upstream(upstream: CompanyServer) -> None:
    backend = RESTBackend(upstream.url + "/api")
    try:
        for path in REVIEW_PATHS:
            response = backend.handle(ToolRequest("ep", "http", {"method": "GET", "path": path}))
            assert not response.ok and response.status == 400 and response.error_type == "bad_path", (path, response)
        assert upstream.requests == []
    finally:
        backend.close()
