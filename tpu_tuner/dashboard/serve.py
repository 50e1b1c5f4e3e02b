"""`tpu-tune dashboard --serve`: the page and the results folder's files over HTTP, nothing else.

* ``/`` (or ``/dashboard.html``) is rendered from the folder on request, so a new or finished run
  shows on the next reload. The page is cached until a run folder changes (the signature is every
  folder's and file's modification time), so reloading an unchanged folder costs a directory scan.
  While a tuning run is still being written the page carries a meta refresh (REFRESH_S).
* ``/dashboard.csv`` is the runs table as CSV.
* Any other path is a file under the results folder (reports, plots). A path that leaves the
  folder (``..``, encoded or not, or a symlink pointing out) is refused with 403.

It binds 127.0.0.1 unless told otherwise: the folder holds model paths and study storages.
"""

from __future__ import annotations

import logging
import mimetypes
import os
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tpu_tuner.core.credentials import redact
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.dashboard.collect import collect
from tpu_tuner.dashboard.page import DEFAULT_DETAILS, render_page

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
REFRESH_S = 10  # reload period of the served page while a run is live
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Text files a run folder holds; served as plain text so that the browser shows them, not downloads them.
_TEXT = {".md", ".toml", ".csv", ".json", ".txt", ".log"}


class DashboardServer(ThreadingHTTPServer):
    """A threading HTTP server that knows its results folder and caches the rendered page."""

    daemon_threads = True  # Ctrl-C does not wait for a browser's open keep-alive connections

    def __init__(self, address: tuple[str, int], root: Path, details: int = DEFAULT_DETAILS) -> None:
        super().__init__(address, DashboardHandler)
        self.root = root.resolve()
        self.details = details
        self._lock = threading.Lock()
        self._cache: tuple[tuple, bytes] | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}/"

    def _signature(self) -> tuple:
        stamps = []
        for entry in os.scandir(self.root):
            if entry.is_dir() and not entry.name.startswith("."):
                stamps.append((entry.name, "", entry.stat().st_mtime_ns))
                stamps += [(entry.name, f.name, f.stat().st_mtime_ns) for f in os.scandir(entry.path)]
        return tuple(sorted(stamps))

    def page(self) -> bytes:
        """The current page, re-rendered only when a run folder changed."""
        with self._lock:  # one render at a time; the others wait for it and reuse it
            signature = self._signature()
            if self._cache is None or self._cache[0] != signature:
                collection = collect(self.root)
                html = render_page(collection, self.details, refresh_s=REFRESH_S if collection.live else None)
                self._cache = (signature, html.encode("utf-8"))
            return self._cache[1]

    def csv(self) -> bytes:
        return collect(self.root).runs.to_csv(index=False).encode("utf-8")


class DashboardHandler(BaseHTTPRequestHandler):
    """GET and HEAD of the page, the CSV, and files under the results folder."""

    server: DashboardServer
    server_version = "tpu-tune-dashboard"

    def do_GET(self) -> None:
        self._respond(body=True)

    def do_HEAD(self) -> None:
        self._respond(body=False)

    def _respond(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path in ("/", "/dashboard.html", "/dashboard.csv"):
            try:
                data = self.server.page() if path != "/dashboard.csv" else self.server.csv()
            except Exception as exc:
                log.exception("rendering %s failed", path)
                return self._send(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    f"500: the dashboard could not be rendered: {exc}\n".encode(),
                    body,
                )
            kind = "text/csv; charset=utf-8" if path == "/dashboard.csv" else "text/html; charset=utf-8"
            return self._send(HTTPStatus.OK, kind, redact(data.decode()).encode(), body)
        if path == "/favicon.ico":  # browsers ask for it; an error would show in their console
            return self._send(HTTPStatus.NO_CONTENT, "image/x-icon", b"", body)
        target = self._resolve(path)
        if target is None:
            log.warning("refused %s from %s: outside the results folder", self.path, self.client_address[0])
            return self._send(
                HTTPStatus.FORBIDDEN,
                "text/plain; charset=utf-8",
                b"403 forbidden: only files under the results folder are served\n",
                body,
            )
        if not target.is_file():
            return self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"404 not found\n", body)
        is_text = target.suffix.lower() in _TEXT
        kind = (
            "text/plain; charset=utf-8"
            if is_text
            else mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        )
        data = target.read_bytes()
        if is_text:
            # Never hand out a password, also from run folders written before run.json was redacted.
            data = redact(data.decode("utf-8", errors="replace")).encode()
        self._send(HTTPStatus.OK, kind, data, body)

    def _resolve(self, path: str) -> Path | None:
        """The file `path` names under the results folder, or None when it would climb out of it."""
        parts = [p for p in path.replace("\\", "/").split("/") if p]
        if "\x00" in path or any(p == ".." for p in parts):
            return None
        target = self.server.root.joinpath(*parts).resolve()  # resolves symlinks too
        return target if target.is_relative_to(self.server.root) else None

    def _send(self, status: HTTPStatus, kind: str, data: bytes, body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")  # live runs: always the current state
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.client_address[0], format % args)


def make_server(
    root: str | Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT, details: int = DEFAULT_DETAILS
) -> DashboardServer:
    """A bound server for `root` (not yet serving: call serve_forever). Port 0 takes any free port."""
    root = Path(root)
    collect(root)  # fails here, with the path, when root is missing or not a folder
    if host not in LOOPBACK:
        log.warning(
            "serving on %s: anyone who can reach this machine can read the results folder "
            "(model paths, study storages, reports)",
            host,
        )
    try:
        return DashboardServer((host, port), root, details)
    except OSError as exc:
        raise UserInputError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port; 0 picks a free one)"
        ) from exc
