"""One cluster, one run at a time: a Prefect global concurrency limit named after the cluster.

The top-level run takes the cluster's single slot once (validate, or a stage run alone from the
CLI); stage subflows of a validate run never take it again, which would deadlock. Prefect does
not say who holds a slot, so the holder writes a record into a Prefect variable of the same name
(a limit and a variable named k3deploy-cluster-<cluster>) and renews it with its lease.

A holder that died (its worker killed with it) never releases: on a server that runs Prefect's lease
repossessor its lease lapses, on one that does not (the temporary test server) it never would. So a
waiting run judges the hold itself (cluster_hold: the holder's flow run ended, or its record unchanged
for four of its beats) and takes the cluster over, freeing the dead lease and saying whose it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from uuid import UUID

import httpx
from prefect import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.logging import get_logger
from prefect.variables import Variable

from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.core.errors import ClusterBusy
from k3deploy.flows.cluster_hold import (
    LEASE_S,
    POLL_S,
    HoldRecord,
    HoldWatch,
    ended_reason,
    same_hold,
    utc_now,
)

LOG = get_logger("k3deploy.cluster")
LOCKED = 423  # the server's answer while the slot is taken
GONE = 410  # its answer to renewing a lease it no longer has


def cluster_label(cluster: ClusterConfig) -> str:
    """`name` when given, else node 0's address and a hash of every node's: the same nodes, the same lock."""
    if cluster.name:
        return cluster.name
    addresses = sorted(f"{n.address}:{cluster.ssh.port}" for n in cluster.nodes)
    return f"{cluster.nodes[0].address}-{hashlib.sha256(' '.join(addresses).encode()).hexdigest()[:8]}"


def lock_name(cluster: ClusterConfig) -> str:
    """The limit's (and the holder variable's) name: lower-case letters, digits, dashes."""
    return "k3deploy-cluster-" + re.sub(r"[^a-z0-9]+", "-", cluster_label(cluster).lower()).strip("-")


def read_hold(name: str) -> HoldRecord | None:
    return HoldRecord.parse(Variable.get(name, default=None))


def holder_of(name: str) -> str:
    """Who holds the cluster, as its holder wrote it; 'an unknown run' when it wrote nothing."""
    record = read_hold(name)
    return record.describe() if record else "an unknown run (no holder recorded)"


def _log() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The flow run's logger when there is one (so the UI shows the wait), else k3deploy's."""
    from prefect.context import FlowRunContext
    from prefect.logging import get_run_logger

    return get_run_logger() if FlowRunContext.get() else LOG


def _ensure_limit(name: str) -> None:
    """Create the cluster's limit once: read first, as a create that collides makes the server log a traceback."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
            return
        except ObjectNotFound:
            pass
        with contextlib.suppress(ObjectAlreadyExists):  # another run created it between the two calls
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


def _run_state(run_id: str | None) -> str | None:
    """The holder's flow run state type ('RUNNING', …); None when the run is gone."""
    if run_id is None:
        return "RUNNING"  # a CLI holder has no flow run: only its beat tells
    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(run_id))
    except (ObjectNotFound, ValueError):
        return None
    return run.state.type.value if run.state else "PENDING"


def _free_slot(name: str, record: HoldRecord | None) -> None:
    """Give back a dead holder's slot: its lease when recorded (the server forgets it), else the slot count."""
    with get_client(sync_client=True) as client:
        if record is not None and record.lease_id:
            client.release_concurrency_slots_with_lease(UUID(record.lease_id))
        else:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
    with contextlib.suppress(Exception):
        if same_hold(read_hold(name), record):
            Variable.unset(name)


def _try_take(name: str, holder: ConcurrencyLeaseHolder | None) -> UUID | None:
    """The lease on the cluster's slot, or None while another run holds it."""
    with get_client(sync_client=True) as client:
        try:
            response = client.increment_concurrency_slots_with_lease(
                names=[name], slots=1, mode="concurrency", lease_duration=LEASE_S, holder=holder
            )
        except httpx.HTTPStatusError as err:
            if err.response.status_code == LOCKED:
                return None
            raise
    return UUID(response.json()["lease_id"])


def _wait_for_slot(cluster: ClusterConfig, name: str, holder: ConcurrencyLeaseHolder | None) -> UUID:
    """Take the slot: at once, or after its holder ends or is found dead; refuse or give up as configured."""
    refuse = cluster.on_busy == "refuse"
    deadline = None if cluster.busy_timeout_s is None else time.monotonic() + cluster.busy_timeout_s
    watch, told = HoldWatch(), False
    while (lease := _try_take(name, holder)) is None:
        record = read_hold(name)
        if refuse or (deadline is not None and time.monotonic() > deadline):
            who = record.describe() if record else "an unknown run (no holder recorded)"
            how = "refused (cluster.on_busy: refuse)" if refuse else f"gave up after {cluster.busy_timeout_s:g} s"
            raise ClusterBusy(
                f"cluster {cluster_label(cluster)} is in use by {who}; {how}. "
                f"Wait for that run, or cancel it (its teardown removes what it started); "
                f"`k3deploy cluster status` shows the hold."
            )
        if not told:
            who = record.describe() if record else "an unknown run (no holder recorded)"
            _log().info("cluster %s is held by %s: waiting for it", cluster_label(cluster), who)
            told = True
        dead = (ended_reason(_run_state(record.run_id)) if record else None) or watch.observe(record)
        if dead:
            who = record.describe() if record else "an unknown holder"
            _log().warning("cluster %s: taking over the hold of %s: %s", cluster_label(cluster), who, dead)
            _free_slot(name, record)
            continue
        time.sleep(POLL_S)
    return lease


def _beat(name: str, lease: UUID, record: HoldRecord, stop: threading.Event, label: str) -> None:
    """Renew the lease and the record every beat until told to stop; say so once if the hold was lost."""
    beat_s = record.beat_s
    while not stop.wait(beat_s):
        try:
            current = read_hold(name)
            if current is not None and current.lease_id != record.lease_id:
                _log().error("cluster %s: this run's hold was taken over by %s", label, current.describe())
                return
            with get_client(sync_client=True) as client:
                client.renew_concurrency_lease(lease, lease_duration=LEASE_S)
            record = record.next_beat()
            Variable.set(name, record.to_value(), overwrite=True)
        except httpx.HTTPStatusError as err:
            if err.response.status_code == GONE:
                _log().error("cluster %s: this run's hold was released by another (`cluster release`?)", label)
                return
            LOG.warning("cluster %s: renewing the hold failed (%s); trying again in %g s", label, err, beat_s)
        except Exception as err:  # a transient API error must not end a two-hour run; the next beat tries again
            LOG.warning("cluster %s: renewing the hold failed (%s); trying again in %g s", label, err, beat_s)


@contextlib.contextmanager
def hold_cluster(cluster: ClusterConfig, run_id: UUID | None, run_name: str) -> Iterator[None]:
    """Hold the cluster for the block's duration; enqueue behind or refuse (cluster.on_busy) a holder."""
    name, label = lock_name(cluster), cluster_label(cluster)
    _ensure_limit(name)
    holder = ConcurrencyLeaseHolder(type="flow_run", id=run_id) if run_id else None
    lease = _wait_for_slot(cluster, name, holder)
    record = HoldRecord(
        run_id=str(run_id) if run_id else None,
        run_name=run_name,
        since=utc_now(),
        lease_id=str(lease),
        renewed=utc_now(),
        host=socket.gethostname(),
        pid=os.getpid(),
        beat_s=cluster.hold_beat_s,
    )
    stop = threading.Event()
    beating = threading.Thread(target=_beat, args=(name, lease, record, stop, label), daemon=True)
    try:
        Variable.set(name, record.to_value(), overwrite=True)
        _log().info("holding cluster %s (%s)", label, name)
        beating.start()
        yield
    finally:
        stop.set()
        if beating.is_alive():
            beating.join(timeout=30)
        with contextlib.suppress(Exception):  # the slot is released whatever happens to the variable
            current = read_hold(name)
            if current is not None and current.lease_id == str(lease):
                Variable.unset(name)
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)


@dataclass(frozen=True)
class ClusterHold:
    """A cluster's hold as `k3deploy cluster status` shows it."""

    label: str
    lock: str
    active_slots: int
    record: HoldRecord | None
    run_state: str | None  # the holder's flow run state; None when that run no longer exists

    @property
    def held(self) -> bool:
        return self.active_slots > 0 or self.record is not None

    def dead_reason(self) -> str | None:
        """Why the holder is known dead: its run ended, or it has not renewed for four of its beats."""
        if self.record is None:
            return None if self.active_slots == 0 else "the slot is taken with no holder recorded"
        ended = ended_reason(self.run_state)
        if ended:
            return ended
        age = self.record.renewed_age_s()
        if age is not None and age > self.record.stale_s:
            return f"its hold was last renewed {age:.0f} s ago (it renews every {self.record.beat_s:g} s)"
        return None

    def to_json(self) -> dict[str, object]:
        record = self.record
        return {
            "cluster": self.label,
            "lock": self.lock,
            "held": self.held,
            "active_slots": self.active_slots,
            "holder": record.to_value() if record else None,
            "holder_run_state": self.run_state if record else None,
            "renewed_age_s": record.renewed_age_s() if record else None,
            "stale": self.dead_reason(),
        }


def cluster_hold(cluster: ClusterConfig) -> ClusterHold:
    name = lock_name(cluster)
    _ensure_limit(name)
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    record = read_hold(name)
    state = _run_state(record.run_id) if record else None
    return ClusterHold(cluster_label(cluster), name, int(limit.active_slots), record, state)


def release_cluster(cluster: ClusterConfig, force: bool = False) -> str:
    """Free a stale hold (its holder known dead); a live holder's only with force. Says what it did."""
    hold = cluster_hold(cluster)
    if not hold.held:
        return f"cluster {hold.label} is free: nothing to release"
    dead = hold.dead_reason()
    who = hold.record.describe() if hold.record else "an unknown holder"
    if dead is None and not force:
        age = hold.record.renewed_age_s() if hold.record else None
        renewed = "" if age is None else f", renewed {age:.0f} s ago"
        raise ClusterBusy(
            f"cluster {hold.label} is held by {who}, which is alive (its flow run is "
            f"{(hold.run_state or '?').capitalize()}{renewed}); cancel that run instead, "
            "or pass --force to release it anyway"
        )
    _free_slot(hold.lock, hold.record)
    why = dead or "forced (--force): the holder may still be running"
    return f"released cluster {hold.label}, held by {who}: {why}"
