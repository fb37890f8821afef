"""The company REST service over real HTTP (standard library server), as a stand-in for a real upstream.

``CompanyServer(CompanyAPI.from_tables(tables))`` serves one service on ``127.0.0.1`` and a free
port until :meth:`CompanyServer.close`; it records every request line it receives (``requests``),
so a test can show what reached it. It answers exactly what the in-process simulator answers for
the same data, which is what the parity tests of ``backend={"http": url}`` rely on.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from simulators.http.request import MAX_BODY_BYTES, RequestError, check_call
from simulators.http.service import CompanyAPI

__all__ = ["CompanyServer"]


class CompanyServer:
    """Serves ``api`` over HTTP on ``host`` (a free port unless ``port`` is given) in a thread.

    Args:
        api: the service to serve (its state changes with the writes it receives).
        host, port: where to listen.
        redirect_to: answer every request with a 302 to this URL instead (for tests of redirects).
    """

    def __init__(self, api: CompanyAPI, host: str = "127.0.0.1", port: int = 0, redirect_to: str | None = None) -> None:
        self.api = api
        self.redirect_to = redirect_to
        #: (method, raw path) of every request received, in order
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="company-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(self, method: str, raw_path: str, body: bytes) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON body or None, extra headers) of one request as it arrived."""
        with self._lock:
            self.requests.append((method, raw_path))
            if self.redirect_to is not None:
                return 302, None, {"Location": self.redirect_to}
            parts = urlsplit(raw_path)
            try:
                payload: dict[str, Any] = {"method": method, "path": parts.path}
                if parts.query:
                    payload["query"] = dict(parse_qsl(parts.query, keep_blank_values=True))
                if body:
                    payload["body"] = json.loads(body)
                call = check_call(payload)
            except RequestError as exc:
                return exc.status, {"error": {"type": exc.kind, "message": exc.message}}, {}
            except (ValueError, RecursionError):
                return 400, {"error": {"type": "bad_request", "message": "the body is not JSON"}}, {}
            status, answer = self.api.handle(call)
            return status, answer, {}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _handler(owner: CompanyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            extra: dict[str, str]
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES * 2:
                status, answer, extra = 413, {"error": {"type": "too_large", "message": "body too large"}}, {}
                self.close_connection = True  # the body is left unread
            else:
                status, answer, extra = owner.answer(self.command, self.path, self.rfile.read(length) if length else b"")
            data = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            for key, value in extra.items():
                self.send_header(key, value)
            if data:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = do_TRACE = do_OPTIONS = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
