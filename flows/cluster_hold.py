"""What a cluster's hold says and when it is stale: plain data and rules, no I/O (cluster_lock does that).

The holder of a cluster writes a record (a Prefect variable named like the cluster's limit) and rewrites it
every beat (its `beat_s`, `cluster.hold_beat_s`, written into the record) with a growing beat count. A waiting
run judges the hold dead when the holder's flow run has ended, or when the record has not changed for
STALE_BEATS of the holder's own beats on the waiter's own clock: no wall clocks compared across hosts, no
setting the two must agree on, and no server service (Prefect's lease repossessor) relied on.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

# Prefect's shortest lease; the holder renews it (and its record) every beat, at most BEAT_S apart.
LEASE_S = 60.0
BEAT_S = 15.0  # the default beat (cluster.hold_beat_s), and the longest that keeps the lease renewed in time
# A record unchanged for this many of its holder's beats on a waiter's clock belongs to a holder that stopped.
STALE_BEATS = 4
STALE_S = STALE_BEATS * BEAT_S  # with the default beat: 60 s
# How often a waiting run asks for the slot again.
POLL_S = 2.0
# A slot taken with no record at all (a holder that died between taking it and writing its record, or an
# older k3deploy) is freed after this long.
UNRECORDED_S = 2 * LEASE_S


def takeover_bound_s(beat_s: float = BEAT_S) -> float:
    """The stated bound: a waiter takes a dead holder's cluster this long after it first sees the hold, at most
    (64 s with the default beat)."""
    return STALE_BEATS * beat_s + 2 * POLL_S


FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})


@dataclass(frozen=True)
class HoldRecord:
    """Who holds a cluster, as the holder wrote it."""

    run_id: str | None
    run_name: str
    since: str
    lease_id: str | None = None
    beat: int = 0
    renewed: str | None = None
    host: str | None = None
    pid: int | None = None
    beat_s: float = BEAT_S  # how often this holder renews (records of older versions: the default)

    @property
    def stale_s(self) -> float:
        return STALE_BEATS * self.beat_s

    @classmethod
    def parse(cls, value: Any) -> HoldRecord | None:
        """The record from the variable's value; None when there is none (or it is not one of ours)."""
        if not isinstance(value, dict):
            return None
        run_id = value.get("run_id")
        beat = value.get("beat", 0)
        pid = value.get("pid")
        return cls(
            run_id=None if run_id in (None, "None") else str(run_id),
            run_name=str(value.get("run_name") or "?"),
            since=str(value.get("since") or "?"),
            lease_id=str(value["lease_id"]) if value.get("lease_id") else None,
            beat=beat if isinstance(beat, int) else 0,
            renewed=str(value["renewed"]) if value.get("renewed") else None,
            host=str(value["host"]) if value.get("host") else None,
            pid=pid if isinstance(pid, int) else None,
            beat_s=_beat(value.get("beat_s")),
        )

    def to_value(self) -> dict[str, Any]:
        return asdict(self)

    def next_beat(self) -> HoldRecord:
        return replace(self, beat=self.beat + 1, renewed=utc_now())

    def describe(self) -> str:
        """'run NAME (ID), since T' as messages name a holder."""
        who = f"run {self.run_name} ({self.run_id})" if self.run_id else self.run_name
        where = f" on {self.host} (pid {self.pid})" if self.host else ""
        return f"{who}{where}, since {self.since}"

    def renewed_age_s(self, now: datetime | None = None) -> float | None:
        """Seconds since the holder last renewed, by this machine's clock; None when it never said."""
        if not self.renewed:
            return None
        try:
            then = datetime.fromisoformat(self.renewed)
        except ValueError:
            return None
        return ((now or datetime.now(UTC)) - then).total_seconds()


def _beat(value: Any) -> float:
    """A record's beat as its holder wrote it; the default for a record without one, or with nonsense."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= BEAT_S:
        return float(value)
    return BEAT_S


def same_hold(a: HoldRecord | None, b: HoldRecord | None) -> bool:
    """One holder's one hold, whatever beats it renewed since (a live holder rewrites its record every BEAT_S)."""
    if a is None or b is None:
        return a is b
    return (a.run_id, a.lease_id, a.since) == (b.run_id, b.lease_id, b.since)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def ended_reason(state_type: str | None) -> str | None:
    """Why a holder whose flow run is in this state no longer holds anything; None while it may."""
    if state_type is None:
        return "its flow run no longer exists"
    if state_type.upper() in FINAL_STATES:
        return f"its flow run is {state_type.capitalize()}"
    return None


@dataclass
class HoldWatch:
    """A waiter's view of one hold over time: stale when the record stops changing for STALE_BEATS of its
    holder's beats."""

    unrecorded_s: float = UNRECORDED_S
    _seen: tuple[Any, ...] | None = field(default=None, init=False)
    _since: float = field(default=0.0, init=False)

    def observe(self, record: HoldRecord | None, now: float | None = None) -> str | None:
        """Note what the record says now; the reason the hold is dead, or None while it may live."""
        now = time.monotonic() if now is None else now
        key = ("none",) if record is None else (record.run_id, record.lease_id, record.beat, record.renewed)
        if key != self._seen:
            self._seen, self._since = key, now
            return None
        quiet = now - self._since
        if record is None:
            return None if quiet < self.unrecorded_s else f"its slot is taken with no holder recorded for {quiet:.0f} s"
        if quiet >= record.stale_s:
            return f"its hold was not renewed for {quiet:.0f} s (it renews every {record.beat_s:g} s)"
        return None
