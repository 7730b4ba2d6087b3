"""One cluster, one run at a time: a Prefect global concurrency limit named after the cluster.

The top-level run takes the cluster's single slot once (validate, or a stage run alone from the
CLI); stage subflows of a validate run never take it again, which would deadlock. Prefect does
not say who holds a slot, so the holder writes its run into a Prefect variable of the same name
for a refused run to name it (a limit and a variable named k3deploy-cluster-<cluster>).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from uuid import UUID

import httpx
from prefect import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency._asyncio import AcquireConcurrencySlotTimeoutError, ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists
from prefect.logging import get_logger
from prefect.variables import Variable

from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.errors import ClusterBusy

LOG = get_logger("k3deploy.cluster")
# The slot is leased and renewed while the run lives; a run that died (its worker killed with it) frees the
# cluster once its lease lapses: a minute, not Prefect's default five.
LEASE_S = 60.0


def cluster_label(cluster: ClusterConfig) -> str:
    """`name` when given, else node 0's address and a hash of every node's: the same nodes, the same lock."""
    if cluster.name:
        return cluster.name
    addresses = sorted(f"{n.address}:{cluster.ssh.port}" for n in cluster.nodes)
    return f"{cluster.nodes[0].address}-{hashlib.sha256(' '.join(addresses).encode()).hexdigest()[:8]}"


def lock_name(cluster: ClusterConfig) -> str:
    """The limit's (and the holder variable's) name: lower-case letters, digits, dashes."""
    return "k3deploy-cluster-" + re.sub(r"[^a-z0-9]+", "-", cluster_label(cluster).lower()).strip("-")


def holder_of(name: str) -> str:
    """Who holds the cluster, as its holder wrote it; 'an unknown run' when it wrote nothing."""
    value = Variable.get(name, default=None)
    if not isinstance(value, dict):
        return "an unknown run (no holder recorded)"
    return f"run {value.get('run_name') or '?'} ({value.get('run_id')}), since {value.get('since')}"


def _ensure_limit(name: str) -> None:
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


@contextlib.contextmanager
def hold_cluster(cluster: ClusterConfig, run_id: UUID | None, run_name: str) -> Iterator[None]:
    """Hold the cluster for the block's duration; enqueue behind or refuse (cluster.on_busy) a holder."""
    name = lock_name(cluster)
    _ensure_limit(name)
    holder = ConcurrencyLeaseHolder(type="flow_run", id=run_id) if run_id else None
    refuse = cluster.on_busy == "refuse"
    acquired = False
    if Variable.get(name, default=None) is not None and cluster.on_busy == "enqueue":
        LOG.info("cluster %s is held by %s: waiting for it", cluster_label(cluster), holder_of(name))
    try:
        with concurrency(
            name,
            occupy=1,
            timeout_seconds=None if refuse else cluster.busy_timeout_s,
            max_retries=0 if refuse else None,  # refuse: one attempt, a 423 answer is the refusal
            strict=True,
            holder=holder,
            lease_duration=LEASE_S,
            raise_on_lease_renewal_failure=False,  # a transient API error must not kill a two-hour run
        ):
            acquired = True
            since = datetime.now(UTC).isoformat(timespec="seconds")
            Variable.set(name, {"run_id": str(run_id), "run_name": run_name, "since": since}, overwrite=True)
            LOG.info("holding cluster %s (%s)", cluster_label(cluster), name)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):  # the slot is released whatever happens to the variable
                    Variable.unset(name)
    except (AcquireConcurrencySlotTimeoutError, ConcurrencySlotAcquisitionError, httpx.HTTPStatusError) as err:
        if acquired:
            raise
        how = "refused (cluster.on_busy: refuse)" if refuse else f"gave up after {cluster.busy_timeout_s:g} s"
        raise ClusterBusy(
            f"cluster {cluster_label(cluster)} is in use by {holder_of(name)}; {how}. "
            f"Wait for that run, or cancel it (its teardown removes what it started)."
        ) from err
