"""Give every test-bed host its own fixed CPU budget, as separate machines have.

On the bed all hosts share this machine's cores, so N simulated nodes doing the same
per-node work take N times as long as one, whatever the code that drives them: the bed,
not the fan-out, is what is measured. Capping each host's sshd (hence every session and
tool it starts) at the same share of a core, whether 4 or 16 hosts run, makes each host
a small independent machine: a node's own work costs it the same time at any node count,
and what grows is only what grows on a real cluster. Uses the cgroup v1 `cpu` controller
(CFS quota) and `cpuacct` to read each host's CPU time; needs root.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from testbed.layout import HostState

GROUP = "k3deploy-bench"


class HostCpuLimits:
    """Context manager: each host's sshd in its own cgroup, capped at `cores` CPUs."""

    def __init__(self, hosts: Sequence[HostState], cores: float, root: Path = Path("/sys/fs/cgroup")) -> None:
        if not 0 < cores <= (os.cpu_count() or 1):
            raise ValueError(f"--host-cpu must be within 0..{os.cpu_count()} cores, got {cores}")
        self.hosts, self.cores = list(hosts), cores
        self.cpu, self.acct = root / "cpu", root / "cpuacct"
        for ctrl in (self.cpu, self.acct):
            if not (ctrl / "cgroup.procs").exists():
                raise RuntimeError(f"{ctrl}: no cgroup v1 hierarchy; --host-cpu needs the cpu and cpuacct controllers")
        self.ctrls = list(dict.fromkeys(c.resolve() for c in (self.cpu, self.acct)))  # one, where they are co-mounted

    def _groups(self) -> list[Path]:
        return [c / GROUP / h.name for c in self.ctrls for h in self.hosts]

    def __enter__(self) -> HostCpuLimits:
        for group in self._groups():
            group.mkdir(parents=True, exist_ok=True)
        for host in self.hosts:
            period = int((self.cpu / GROUP / host.name / "cpu.cfs_period_us").read_text())
            (self.cpu / GROUP / host.name / "cpu.cfs_quota_us").write_text(str(int(self.cores * period)))
            for ctrl in self.ctrls:
                (ctrl / GROUP / host.name / "cgroup.procs").write_text(str(host.pids["sshd"]))
        return self

    def usage(self) -> dict[str, float]:
        """CPU seconds each host has used since it was capped."""
        return {h.name: int((self.acct / GROUP / h.name / "cpuacct.usage").read_text()) / 1e9 for h in self.hosts}

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        """Move every process back to the root group and remove the groups."""
        for group in self._groups():
            if not group.exists():
                continue
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    (group.parent.parent / "cgroup.procs").write_text(pid)
            group.rmdir()
        for ctrl in self.ctrls:
            if (ctrl / GROUP).exists():
                (ctrl / GROUP).rmdir()
