"""The peer exchange, on a node: download this node's stripe from the hub, fetch the rest from the peers.

Sent beside node_agent.py (the loader makes both modules; this one's `main` runs the job). While the stage
works, each node serves the files it holds verified to this run's peers: a small HTTP server on the node's
cluster address, answering only requests that carry the run's one-time token (it travels in the job, on
stdin). A peer asks `/ready/<file>` (held until the file is verified here, the holder gives up on it, or a
short hold passes) and then `/file/<file>` with Range, so a file moves on as soon as it is verified at its
holder. Every byte from a peer is hashed against the hub's sha256 before it lands, as a hub download is; a
peer that goes away mid-file leaves its partial to be resumed from the next source, one that serves bad
bytes is named and its file fetched again. After its own work a node tells its peers it is done and serves
until those that fetch from it are done or gone; the controller kills what is left when the stage ends.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

try:  # on a node the loader has made the agent a module of this name
    import k3deploy_node_agent as agent  # type: ignore[import-not-found]
except ImportError:
    from k3deploy.tasks.node import node_agent as agent

PIDFILE = ".k3deploy-exchange.pid"
HOLD_S = 15.0  # a /ready request waits this long at most, then asks again
CONNECT_TIMEOUT_S = 5.0
WATCH_S = 2.0  # how often the agent checks that its controller is still there


class _Holdings:
    """What this node can serve: files verified here (ready), and files it gave up on (with why)."""

    def __init__(self, ready: Any) -> None:
        self.ready = set(ready)
        self.gave_up: dict[str, str] = {}
        self.done_peers: set[str] = set()
        self.changed = threading.Condition()

    def mark(self, path: str, ok: bool, why: str = "") -> None:
        with self.changed:
            if ok:
                self.ready.add(path)
            else:
                self.gave_up[path] = why
            self.changed.notify_all()

    def wait(self, path: str, hold_s: float) -> str | None:
        """'ready', the reason it was given up, or None when still coming after hold_s."""
        deadline = time.monotonic() + hold_s
        with self.changed:
            while path not in self.ready and path not in self.gave_up:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return "ready" if path in self.ready else self.gave_up[path]

    def peer_done(self, name: str) -> None:
        with self.changed:
            self.done_peers.add(name)
            self.changed.notify_all()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], root: Path, token: str, files: dict[str, Any], holdings: _Holdings):
        self.root, self.token, self.files, self.holdings = root, token, files, holdings
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the agent's stderr is its progress channel

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode())

    def _file(self, prefix: str) -> str | None:
        path = urllib.parse.unquote(self.path[len(prefix) :])
        return path if path in self.server.files else None

    def do_POST(self) -> None:
        if not self._authorized():
            self._reply(403, {"error": "not a peer of this run"})
            return
        if self.path.startswith("/done/"):
            self.server.holdings.peer_done(urllib.parse.unquote(self.path[len("/done/") :]))
            self._reply(200, {"state": "noted"})
            return
        self._reply(404, {"error": "no such route"})

    def do_GET(self) -> None:
        if not self._authorized():
            self._reply(403, {"error": "not a peer of this run"})
            return
        if self.path.startswith("/ready/"):
            path = self._file("/ready/")
            state = self.server.holdings.wait(path, HOLD_S) if path else "not a file of this checkpoint"
            if state == "ready":
                self._reply(200, {"state": "ready"})
            elif state is None:
                self._reply(503, {"state": "coming"})
            else:
                self._reply(404, {"state": "given up", "why": state})
        elif self.path.startswith("/file/"):
            path = self._file("/file/")
            if path is None or path not in self.server.holdings.ready:
                self._reply(404, {"error": "not held here"})
                return
            self._send(path)
        else:
            self._reply(404, {"error": "no such route"})

    def _send(self, path: str) -> None:
        size = self.server.files[path].size
        start = 0
        asked = self.headers.get("Range", "")
        if asked.startswith("bytes=") and asked[6:].rstrip("-").isdigit():
            start = int(asked[6:].rstrip("-"))
        if start >= size and size:
            self._reply(416, {"error": f"range starts past {size} bytes"})
            return
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        self.wfile.flush()
        with (self.server.root / path).open("rb") as f:  # sendfile: the kernel copies, the CPU hashes elsewhere
            self.connection.sendfile(f, start, size - start)


class Peers:
    """The other nodes' exchange addresses, and which of them this node has seen answer (then a refusal means
    gone; before, the peer may still be starting, so it is given a grace period)."""

    def __init__(self, urls: dict[str, str], token: str, grace_s: float) -> None:
        self.urls, self.token = urls, token
        self.started, self.grace_s = time.monotonic(), grace_s
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def url(self, peer: str, route: str, path: str) -> str:
        return f"{self.urls[peer]}/{route}/{urllib.parse.quote(path)}"

    def answered(self, peer: str) -> None:
        with self._lock:
            self.seen.add(peer)

    def gone(self, peer: str) -> bool:
        """Refusing now, after it answered once, or never answered within the grace period."""
        host, port = urllib.parse.urlsplit(self.urls[peer]).hostname, urllib.parse.urlsplit(self.urls[peer]).port
        try:
            socket.create_connection((host, port), CONNECT_TIMEOUT_S).close()
        except OSError:
            with self._lock:
                return peer in self.seen or time.monotonic() - self.started > self.grace_s
        self.answered(peer)
        return False

    def wait_ready(self, peer: str, path: str) -> tuple[str, str]:
        """('ready', ''), ('given up', why) or ('gone', why): whether `peer` holds `path` verified now."""
        while True:
            request = urllib.request.Request(self.url(peer, "ready", path), headers=self.headers())
            try:
                with urllib.request.urlopen(request, timeout=HOLD_S + 30) as response:
                    response.read()
                self.answered(peer)
                return "ready", ""
            except urllib.error.HTTPError as err:
                self.answered(peer)
                body = _json(err)
                if err.code == 503:
                    continue  # still coming: ask again
                return (
                    ("given up", str(body.get("why") or body.get("error") or err))
                    if err.code == 404
                    else (
                        "gone",
                        f"HTTP {err.code}",
                    )
                )
            except OSError as err:
                if self.gone(peer):
                    return "gone", f"{peer} does not answer: {getattr(err, 'reason', err)}"
                time.sleep(0.5)  # not up yet: its agent is starting

    def tell_done(self, me: str) -> None:
        for peer in self.urls:
            url = f"{self.urls[peer]}/done/{urllib.parse.quote(me)}"
            request = urllib.request.Request(url, data=b"", headers=self.headers())
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S).close()


def _json(err: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        data = json.loads(err.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Exchange:
    """One node's part: its hub stripe, its files from peers, serving what it holds; events as it goes."""

    def __init__(self, root: Path, listing: Any, job: dict[str, Any]) -> None:
        plan = job["exchange"]
        self.root, self.listing, self.job, self.me = root, listing, job, plan["node"]
        self.download = list(plan["download"])
        self.from_peers: dict[str, list[str]] = {p: list(s) for p, s in plan["from_peers"].items()}
        self.serve_to = set(plan["serve_to"])
        self.peers = Peers(dict(plan["peers"]), plan["token"], float(plan.get("grace_s", 60)))
        self.events: list[str] = []
        self.faults: list[dict[str, str]] = []
        self._lock = threading.Lock()
        files = {f.path: f for f in listing.files}
        self.holdings = _Holdings(p for p in plan["serve"] if p in files)
        self.server: _Server | None = None
        host, port = plan["listen"]
        try:
            self.server = _Server((host, int(port)), root, plan["token"], files, self.holdings)
        except OSError as err:
            self.event(f"cannot listen on {host}:{port} for the peers: {err.strerror or err}; they use the hub")

    def event(self, text: str) -> None:
        with self._lock:
            self.events.append(text)

    def run(self) -> tuple[list[agent.FileCheck], agent.Manifest, dict[str, Any]]:
        pidfile = self.root / PIDFILE
        self.root.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(str(os.getpid()))
        serving = threading.Thread(target=self.server.serve_forever, daemon=True) if self.server else None
        if serving:
            serving.start()
        threading.Thread(target=_exit_when_the_controller_is_gone, args=(pidfile,), daemon=True).start()
        try:
            result = self._fetch()
            self.peers.tell_done(self.me)
            self._serve_until_peers_done()
            return result
        finally:
            if self.server is not None:
                self.server.shutdown()
                self.server.server_close()
            pidfile.unlink(missing_ok=True)

    def _fetch(self) -> tuple[list[agent.FileCheck], agent.Manifest, dict[str, Any]]:
        landing = agent.Landing(self.root, self.listing, [*self.download, *self.from_peers])
        progress = agent.Progress("fetch", sum(f.size for f in landing.wanted))
        by_path = {f.path: f for f in landing.wanted}

        def from_hub(path: str) -> agent.FileCheck:
            check = landing.landed(by_path[path], agent.fetch_file(self.root, by_path[path], self.job, progress))
            self.holdings.mark(path, check.ok, check.problem)
            return check

        def from_peers(path: str) -> agent.FileCheck:
            check = landing.landed(by_path[path], self._from_peers(by_path[path], progress))
            self.holdings.mark(path, check.ok, check.problem)
            return check

        threads = max(1, int(self.job.get("threads", 2)))
        holders = {s for sources in self.from_peers.values() for s in sources}
        with ThreadPoolExecutor(threads) as hub_pool, ThreadPoolExecutor(threads * max(1, len(holders))) as peer_pool:
            hub = {p: hub_pool.submit(from_hub, p) for p in self.download}
            peer = {p: peer_pool.submit(from_peers, p) for p in self.from_peers}
            done = {p: f.result() for p, f in {**hub, **peer}.items()}
        checks, manifest = landing.finish([done[f.path] for f in landing.wanted])
        extra = {"received": dict(progress.sources), "events": list(self.events), "peer_faults": list(self.faults)}
        return checks, manifest, extra

    def _from_peers(self, expected: Any, progress: agent.Progress) -> agent.FileCheck:
        """The file from its holders in turn; the hub only when every holder went away or served bad bytes."""
        path = expected.path
        for peer in self.from_peers[path]:
            state, why = self.peers.wait_ready(peer, path)
            if state == "given up":
                return agent.FileCheck(
                    path,
                    False,
                    f"{peer} could not get it from the hub ({why}); not fetched here too, keeping "
                    "the uplink to one copy: a rerun resumes it",
                )
            if state == "gone":
                self.event(f"{path}: {why} before sending it; trying the next source")
                continue
            source = agent.Source(
                name=f"peer {peer}",
                url=self.peers.url(peer, "file", path),
                headers=self.peers.headers(),
                retries=0,
                who=peer,
            )
            check = agent.fetch_file(self.root, expected, self.job, progress, source)
            if check.ok:
                return check
            if "does not match the hub's" in check.problem:
                self.faults.append({"peer": peer, "file": path, "problem": check.problem})
                self.event(f"{path}: refused the bytes {peer} served: {check.problem}; fetching it again")
            else:
                kept = agent.PARTIAL_DIR + "/" + path + ".part"
                self.event(f"{path}: {peer} went away mid-file ({check.problem}); resuming {kept} from the next source")
        self.event(f"{path}: from the hub, no peer could give it")
        return agent.fetch_file(self.root, expected, self.job, progress)

    def _serve_until_peers_done(self) -> None:
        """Serve until every peer that fetches from here said it is done or is gone; bounded by the node's timeout."""
        if self.server is None:
            return
        waiting = set(self.serve_to)
        while waiting:
            with self.holdings.changed:
                waiting -= self.holdings.done_peers
                if waiting:
                    self.holdings.changed.wait(1.0)
            waiting = {p for p in waiting if p not in self.holdings.done_peers and not self.peers.gone(p)}


def _exit_when_the_controller_is_gone(pidfile: Path) -> None:
    """A blank line to stderr every WATCH_S: once the controller's SSH channel is gone the write fails (EPIPE),
    and the agent, its server with it, ends at once: nothing of the exchange outlives a controller that crashed
    or was killed, and no node keeps downloading for nobody."""
    while True:
        time.sleep(WATCH_S)
        try:
            sys.stderr.write("\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            os._exit(3)


def exchange_files(root: Path, listing: Any, job: dict[str, Any]) -> Any:
    return Exchange(root, listing, job).run()


def main(raw: bytes) -> int:
    return agent.main(raw, exchange_files)
