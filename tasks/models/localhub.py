"""The local hub around the models stage: generate and publish the profile's checkpoints, serve them, stop.

With `models.local_hub` set (the local profile), nothing has to be running before the command:
`local_hub` publishes every `generate` checkpoint the hub's folder lacks (generated offline into a
temporary folder, then `publish`ed as a commit), serves the folder on host:port for the stage's real
hub clients and stops the server when the stage ends, whichever way it ends.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.logging.loggers import LoggingAdapter

from k3deploy.blocks.models import GeneratedKind, LocalHubConfig, ModelsConfig
from k3deploy.core.errors import HubError
from k3deploy.localhub import HubServer, RepoNotFound, RevisionNotFound, publish, resolve

BRANCH = "main"
GENERATED_BY = "k3deploy generated a {kind} checkpoint"  # the commit message, so the hub says what it holds


def generate_checkpoint(folder: Path, kind: GeneratedKind) -> None:
    """Write a tiny Kimi-K3-shaped checkpoint (scripted or random weights) into `folder`, offline."""
    from k3deploy.localprofile.checkpoint import write_checkpoint  # numpy, safetensors, tokenizers: only when needed

    write_checkpoint(folder, scripted=kind == "scripted")


def generated_by(kind: GeneratedKind) -> str:
    """The commit message of a generated checkpoint: its kind and the generator's version (its source's hash), so a
    hub made by an older generator is published again, as a new commit, once the generator changes."""
    spec = importlib.util.find_spec("k3deploy.localprofile.checkpoint")
    source = Path(spec.origin).read_bytes() if spec and spec.origin else b""
    return f"{GENERATED_BY.format(kind=kind)} (generator {hashlib.sha256(source).hexdigest()[:12]})"


def _logger() -> logging.Logger | LoggingAdapter:
    try:
        return get_run_logger()
    except MissingContextError:  # called outside a flow run (a script, a test)
        return logging.getLogger(__name__)


def _head_message(root: Path, repo: str) -> str | None:
    """The message of the repo's head commit on the branch; None when the hub lacks the repo."""
    try:
        return resolve(root, repo, BRANCH).message
    except (RepoNotFound, RevisionNotFound):
        return None


def publish_generated(hub: LocalHubConfig) -> dict[str, str]:
    """Generate and publish each `generate` checkpoint the hub's folder lacks; repo id → commit published."""
    log, root = _logger(), Path(hub.root)
    root.mkdir(parents=True, exist_ok=True)
    published: dict[str, str] = {}
    for repo, kind in hub.generate.items():
        message, wanted = _head_message(root, repo), generated_by(kind)
        if message == wanted:
            log.info("local hub: %s is published already, not generating it", repo)
            continue
        if message is not None and not message.startswith(GENERATED_BY.format(kind=kind)):
            log.warning("local hub: %s holds another checkpoint (%s); delete %s for a %s one", repo, message,
                        root / repo, kind)  # fmt: skip
            continue
        if message is not None:
            log.info("local hub: %s was made by another version of the generator (%s): publishing anew", repo, message)
        with tempfile.TemporaryDirectory(prefix=".generate-", dir=root) as tmp:
            folder = Path(tmp)
            log.info("local hub: generating the %s checkpoint %s (offline)", kind, repo)
            started = time.monotonic()
            generate_checkpoint(folder, kind)
            written = [p for p in sorted(folder.rglob("*")) if p.is_file()]
            if not written:
                raise HubError(f"local hub: generating {repo} wrote no files")
            size, took = sum(p.stat().st_size for p in written), time.monotonic() - started
            log.info("local hub: generated %s, %d files, %.1f MB in %.1f s", repo, len(written), size / 1e6, took)
            files: dict[str, bytes | Path] = {p.relative_to(folder).as_posix(): p for p in written}
            published[repo] = publish(root, repo, files, BRANCH, wanted)
            log.info("local hub: published %s as commit %s", repo, published[repo][:12])
    return published


def _open_server(hub: LocalHubConfig) -> HubServer:
    """Bind host:port now, so a taken port fails the stage before anything is generated."""
    try:
        return HubServer(hub.root, hub.host, hub.port)
    except OSError as err:
        why = (
            "the port is taken (another k3deploy run or another program listens there); "
            "stop it or set models.local_hub.port to a free port"
            if err.errno == errno.EADDRINUSE
            else err.strerror or str(err)
        )
        raise HubError(f"the local hub cannot listen on {hub.host} port {hub.port}: {why}") from None


@contextlib.contextmanager
def local_hub(models: ModelsConfig) -> Iterator[str | None]:
    """The local hub's URL while the block runs (None when `models.local_hub` is not set); stopped after."""
    hub = models.local_hub
    if hub is None:
        yield None
        return
    log = _logger()
    server = _open_server(hub)
    try:
        publish_generated(hub)
        server.start()
        log.info("local hub: serving %s at %s", hub.root, server.url)
        yield server.url
    finally:
        server.stop()
        log.info("local hub: stopped, port %d released", hub.port)
