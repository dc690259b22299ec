"""``castore serve``: a read-only web view of a store, on the standard library's HTTP server.

Routes: ``GET /`` lists the sessions by app and user; ``GET /s/<app>/<user>/<session>``
(each part percent-encoded) is that session's view (:func:`castore.html.render_session`),
with an imported session's bookkeeping lines too when the query has ``all-entries``.
Nothing else exists: a write method gets 405, any other path 404, and so does a key part
that is ``.``/``..`` (names never reach the file system here anyway: the store encodes
them, and its storage refuses any key that would leave it). A request that fails on a
damaged object gets a 500 page, never a dropped connection. Requests whose ``Host`` is not
the bound loopback name are refused (400), so a web page cannot reach the server through DNS rebinding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from ..deletion import finish_line
from ..errors import CastoreError, InvalidName, SessionNotFound
from ..store import Store
from ..views import session_title
from .assets import CSS, JS
from .model import build_model
from .page import INDEX_CSS, csp, index_page, session_href, session_page

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_ANY = {"0.0.0.0", "::", ""}
#: what a log line escapes: the C0 and C1 controls and the backslash, as the base handler does
#: (its own table, ``_control_char_table``, is private)
_CONTROL_CHARS = str.maketrans({c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {ord("\\"): "\\\\"})


class ViewServer(ThreadingHTTPServer):
    """The HTTP server of one store's views (see the module doc).

    Attributes:
        store: the store shown.
        log: called with one line per request (default: nothing is printed).
    """

    daemon_threads = True

    def __init__(self, store: Store, host: str = "127.0.0.1", port: int = 0,
                 log: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.log = log
        self.lock = threading.Lock()  # one reader at a time: the store's caches are not shared-safe
        self.hosts = None if host in _ANY else {host.strip("[]").lower(), *_LOOPBACK}
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        """``http://host:port/`` of the running server."""
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # getsockname() names an AF_INET or AF_INET6 host as text
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}/"


def _split_key(path: str) -> tuple[str, str, str] | None:
    """The ``(app, user, session)`` of a view path, or None when it cannot name one.

    Every name the index lists must open (a NUL, ``/`` or ``../`` inside a name is fine:
    the store encodes names into single path segments and refuses keys that leave it).
    Only ``.`` and ``..`` are refused, since browsers resolve those segments away.
    """
    parts = path.split("/")
    if len(parts) != 3:
        return None
    key = [unquote(p, errors="strict") for p in parts]
    if any(p in ("", ".", "..") for p in key):
        return None
    return key[0], key[1], key[2]


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    server_version = "castore"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        if self.server.log is not None:
            # The request line is the client's text: escape its controls, as the base class does.
            self.server.log(f"{self.address_string()} {(format % args).translate(_CONTROL_CHARS)}")

    def _send(self, status: HTTPStatus, body: str, policy: str | None = None, allow: bool = False,
              head: bool = False) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", policy or "default-src 'none'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        if allow:
            self.send_header("Allow", "GET, HEAD")
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _error(self, status: HTTPStatus, text: str, head: bool = False, allow: bool = False) -> None:
        import html

        body = f"<!DOCTYPE html><title>{status.value}</title><p>{status.value} {html.escape(text)}</p>\n"
        self._send(status, body, allow=allow, head=head)

    def _host_ok(self) -> bool:
        if self.server.hosts is None:
            return True
        host = (self.headers.get("Host") or "").strip().lower()
        if host.startswith("["):
            host = host[1:].split("]", 1)[0]
        elif host.count(":") == 1:
            host = host.split(":", 1)[0]
        return host in self.server.hosts

    def _get(self, head: bool) -> None:
        if not self._host_ok():
            self._error(HTTPStatus.BAD_REQUEST, "unexpected Host header", head)
            return
        path, query = urlsplit(self.path)[2:4]
        try:
            if path == "/":
                with self.server.lock:
                    body = self._index()
                self._send(HTTPStatus.OK, body, csp(None, INDEX_CSS), head=head)
                return
            key = _split_key(path[len("/s/"):]) if path.startswith("/s/") else None
            if key is None:
                self._error(HTTPStatus.NOT_FOUND, "not found", head)
                return
            every = "all-entries" in parse_qs(query, keep_blank_values=True)
            with self.server.lock:
                model = build_model(self.server.store.session(*key), all_entries=every)
            toggle = session_href(*key) + ("" if every else "?all-entries")
            self._send(HTTPStatus.OK, session_page(model, back="/", toggle=toggle), csp(JS, CSS), head=head)
        except (InvalidName, SessionNotFound, UnicodeDecodeError):
            self._error(HTTPStatus.NOT_FOUND, "no such session", head)
        except CastoreError as e:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, " ".join(str(e).split()), head)
        except Exception as e:  # noqa: BLE001 - one damaged object must not drop the connection
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"cannot show this: {type(e).__name__}", head)

    def _index(self) -> str:
        store = self.server.store
        rows = []
        if store.exists:
            for app in store.apps():
                for s in store.sessions(app):
                    note = finish_line((s.app, s.user, s.session)) if s.deleting is not None else s.problem
                    rows.append((s.app, s.user, s.session, s.entries, s.branch, s.updated, session_title(s.info),
                                 note))
        return index_page(store.url, rows)

    def do_GET(self) -> None:
        self._get(head=False)

    def do_HEAD(self) -> None:
        self._get(head=True)

    def _refuse(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "this server is read-only", allow=True)

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


def make_server(store: Store, host: str = "127.0.0.1", port: int = 0,
                log: Callable[[str], None] | None = None) -> ViewServer:
    """Bind a :class:`ViewServer` for ``store`` (``port=0``: a free port); call ``serve_forever()``.

    Raises:
        OSError: the address cannot be bound.
    """
    return ViewServer(store, host, port, log)


__all__ = ["ViewServer", "make_server"]
