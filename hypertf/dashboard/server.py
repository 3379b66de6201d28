"""The dashboard's HTTP server: GET-only JSON endpoints, one static page and ``/metrics``.

Standard library only (``ThreadingHTTPServer``): the controller needs nothing new to run
it. Nothing is writable: every method but GET and HEAD answers 405, and the endpoints only
read. It binds 127.0.0.1 unless told otherwise. Whoever reaches it reads what the user's
credential reads, so off loopback it wants a token (``serve`` makes one and prints the URL
that carries it, as Jupyter does): ``?token=`` on any request (the answer then sets a cookie,
so the page's own requests carry it), ``Authorization: token <token>`` (or ``Bearer``), or
that cookie. Without it every request is answered 401.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import secrets
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hypertf.config import environment
from hypertf.dashboard.metrics import CONTENT_TYPE
from hypertf.dashboard.source import DataSource

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8470
TOKEN_ENV = environment.DASHBOARD_TOKEN.name  # a token of the user's choosing (else fresh)
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
    set_cookie = ""  # the token's cookie, for an answer to a request that had it in its URL

    def routes(self) -> dict[str, Callable[[], Any]]:
        source = self.server.source
        return {"/api/status": source.status, "/api/queue": source.queue,
                "/api/jobs": source.jobs, "/api/sweeps": source.sweeps,
                "/api/usage": source.usage}

    def cookie_name(self) -> str:
        """One cookie per port: two dashboards on one host keep their own tokens."""
        return f"hypertf_token_{self.server.server_address[1]}"

    def presented(self) -> tuple[list[str], bool]:
        """Every token the request carries, and whether one came in the URL."""
        query = parse_qs(urlsplit(self.path).query).get("token", [])
        found = list(query)
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            found.append(value.strip())
        with contextlib.suppress(CookieError):
            morsel = SimpleCookie(self.headers.get("Cookie") or "").get(self.cookie_name())
            if morsel is not None:
                found.append(morsel.value)
        return found, bool(query)

    def authorized(self) -> bool:
        """No token wanted, or one of those presented is it (compared in constant time).
        A token that came in the URL is answered with the cookie (``self.set_cookie``)."""
        self.set_cookie = ""
        token = self.server.token
        if token is None:
            return True
        found, in_url = self.presented()
        if not any(hmac.compare_digest(t.encode(), token.encode()) for t in found):
            self.answer(HTTPStatus.UNAUTHORIZED, {
                "error": "this dashboard wants its token: open the URL it printed at its "
                         "start (.../?token=...), or send 'Authorization: token <token>'"},
                www_authenticate='Token realm="hypertf dashboard"')
            return False
        if in_url:
            self.set_cookie = (f"{self.cookie_name()}={token}; Path=/; HttpOnly; "
                               f"SameSite=Strict")
        return True

    def do_GET(self) -> None:
        if not self.authorized():
            return
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            self.send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
            return
        if path == "/metrics":
            self.prometheus()
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

    def prometheus(self) -> None:
        """``/metrics``: usage and the queue in Prometheus' text format (hypertf.dashboard.
        metrics); behind the same token as every page."""
        try:
            body = self.server.source.metrics()
        except Exception as err:  # one failed read must not end the server
            log.warning("dashboard: /metrics failed: %s", err)
            self.answer(HTTPStatus.SERVICE_UNAVAILABLE,
                        {"error": f"{type(err).__name__}: {err}"})
            return
        self.send(HTTPStatus.OK, body, CONTENT_TYPE)

    def do_HEAD(self) -> None:
        if self.authorized():
            self.send(HTTPStatus.OK, b"", "text/html; charset=utf-8")

    def refuse(self) -> None:
        """Read-only: no method but GET changes anything, so none is accepted."""
        self.send(HTTPStatus.METHOD_NOT_ALLOWED, b'{"error": "the dashboard is read-only"}\n',
                  "application/json", allow="GET, HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = refuse

    def answer(self, status: HTTPStatus, data: Any, **headers: str) -> None:
        self.send(status, json.dumps(data, default=str).encode(), "application/json",
                  **headers)

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
            self.send_header(name.replace("_", "-").title(), value)
        if self.set_cookie:
            self.send_header("Set-Cookie", self.set_cookie)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard %s: " + format, self.address_string(), *args)


class Dashboard(ThreadingHTTPServer):
    """The server, holding its data source; ``port=0`` picks a free port (tests).
    ``token``: what every request must carry (None: nothing, for loopback only)."""

    daemon_threads = True

    def __init__(self, source: DataSource, port: int = DEFAULT_PORT,
                 bind: str = LOOPBACK, token: str | None = None) -> None:
        if token is None and not is_loopback(bind):
            raise ValueError(f"a dashboard on {bind} (beyond loopback) needs a token")
        self.source = source
        self.page = page()
        self.token = token
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

    @property
    def login_url(self) -> str:
        """The URL to open: with ``?token=`` when the dashboard wants one."""
        return self.url + (f"?token={self.token}" if self.token else "")

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests); ``shutdown()`` ends it."""
        thread = threading.Thread(target=self.serve_forever, name="dashboard", daemon=True)
        thread.start()
        return thread


def new_token() -> str:
    """``$HYPERTF_DASHBOARD_TOKEN`` when set (a URL that survives a restart), else a fresh
    random one."""
    return environment.DASHBOARD_TOKEN.read() or secrets.token_urlsafe(24)


def serve(source: DataSource, port: int = DEFAULT_PORT, bind: str | None = None) -> None:
    """Serve until interrupted; beyond loopback only to requests with the token, which the
    printed URL carries (like Jupyter's)."""
    address = bind or LOOPBACK
    token = None if is_loopback(address) else new_token()
    with Dashboard(source, port, address, token=token) as server:
        print(f"hypertf: dashboard on {server.login_url} (read-only; Ctrl-C ends it)",
              flush=True)
        if token:
            print(f"hypertf: the dashboard on {address} answers only requests with its token "
                  f"(the URL above: keep it to yourself; {TOKEN_ENV} sets your own)",
                  file=sys.stderr, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
