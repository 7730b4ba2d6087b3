"""Local model hub: serves checkpoints from a folder to the real `huggingface_hub` and `modelscope` clients.

Point the clients at it with ``HF_ENDPOINT=<url>`` / ``MODELSCOPE_ENDPOINT=<url>`` (or their
``endpoint=`` arguments). Files are published with `publish` (from `k3deploy.localhub.store`); faults are
set with ``hub.faults`` or ``POST /_admin/faults`` (see `k3deploy.localhub.faults`): corrupt, drop_hash,
truncate, slow, fail (an HTTP error status) and stall (bytes stop, connection open).

Endpoints (everything the installed clients call for listing and downloading):

HF:  GET /api/models/{repo}[/revision/{rev}][?blobs=true]     sha + siblings
     GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&cursor=   paged by a Link rel="next" header
     HEAD|GET /{repo}/resolve/{rev}/{path}                    X-Repo-Commit, ETag, X-Linked-Etag/-Size, Range
MS:  GET /api/v1/models/{repo}                                repo info
     GET /api/v1/models/{repo}/revisions                      branches and tags
     GET /api/v1/models/{repo}/repo/files?Revision=&Recursive=&Root=
     HEAD|GET /api/v1/models/{repo}/repo?Revision=&FilePath=  Range
     GET /api/v1/repos/internalAccelerationInfo               "no intra-cloud region" (probed by every download)
Admin: GET|POST|DELETE /_admin/faults, GET|DELETE /_admin/requests

CLI: ``python -m k3deploy.localhub --root DIR [--host 127.0.0.1] [--port 0]`` prints the URL and serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from k3deploy.localhub import views
from k3deploy.localhub.faults import Faults, RequestLog, RequestRecord
from k3deploy.localhub.store import Commit, RepoNotFound, RevisionNotFound, last_changes, read_refs, resolve

__all__ = ["HubServer", "main"]

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
_INVERT = bytes(255 - i for i in range(256))
_SEG = r"[^/]+"
_REPO = rf"(?P<org>{_SEG})/(?P<name>{_SEG})"
_TRUE = ("true", "1")


class _Unsatisfiable(ValueError):
    """Range outside the file: answered with 416 and the file size."""

    def __init__(self, size: int) -> None:
        super().__init__(f"range outside a {size}-byte file")
        self.size = size


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Inclusive (start, end) of a single `bytes=` range; None means send the whole file."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if match is None or not (match[1] or match[2]):
        return None  # absent, multi-range or unparsable: RFC 9110 allows ignoring it
    if match[1]:
        start, end = int(match[1]), min(int(match[2]), size - 1) if match[2] else size - 1
    else:
        start, end = max(size - int(match[2]), 0), size - 1
        if int(match[2]) == 0:
            raise _Unsatisfiable(size)
    if start >= size or start > end:
        raise _Unsatisfiable(size)
    return start, end


class _Server(ThreadingHTTPServer):
    """HTTP server holding the hub state; tracks connections so stop() can close idle keep-alives."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        root: Path,
        page_size: int,
        lfs_redirect: str | None = None,
        connection_rate: int | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.root, self.page_size, self.lfs_redirect = root, page_size, lfs_redirect
        self.connection_rate = connection_rate
        self.faults, self.log = Faults(), RequestLog()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Wake handler threads blocked on idle keep-alive connections."""
        with self._conns_lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):  # already closed by the peer
                    conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    """One connection; routes each request to an HF, ModelScope or admin view."""

    protocol_version = "HTTP/1.1"  # keep-alive, so every answer carries Content-Length
    timeout = 300
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing ---------------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self._method = method
        for pattern, methods, view, flavour in _ROUTES:
            match = pattern.match(url.path)
            if match and method in methods:
                args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                try:
                    view(self, query, **args)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                except (LookupError, ValueError, TypeError) as error:  # not found, bad query or admin JSON
                    self._error(flavour, error)
                return
        self._json(404, {"error": f"no route for {method} {url.path}"})

    def _start(self, status: int, headers: dict[str, str], body: int) -> None:
        """Log, then send status and headers; logging first lets tests read the log race-free."""
        authorized = "Authorization" in self.headers
        self.server.log.add(RequestRecord(self._method, self.path, self.headers.get("Range"), status, body, authorized))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self._start(
            status,
            {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})},
            len(body) if self._method != "HEAD" else 0,
        )
        if self._method != "HEAD":
            self.wfile.write(body)

    def _error(self, flavour: str, error: Exception) -> None:
        """404/400/416 in the form the client of that route turns into its own exception."""
        missing = isinstance(error, RepoNotFound | RevisionNotFound | views.EntryNotFound)
        if isinstance(error, _Unsatisfiable):
            self._json(416, {"error": str(error)}, {"Content-Range": f"bytes */{error.size}"})
        elif flavour == "ms":
            status = 404 if missing else 400
            self._json(status, views.ms_error(f"{type(error).__name__}: {error}", status))
        elif not missing:
            self._json(400, {"error": f"{type(error).__name__}: {error}"})
        else:
            codes: dict[type[Exception], str] = {RepoNotFound: "RepoNotFound", RevisionNotFound: "RevisionNotFound"}
            code = codes.get(type(error), "EntryNotFound")
            headers = {"X-Error-Code": code, "X-Error-Message": f"{code}: {error}"}
            headers |= {"X-Repo-Commit": error.args[1]} if len(error.args) > 1 else {}
            self._json(404, {"error": f"{code}: {error.args[0]}"}, headers)

    def _faults_of(self, repo_id: str) -> views.FaultsOf:
        return lambda path: self.server.faults.get(repo_id, path)

    def _send_file(self, repo_id: str, commit: Commit, path: str) -> None:
        """Stream one file (or a Range of it) in chunks, applying that file's fault switches."""
        entry = commit.files.get(path)
        if entry is None:
            raise views.EntryNotFound(path, commit.sha)
        faults = self.server.faults.get(repo_id, path)
        headers = views.file_headers(commit, entry, self._faults_of(repo_id))
        wanted = byte_range(self.headers.get("Range"), entry.size)
        start, end = wanted or (0, entry.size - 1)
        length = max(end - start + 1, 0)
        if wanted:
            headers["Content-Range"] = f"bytes {start}-{end}/{entry.size}"
        headers["Content-Length"] = str(length)
        failure = self.server.faults.take_failure(repo_id, path) if self._method == "GET" else None
        if failure is not None:
            self._json(failure, {"error": f"injected fault: {failure} for {repo_id}/{path}"})
            return
        cut = self.server.faults.take_cut(repo_id, path, start, end) if self._method == "GET" and length else None
        to_send = (cut - start) if cut is not None else length
        stall = self.server.faults.take_stall(repo_id, path, start, end) if self._method == "GET" and length else None
        pause_at = stall.at - start if stall is not None and stall.at < start + to_send else None
        if stall is not None and pause_at is None:  # cut short before the stall point: nothing to hold
            stall.released.set()
            self.server.faults.wait_stall(repo_id, path, stall)
            stall = None
        self._start(206 if wanted else 200, headers, to_send if self._method == "GET" else 0)
        if self._method == "HEAD":
            return
        # A file's own slow switch, or the hub's cap on every connection (the slower of the two).
        rate = min((r for r in (faults.rate, self.server.connection_rate) if r), default=0)
        step = min(_CHUNK, max(1, rate // 20)) if rate else _CHUNK
        began, sent = time.monotonic(), 0
        with commit.blob_path(path).open("rb") as f:
            f.seek(start)
            while sent < to_send:
                if stall is not None and sent == pause_at:  # the bytes before `at` are out: send nothing for a while
                    self.server.faults.wait_stall(repo_id, path, stall)
                    stall = None
                limit = pause_at - sent if stall is not None and pause_at is not None else to_send - sent
                chunk = f.read(min(step, limit))
                sent += len(chunk)
                if rate:  # wait first, so the last byte leaves no earlier than size/rate
                    time.sleep(max(0.0, began + sent / rate - time.monotonic()))
                self.wfile.write(chunk.translate(_INVERT) if faults.corrupt else chunk)
        if cut is not None:
            self.close_connection = True  # the client sees the body end early

    # -- HF views -----------------------------------------------------------------------------------------
    def hf_info(self, query: dict[str, str], org: str, name: str, rev: str = "main") -> None:
        commit = resolve(self.server.root, f"{org}/{name}", rev)
        self._json(
            200,
            views.hf_model_info(
                f"{org}/{name}", commit, query.get("blobs", "").lower() in _TRUE, self._faults_of(f"{org}/{name}")
            ),
        )

    def hf_tree(self, query: dict[str, str], org: str, name: str, rev: str, path: str = "") -> None:
        repo_id = f"{org}/{name}"
        commit = resolve(self.server.root, repo_id, rev)
        recursive = query.get("recursive", "").lower() in _TRUE
        entries = views.hf_tree(commit, path.strip("/"), recursive, self._faults_of(repo_id))
        offset, size = int(query.get("cursor") or 0), self.server.page_size
        headers = {}
        if offset + size < len(entries):
            # Pin the next pages to the commit, so a branch moving mid-listing cannot mix trees.
            params = urlencode(
                {"recursive": str(recursive), "expand": query.get("expand", "False"), "cursor": offset + size}
            )
            tail = f"/{quote(path, safe='')}" if path else ""
            link = f"http://{self.headers['Host']}/api/models/{repo_id}/tree/{commit.sha}{tail}?{params}"
            headers["Link"] = f'<{link}>; rel="next"'
        self._json(200, entries[offset : offset + size], headers)

    def hf_resolve(self, query: dict[str, str], org: str, name: str, rev: str, path: str) -> None:
        repo_id = f"{org}/{name}"
        commit = resolve(self.server.root, repo_id, rev)
        entry = commit.files.get(path)
        if self.server.lfs_redirect and entry is not None and entry.lfs:
            # As huggingface.co does: an LFS file is served from another host, the metadata headers on the 302.
            headers = views.file_headers(commit, entry, self._faults_of(repo_id))
            self._start(
                302, {**headers, "Location": f"{self.server.lfs_redirect}{self.path}", "Content-Length": "0"}, 0
            )
            return
        self._send_file(repo_id, commit, path)

    # -- ModelScope views --------------------------------------------------------------------------------
    def ms_model(self, query: dict[str, str], org: str, name: str) -> None:
        read_refs(self.server.root, f"{org}/{name}")  # RepoNotFound -> 404
        self._json(200, views.ms_envelope(views.ms_model(f"{org}/{name}")))

    def ms_revisions(self, query: dict[str, str], org: str, name: str) -> None:
        repo_id = f"{org}/{name}"
        refs = read_refs(self.server.root, repo_id)
        self._json(
            200,
            views.ms_envelope(views.ms_revisions(refs, lambda sha: resolve(self.server.root, repo_id, sha).created)),
        )

    def ms_files(self, query: dict[str, str], org: str, name: str) -> None:
        repo_id = f"{org}/{name}"
        commit = resolve(self.server.root, repo_id, query.get("Revision") or "master")
        recursive = query.get("Recursive", "").lower() in _TRUE
        root = query.get("Root", "").strip("/")
        changed = last_changes(self.server.root, repo_id, commit)
        self._json(200, views.ms_envelope(views.ms_files(commit, root, recursive, self._faults_of(repo_id), changed)))

    def ms_file(self, query: dict[str, str], org: str, name: str) -> None:
        repo_id = f"{org}/{name}"
        self._send_file(
            repo_id,
            resolve(self.server.root, repo_id, query.get("Revision") or "master"),
            query.get("FilePath", "").lstrip("/"),
        )

    def ms_acceleration(self, query: dict[str, str]) -> None:
        self._json(200, views.ms_envelope({"InternalRegionQueryAddress": ""}))

    # -- admin ---------------------------------------------------------------------------------------------
    def admin_faults(self, query: dict[str, str]) -> None:
        if self._method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            self.server.faults.apply(json.loads(self.rfile.read(length) or b"{}"))
        elif self._method == "DELETE":
            self.server.faults.clear(query.get("repo"), query.get("path"))
        self._json(200, self.server.faults.as_json())

    def admin_requests(self, query: dict[str, str]) -> None:
        if self._method == "DELETE":
            self.server.log.clear()
        self._json(200, [asdict(r) for r in self.server.log.snapshot()])


_View = Callable[..., None]
_ROUTES: list[tuple[re.Pattern[str], tuple[str, ...], _View, str]] = [
    (re.compile(r"^/_admin/faults$"), ("GET", "POST", "DELETE"), _Handler.admin_faults, "admin"),
    (re.compile(r"^/_admin/requests$"), ("GET", "DELETE"), _Handler.admin_requests, "admin"),
    (re.compile(r"^/api/v1/repos/internalAccelerationInfo$"), ("GET",), _Handler.ms_acceleration, "ms"),
    (re.compile(rf"^/api/v1/models/{_REPO}$"), ("GET",), _Handler.ms_model, "ms"),
    (re.compile(rf"^/api/v1/models/{_REPO}/revisions$"), ("GET",), _Handler.ms_revisions, "ms"),
    (re.compile(rf"^/api/v1/models/{_REPO}/repo/files$"), ("GET",), _Handler.ms_files, "ms"),
    (re.compile(rf"^/api/v1/models/{_REPO}/repo$"), ("GET", "HEAD"), _Handler.ms_file, "ms"),
    (re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>{_SEG}))?$"), ("GET",), _Handler.hf_info, "hf"),
    (re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>{_SEG})(?:/(?P<path>.*))?$"), ("GET",), _Handler.hf_tree, "hf"),
    (
        re.compile(rf"^/(?!api/|_admin/){_REPO}/resolve/(?P<rev>{_SEG})/(?P<path>.+)$"),
        ("GET", "HEAD"),
        _Handler.hf_resolve,
        "hf",
    ),
]


class HubServer:
    """The hub on a background thread: ``with HubServer(root) as hub: hub.url``.

    Binds `host` (127.0.0.1 by default; a bridge address for a test bed) on `port` (0: ephemeral).
    `page_size` is the HF tree page length (1000 on huggingface.co). `lfs_redirect`: a base URL (another
    HubServer on the same root) that LFS files' resolve requests are redirected to, as huggingface.co does.
    `connection_rate`: bytes per second each file response is sent at, at most (a hub or CDN that limits
    every connection, rather than the site's uplink limiting them all together); None: as fast as it can.
    """

    def __init__(
        self,
        root: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        page_size: int = 1000,
        lfs_redirect: str | None = None,
        connection_rate: int | None = None,
    ) -> None:
        if connection_rate is not None and connection_rate < 1:
            raise ValueError("connection_rate must be >= 1 byte/s, or None")
        self._server = _Server((host, port), Path(root), page_size, lfs_redirect, connection_rate)
        self._host = host
        self._thread: threading.Thread | None = None

    @property
    def root(self) -> Path:
        """The folder the hub serves (give it to `publish`)."""
        return self._server.root

    @property
    def url(self) -> str:
        """Base URL to give the clients as HF_ENDPOINT / MODELSCOPE_ENDPOINT."""
        return f"http://{self._host}:{self._server.server_port}"

    @property
    def faults(self) -> Faults:
        """Fault switches (same registry as /_admin/faults)."""
        return self._server.faults

    @property
    def requests(self) -> list[RequestRecord]:
        """Requests answered so far, oldest first."""
        return self._server.log.snapshot()

    def clear_requests(self) -> None:
        """Forget the request log, e.g. between the steps of a test."""
        self._server.log.clear()

    def start(self) -> HubServer:
        """Serve on a daemon thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close open connections and release the port."""
        self._server.faults.release_stalls()  # a stalled response must not outlive the hub
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.close_connections()
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve on the calling thread until interrupted (the CLI)."""
        try:
            self._server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self._server.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve DIR until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m k3deploy.localhub", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--root", required=True, type=Path, help="folder holding <org>/<name>/ repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--page-size", type=int, default=1000, help="HF tree page length")
    parser.add_argument(
        "--connection-rate", type=int, default=None, help="bytes/s each file response is sent at, at most"
    )
    args = parser.parse_args(argv)
    hub = HubServer(args.root, args.host, args.port, args.page_size, connection_rate=args.connection_rate)
    print(hub.url, flush=True)
    hub.serve_forever()
