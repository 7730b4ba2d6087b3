"""The peer exchange, on a node: download this node's stripe from the hub, fetch the rest from the peers.

Sent beside node_agent.py (the loader makes both modules; this one's `main` runs the job). While the stage
works, each node serves the files it holds verified to this run's peers: a small HTTP server on the node's
cluster address, answering only requests that carry the run's one-time token (it travels in the job, on
stdin). A receiver reads every peer's `/have` (what it holds verified, serves now, gave up on, fetches from
the hub, and which peers it found slow) and takes each file, with Range from where its partial stops, from
a holder that is not serving that file to FANOUT peers already: a file spreads from every node that verified
it. Every byte from a peer is hashed against the hub's sha256 before it lands, as a hub download is.

A source is watched as it sends: one slower than `slow_fraction` of what the other sources give (the hub's
rate, the other peers' median, per stream), or silent for `stall_s`, is left mid-file and named, and the
rest comes from another peer that verified the file, or, when none can, from the hub: fetched there by the
file's first rescuer still present (the plan's order), the others taking it from that node. A peer that
goes away mid-file, or that failed to get its stripe's file from the hub, is handled the same way; one that
serves bad bytes is named and its file fetched again. After its own work a node tells its peers it is done
and serves until those that fetch from it are done or gone; the controller kills what is left when the
stage ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
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
CONNECT_TIMEOUT_S = 5.0
WATCH_S = 2.0  # how often the agent checks that its controller is still there
FANOUT = 2  # a node sends one file to this many peers at once; the others take it from those, or wait
LOOK_S = 0.3  # how old a receiver's view of the peers' `/have` may be
JUDGE_AFTER_S = 2.0  # a stream is judged only after this long (TCP's start, the first bytes)
WINDOW_S = 1.0  # a stream's rate: its bytes over the last window of at least this long
RATE_MEMORY_S = 60.0  # rates older than this say nothing of a source now
PROBE_BYTES = 4 << 20  # a receiver with no rate to compare a peer with reads this much of the file from the hub
BUSY = 429  # a holder already sending the file to FANOUT peers
SEND_TIMEOUT_S = 60.0  # a peer's socket that takes no byte for this long is closed


class _Holdings:
    """What this node can serve: files verified here (ready), files it gave up on (with why), what it sends now;
    and what it tells its peers: the files it fetches from the hub for them, the peers it found slow."""

    def __init__(self, ready: Any) -> None:
        self.ready = set(ready)
        self.gave_up: dict[str, str] = {}
        self.done_peers: set[str] = set()
        self.sending: dict[str, int] = {}
        self.from_hub: set[str] = set()
        self.slow: set[str] = set()
        self.changed = threading.Condition()

    def claim(self, path: str) -> bool:
        """One more peer may be sent `path` now (at most FANOUT at once)."""
        with self.changed:
            if self.sending.get(path, 0) >= FANOUT:
                return False
            self.sending[path] = self.sending.get(path, 0) + 1
            return True

    def release(self, path: str) -> None:
        with self.changed:
            self.sending[path] -= 1

    def have(self) -> dict[str, Any]:
        with self.changed:
            return {
                "ready": sorted(self.ready),
                "gave_up": dict(self.gave_up),
                "sending": {p: n for p, n in self.sending.items() if n},
                "from_hub": sorted(self.from_hub),
                "slow": sorted(self.slow),
            }

    def mark(self, path: str, ok: bool, why: str = "") -> None:
        with self.changed:
            if ok:
                self.ready.add(path)
                self.gave_up.pop(path, None)  # got from a peer after the hub failed it
            else:
                self.gave_up[path] = why
            self.changed.notify_all()

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

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A receiver that left mid-file (a slow source is left on purpose) is routine: no traceback on stderr,
        which is the agent's progress channel."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = SEND_TIMEOUT_S  # a receiver whose host vanished frees its sending slot within this, not TCP's minutes

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
        if self.path == "/have":
            self._reply(200, self.server.holdings.have())
        elif self.path.startswith("/file/"):
            path = self._file("/file/")
            holdings = self.server.holdings
            if path is None or path not in holdings.ready:
                self._reply(404, {"error": "not held here"})
                return
            if not holdings.claim(path):
                self._reply(BUSY, {"state": "busy", "sending": FANOUT})
                return
            try:
                self._send(path)
            finally:
                holdings.release(path)
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

    def have(self, peer: str) -> dict[str, Any] | None:
        """The peer's `/have`; None when it does not answer (yet, or any more: `gone` tells)."""
        request = urllib.request.Request(f"{self.urls[peer]}/have", headers=self.headers())
        try:
            with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S + 2) as response:
                data = json.loads(response.read())
        except (OSError, ValueError):
            return None
        self.answered(peer)
        return data if isinstance(data, dict) else None

    def tell_done(self, me: str) -> None:
        for peer in self.urls:
            url = f"{self.urls[peer]}/done/{urllib.parse.quote(me)}"
            request = urllib.request.Request(url, data=b"", headers=self.headers())
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S).close()


class Board:
    """Every peer's `/have`, read at most every LOOK_S by whichever receiver asks first; a peer that stopped
    answering after it once did (or never did within the grace) is gone."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        self.seen: dict[str, dict[str, Any]] = {}
        self.gone: set[str] = set()
        self._read_at = 0.0
        self._lock = threading.Lock()

    def look(self) -> Board:
        with self._lock:
            if time.monotonic() - self._read_at < LOOK_S:
                return self
            asked = [p for p in self.peers.urls if p not in self.gone]  # a peer gone is not waited on again
            with ThreadPoolExecutor(max(1, len(asked))) as pool:
                answers = dict(zip(asked, pool.map(self.peers.have, asked)))  # noqa: B905 - nodes may run Python < 3.10
            seen, gone = dict(self.seen), set(self.gone)
            for peer, answer in answers.items():
                if answer is not None:
                    seen[peer] = answer
                elif self.peers.gone(peer):
                    gone.add(peer)
            self.seen, self.gone = seen, gone  # new snapshots: a reader never sees one change under it
            self._read_at = time.monotonic()
            return self

    def holds(self, peer: str, path: str) -> bool:
        return peer not in self.gone and path in self.seen.get(peer, {}).get("ready", ())

    def sending(self, peer: str, path: str) -> int:
        return int(self.seen.get(peer, {}).get("sending", {}).get(path, 0))

    def gave_up(self, peer: str, path: str) -> str | None:
        return self.seen.get(peer, {}).get("gave_up", {}).get(path)

    def fetching_from_hub(self, peer: str, path: str) -> bool:
        return peer not in self.gone and path in self.seen.get(peer, {}).get("from_hub", ())

    def found_slow(self) -> set[str]:
        """The peers any node found slow: a peer slow to one is, in all likelihood, slow to all."""
        return {p for answer in self.seen.values() for p in answer.get("slow", ())}


class Rates:
    """Per-stream rates this node saw, by source ('hub', 'peer node2'): what a stream is judged against."""

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def observe(self, source: str, rate: float) -> None:
        with self._lock:
            self._seen.setdefault(source, []).append((time.monotonic(), rate))
            del self._seen[source][:-20]

    def typical(self, source: str) -> float | None:
        """The median of the source's recent rates; None when it has none."""
        since = time.monotonic() - RATE_MEMORY_S
        with self._lock:
            recent = sorted(r for t, r in self._seen.get(source, ()) if t >= since)
        return recent[len(recent) // 2] if recent else None

    def sources(self) -> list[str]:
        with self._lock:
            return list(self._seen)


def alternative(rates: Rates, source: str, slow: set[str]) -> tuple[str, float] | None:
    """What the other sources give a stream: the hub's typical rate, or the median of the other peers' that are
    not found slow, whichever is higher; None when nothing was measured."""
    options = []
    hub = rates.typical("hub")
    if hub:
        options.append(("the hub", hub))
    peers = sorted(r for s in rates.sources() if s not in ("hub", source) and s.removeprefix("peer ") not in slow
                   for r in [rates.typical(s)] if r)  # fmt: skip
    if peers:
        options.append(("the other peers", peers[len(peers) // 2]))
    return max(options, key=lambda o: o[1]) if options else None


def too_slow(rate: float, elapsed_s: float, other: tuple[str, float] | None, fraction: float) -> str | None:
    """Why a stream should be left ('sent 0.9 MB/s, under 0.5 × the 40 MB/s of the hub'), or None: judged only
    after JUDGE_AFTER_S, against a measured alternative, and never with `fraction` 0 (judging off)."""
    if fraction <= 0 or elapsed_s < JUDGE_AFTER_S or other is None or rate >= fraction * other[1]:
        return None
    return f"sent {rate / 1e6:.2f} MB/s, under {fraction:g} × the {other[1] / 1e6:.1f} MB/s of {other[0]}"


class StreamWatch:
    """Told each chunk of one stream: records its rate, and (judging) raises SlowSource when it is too slow. Its
    clock starts at the stream's first byte (not while a resumed partial is hashed again, or the connection
    made) and stops while the judge works (a probe of the hub)."""

    def __init__(self, source: str, rates: Rates, judge: Any = None) -> None:
        self.source, self.rates, self.judge = source, rates, judge
        self.begun = False
        self.started = self.window_at = 0.0
        self.total = self.window = 0
        self.paused = 0.0
        self.rate: float | None = None

    def __call__(self, n: int) -> None:
        now = time.monotonic()
        if not self.begun:  # the first chunk's bytes crossed before the clock could start: not timed
            self.begun, self.started, self.window_at = True, now, now
            return
        self.total, self.window = self.total + n, self.window + n
        if now - self.window_at < WINDOW_S:
            return
        self.rate = self.window / (now - self.window_at)
        self.rates.observe(self.source, self.rate)
        self.window, self.window_at = 0, now
        if self.judge is not None:  # on the stream's whole rate so far: one slow window is not a slow source
            elapsed = now - self.started - self.paused
            why = self.judge(self.total / elapsed, elapsed)
            self.paused += time.monotonic() - now
            self.window_at = time.monotonic()
            if why:
                raise agent.SlowSource(why)

    def finish(self) -> None:
        """A stream too short for a window still tells its rate, once it carried something worth timing."""
        seconds = time.monotonic() - self.started - self.paused
        if self.rate is None and self.total >= 1 << 20 and seconds > 0:
            self.rates.observe(self.source, self.total / seconds)


def choose(candidates: list[str], board: Board, path: str, avoid: set[str]) -> str | None:
    """The holder to ask for `path`: verified there, not avoided, sending it to the fewest; a node that got it
    from a peer before its first holder (spreading the load), then the plan's order."""
    holders = [p for p in candidates if p not in avoid and board.holds(p, path) and board.sending(p, path) < FANOUT]
    if not holders:
        return None
    return min(holders, key=lambda p: (board.sending(p, path), p == candidates[0], candidates.index(p)))


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
        self.rescue: dict[str, list[str]] = {p: list(r) for p, r in plan.get("rescue", {}).items()}
        self.serve_to = set(plan["serve_to"])
        self.peers = Peers(dict(plan["peers"]), plan["token"], float(plan.get("grace_s", 60)))
        self.board = Board(self.peers)
        self.rates = Rates()
        self.slow_fraction = float(plan.get("slow_fraction", 0.5))
        self.stall_s = float(plan.get("stall_s", 10.0))
        self._probe_lock = threading.Lock()
        self._probed_at = -RATE_MEMORY_S
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
            check = self._from_hub(by_path[path], progress)
            if not check.ok and not check.problem.startswith("cannot write"):
                # the hub failed this node: its peers learn it (gave_up), the file's rescuer fetches it, and this
                # node takes it from a peer like any other
                self.holdings.mark(path, False, check.problem)
                self.event(f"{path}: could not get it from the hub ({check.problem}); taking it from a peer")
                check = self._from_peers(by_path[path], progress, sources=list(self.peers.urls))
            check = landing.landed(by_path[path], check)
            self.holdings.mark(path, check.ok, check.problem)
            return check

        def from_peers(path: str) -> agent.FileCheck:
            check = landing.landed(by_path[path], self._from_peers(by_path[path], progress))
            self.holdings.mark(path, check.ok, check.problem)
            return check

        threads = max(1, int(self.job.get("threads", 2)))
        with (
            ThreadPoolExecutor(threads) as hub_pool,
            ThreadPoolExecutor(threads * max(1, len(self.peers.urls))) as peer_pool,
        ):
            hub = {p: hub_pool.submit(from_hub, p) for p in self.download}
            peer = {p: peer_pool.submit(from_peers, p) for p in self.from_peers if p not in hub}
            done = {p: f.result() for p, f in {**hub, **peer}.items()}
        checks, manifest = landing.finish([done[f.path] for f in landing.wanted])
        extra = {"received": dict(progress.sources), "events": list(self.events), "peer_faults": list(self.faults)}
        return checks, manifest, extra

    def _from_hub(self, expected: Any, progress: agent.Progress) -> agent.FileCheck:
        watch = StreamWatch("hub", self.rates)
        check = agent.fetch_file(self.root, expected, self.job, progress, watch=watch)
        watch.finish()
        return check

    def _from_peers(self, expected: Any, progress: agent.Progress, sources: list[str] | None = None) -> agent.FileCheck:
        """The file from a peer that verified it (its holders, then any node that got it since), with Range from
        where the partial stops whenever a source is left; through the hub once more, by the file's first
        rescuer still here, when every holder went away, gave up, or is slow; from the hub here when no peer
        is left at all."""
        path, size = expected.path, expected.size
        sources = sources or self.from_peers[path]
        order = self.rescue.get(path, [])
        holders = [p for p in sources if p not in order]  # the plan's: held it, or fetch it from the hub
        left: dict[str, str] = {}  # sources not asked again for this file, and why
        switched: str | None = None  # why the last source was left: said once the rest starts from the next
        while True:
            board = self.board.look()
            for p in sources:
                if p in left:
                    continue
                if p in board.gone:
                    left[p] = f"{p} went away"
                elif (why := board.gave_up(p, path)) is not None and not board.holds(p, path):
                    left[p] = f"{p} could not get it from the hub ({why})"
            slow = board.found_slow() | self.holdings.slow
            peer = choose(sources, board, path, set(left) | slow)
            if peer is not None:
                if switched:
                    self.event(f"{path}: the rest from {peer}, from byte {self._have(path)} ({switched})")
                check, why = self._fetch_from(peer, expected, progress)
                if check.ok:
                    return check
                if why == "busy":
                    time.sleep(LOOK_S)
                elif why == "slow":
                    with self.holdings.changed:
                        self.holdings.slow.add(peer)
                    switched = f"{peer} {check.problem.removeprefix(agent.SLOW)}"
                    self.event(f"{path}: {switched}; left at byte {self._have(path)} of {size}")
                elif why == "bad bytes":
                    left[peer] = f"{peer} served bytes that fail the hub's sha256"
                    with self._lock:
                        self.faults.append({"peer": peer, "file": path, "problem": check.problem})
                    self.event(f"{path}: refused the bytes {peer} served: {check.problem}; fetching it again")
                    switched = f"{peer} served bad bytes"
                else:
                    left[peer] = f"{peer} went away mid-file"
                    kept = agent.PARTIAL_DIR + "/" + path + ".part"
                    self.event(
                        f"{path}: {peer} went away mid-file ({check.problem}); resuming {kept} from the next source"
                    )
                    switched = f"{peer} went away"
                continue
            coming = [p for p in holders if p not in left and p not in slow]
            if coming:  # a holder still fetching it, or sending it to FANOUT peers: wait for it
                time.sleep(LOOK_S)
                continue
            # who may still give it fast: not left, not gone, not slow (a slow node is never waited on)
            live = [p for p in sources if p not in left and p not in board.gone and p not in slow]
            rescuer = next((r for r in order if r == self.me or r in live), self.me)
            at_hub = [p for p in live if board.fetching_from_hub(p, path)]
            if rescuer != self.me or at_hub:  # that node fetches it from the hub: take it from there, once it has it
                time.sleep(LOOK_S)
                continue
            gone = [left[p] for p in holders if p in left]
            slowed = [p for p in holders if p not in left and p in slow]
            if slowed:
                gone.append(f"every holder is slow ({', '.join(slowed)})" if not gone else f"{', '.join(slowed)} slow")
            why = "; ".join(gone) or "no peer could give it"
            self.event(f"{path}: from the hub, {why}" + (f", from byte {self._have(path)}" if self._have(path) else ""))
            with self.holdings.changed:
                self.holdings.from_hub.add(path)
            try:
                return self._from_hub(expected, progress)
            finally:
                with self.holdings.changed:
                    self.holdings.from_hub.discard(path)

    def _have(self, path: str) -> int:
        return agent._size(self.root / agent.PARTIAL_DIR / (path + ".part"))

    def _fetch_from(self, peer: str, expected: Any, progress: agent.Progress) -> tuple[agent.FileCheck, str]:
        """One try at `peer`, watched: the check, and (failed) why in a word: busy, slow, bad bytes, gone."""
        source = agent.Source(
            name=f"peer {peer}",
            url=self.peers.url(peer, "file", expected.path),
            headers=self.peers.headers(),
            retries=0,
            who=peer,
            read_timeout_s=self.stall_s,  # a peer that sends nothing for stall_s is left like a slow one
        )
        watch = StreamWatch(source.name, self.rates, lambda rate, elapsed: self._judge(peer, rate, elapsed, expected))
        check = agent.fetch_file(self.root, expected, self.job, progress, source, watch)
        watch.finish()
        if check.ok:
            return check, ""
        if f"answered HTTP {BUSY}" in check.problem:
            return check, "busy"
        if check.problem.startswith(agent.SLOW):
            return check, "slow"
        if "(read timeout)" in check.problem and watch.begun:  # it had started sending: a stall, not a gone host
            why = f"sent nothing for {self.stall_s:g} s"
            return agent.FileCheck(check.path, False, agent.SLOW + why), "slow"
        if "does not match the hub's" in check.problem:
            return check, "bad bytes"
        return check, "gone"

    def _judge(self, peer: str, rate: float, elapsed: float, expected: Any) -> str | None:
        """Why the stream from `peer` should be left, or None; with nothing to compare it with, the hub is probed
        once (a few MiB of this file, thrown away) for what it gives now."""
        if self.slow_fraction <= 0 or elapsed < JUDGE_AFTER_S:
            return None
        slow = self.board.found_slow() | self.holdings.slow
        other = alternative(self.rates, f"peer {peer}", slow)
        if other is None:
            self._probe_hub(expected)
            other = alternative(self.rates, f"peer {peer}", slow)
        return too_slow(rate, elapsed, other, self.slow_fraction)

    def _probe_hub(self, expected: Any) -> None:
        with self._probe_lock:
            if time.monotonic() - self._probed_at < RATE_MEMORY_S:
                return
            self._probed_at = time.monotonic()
            want = min(PROBE_BYTES, expected.size)
            headers = {**self.job.get("headers", {}), "Range": f"bytes=0-{want - 1}"}
            started, got, hasher = time.monotonic(), 0, hashlib.sha256()  # hashed, as a real stream's bytes are
            with contextlib.suppress(OSError, http.client.HTTPException):
                request = urllib.request.Request(expected.url, headers=headers)
                with agent._OPENER.open(request, timeout=self.stall_s) as response:  # the token stays on the hub
                    while got < want and (chunk := response.read1(1 << 16)):
                        hasher.update(chunk)
                        got += len(chunk)
            seconds = time.monotonic() - started
            if got and seconds > 0:
                self.rates.observe("hub", got / seconds)

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
