"""The dashboard's HTTP server: GET-only JSON endpoints and one static page.

Standard library only (``ThreadingHTTPServer``): the controller needs nothing new to run
it. Nothing is writable: every method but GET and HEAD answers 405, and the endpoints only
read. It binds 127.0.0.1 unless told otherwise (``serve`` warns when it is told), because
the page has no login of its own: whoever reaches it reads what the user's credential reads.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

from hypertf.dashboard.source import DataSource

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8470
log = logging.getLogger(__name__)


def page() -> bytes:
    return resources.files("hypertf.dashboard").joinpath("index.html").read_bytes()


def is_loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return bind == "localhost"


class Handler(BaseHTTPRequestHandler):
    """One request; the data source is the server's (``Dashboard.source``)."""

    server: Dashboard
    protocol_version = "HTTP/1.1"

    def routes(self) -> dict[str, Callable[[], Any]]:
        source = self.server.source
        return {"/api/status": source.status, "/api/queue": source.queue,
                "/api/jobs": source.jobs, "/api/sweeps": source.sweeps}

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            self.send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
            return
        read = self.routes().get(path)
        if read is None and path.startswith("/api/logs/"):
            key = unquote(path.removeprefix("/api/logs/"))
            read = lambda: {"task_key": key, "text": self.server.source.logs(key)}  # noqa: E731
        if read is None:
            self.answer(HTTPStatus.NOT_FOUND, {"error": f"no such page {path}"})
            return
        try:
            data = read()
        except Exception as err:  # one failed read must not end the server
            log.warning("dashboard: %s failed: %s", path, err)
            self.answer(HTTPStatus.SERVICE_UNAVAILABLE,
                        {"error": f"{type(err).__name__}: {err}"})
            return
        self.answer(HTTPStatus.OK, data)

    def do_HEAD(self) -> None:
        self.send(HTTPStatus.OK, b"", "text/html; charset=utf-8")

    def refuse(self) -> None:
        """Read-only: no method but GET changes anything, so none is accepted."""
        self.send(HTTPStatus.METHOD_NOT_ALLOWED, b'{"error": "the dashboard is read-only"}\n',
                  "application/json", allow="GET, HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = refuse

    def answer(self, status: HTTPStatus, data: Any) -> None:
        self.send(status, json.dumps(data, default=str).encode(), "application/json")

    def send(self, status: HTTPStatus, body: bytes, kind: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                         "script-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
        for name, value in headers.items():
            self.send_header(name.capitalize(), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard %s: " + format, self.address_string(), *args)


class Dashboard(ThreadingHTTPServer):
    """The server, holding its data source; ``port=0`` picks a free port (tests)."""

    daemon_threads = True

    def __init__(self, source: DataSource, port: int = DEFAULT_PORT,
                 bind: str = LOOPBACK) -> None:
        self.source = source
        self.page = page()
        super().__init__((bind, port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that left mid-answer (reload, closed tab) is no error worth a trace."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}/"

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests); ``shutdown()`` ends it."""
        thread = threading.Thread(target=self.serve_forever, name="dashboard", daemon=True)
        thread.start()
        return thread


def serve(source: DataSource, port: int = DEFAULT_PORT, bind: str | None = None) -> None:
    """Serve until interrupted; a bind beyond loopback is said to be unauthenticated."""
    address = bind or LOOPBACK
    if not is_loopback(address):
        print(f"hypertf: warning: the dashboard on {address} is unauthenticated: anyone who "
              f"reaches port {port} reads the cluster, the queue, jobs and logs with your "
              f"credential (keep it on 127.0.0.1 and use an SSH tunnel instead)",
              file=sys.stderr)
    with Dashboard(source, port, address) as server:
        print(f"hypertf: dashboard on {server.url} (read-only; Ctrl-C ends it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
