"""The preflight flow on the test bed: real sshd with pinned host keys, real Podman engines, real commands."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import paramiko
import pytest

from k3deploy.blocks.serve import SEED_MOUNTS
from k3deploy.core.errors import PreflightFailed
from k3deploy.core.stage import StageResult, Verdict
from k3deploy.flows.preflight import preflight
from k3deploy.tasks.preflight.facts import FACT_NAMES
from k3deploy.tasks.preflight.gather import host_key_fingerprint, read_host_keys
from k3deploy.tasks.transport import LocalTransport, SSHTransport
from tests.bedconfig import bed_config, write_config
from tests.prefect_runs import latest_artifact

pytestmark = [pytest.mark.preflight, pytest.mark.testbed, pytest.mark.prefect]
TABLE = "preflight-facts"


def config(bed, tmp_path: Path, **changes) -> str:
    return write_config(tmp_path / f"deploy-{uuid.uuid4().hex[:8]}.yaml", bed_config(bed, **changes))


def table() -> dict[str, dict[str, str]]:
    """The newest node × fact table artifact, by node."""
    return {row["node"]: row for row in json.loads(latest_artifact(TABLE))}


def failed(path: str) -> PreflightFailed:
    with pytest.raises(PreflightFailed) as info:
        preflight(config=path)
    assert info.value.result.stage == "preflight" and info.value.result.verdict is Verdict.FAIL
    return info.value


def failures(result: StageResult) -> list[tuple[str, str]]:
    return [(f.subject, f.check) for f in result.failures]


def keygen_fingerprints(known_hosts: Path) -> dict[str, str]:
    """Address → fingerprint, as OpenSSH's own `ssh-keygen -lf` prints the pinned keys."""
    out = subprocess.run(["ssh-keygen", "-lf", str(known_hosts)], capture_output=True, text=True, check=True).stdout
    return {line.split()[2]: line.split()[1] for line in out.splitlines()}


def test_healthy_bed_passes_with_every_node_and_fact_in_the_table(prefect_server, testbed, tmp_path):
    result = preflight(config=config(testbed, tmp_path))
    assert result.verdict is Verdict.PASS and result.failures == []
    names = [h.name for h in testbed.hosts[:4]]
    rows = table()
    assert list(rows) == names
    for row in rows.values():
        assert list(row) == ["node", *FACT_NAMES]
        assert not any(cell.startswith("FAIL") for cell in row.values()), row
    assert rows["node0"]["ports"] == "service_port 8000 free, rpc_port 13345 free"
    assert rows["node1"]["ports"] == "n/a (node 0 only)"
    assert rows["node2"]["engine"].startswith("Podman Engine ")
    assert rows["node3"]["devices"] == "all 19 present"
    facts = result.data["nodes"]
    assert set(facts) == set(names)
    assert facts["node1"]["driver"] == "24.1.rc3.7" and facts["node1"]["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert facts["node0"]["model_root_free"]["path"] == "/srv/models"
    assert {(f.subject, f.check) for f in result.findings} >= {(n, "ssh") for n in names}
    assert "preflight-facts" in result.artifacts and "preflight-summary" in result.artifacts


def test_host_keys_are_the_fingerprints_openssh_shows(prefect_server, testbed, tmp_path):
    result = preflight(config=config(testbed, tmp_path))
    pinned = keygen_fingerprints(testbed.known_hosts)
    expected = {h.name: pinned[h.ip] for h in testbed.hosts[:4]}
    assert result.data["host_keys"] == expected
    assert all(fp.startswith("SHA256:") and not fp.endswith("=") for fp in expected.values())
    assert table()["node2"]["ssh"] == f"ssh-ed25519 {expected['node2']}"


@pytest.fixture
def port_taken(testbed):
    """A listener on node 0's service port (8000) inside its network namespace, stopped after the test."""
    host = testbed.hosts[0]
    listen = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('0.0.0.0', 8000)); s.listen(); time.sleep(300)")  # fmt: skip
    pid = int(testbed.ssh(host, f"setsid nohup python3 -c {shlex.quote(listen)} >/dev/null 2>&1 & echo $!").stdout)
    try:
        deadline = time.monotonic() + 10
        while ":8000 " not in testbed.ssh(host, "ss -Hltn").stdout:
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.1)
        yield host
    finally:
        testbed.ssh(host, f"kill {pid}", check=False)


def test_a_taken_port_on_node0_fails_naming_node_and_ports(prefect_server, testbed, tmp_path, port_taken):
    error = failed(config(testbed, tmp_path))
    result = error.result
    assert failures(result) == [("node0", "ports")]
    detail = result.failures[0].detail
    assert detail.startswith("service_port 8000 is taken: LISTEN") and "0.0.0.0:8000" in detail
    assert table()["node0"]["ports"].startswith("FAIL: service_port 8000 is taken")


def known_hosts_with_impostor(bed, ip: str, tmp_path: Path) -> Path:
    """The bed's known_hosts with `ip` pinned to a freshly generated key the host does not have."""
    impostor = paramiko.ECDSAKey.generate()
    known = tmp_path / "known_hosts"
    lines = [line for line in bed.known_hosts.read_text().splitlines() if not line.startswith(f"{ip} ")]
    known.write_text("\n".join([*lines, f"{ip} {impostor.get_name()} {impostor.get_base64()}"]) + "\n")
    return known


def test_a_changed_host_key_fails_that_node_and_the_others_are_still_read(prefect_server, testbed, tmp_path):
    node1 = testbed.hosts[1]
    known = known_hosts_with_impostor(testbed, node1.ip, tmp_path)
    error = failed(config(testbed, tmp_path, cluster__ssh__known_hosts=str(known)))
    result = error.result
    assert failures(result) == [("node1", "ssh")]
    assert result.failures[0].detail.startswith(f"host key CHANGED for {node1.ip}")
    assert set(result.data["host_keys"]) == {"node0", "node2", "node3"}
    for node in ("node0", "node2", "node3"):
        assert set(result.data["nodes"][node]) >= {"ssh", "os", "kernel", "driver", "shm", "engine", "devices"}
    assert set(result.data["nodes"]["node1"]) == set()
    rows = table()
    assert rows["node1"]["ssh"].startswith("FAIL: host key CHANGED") and rows["node1"]["os"] == "not read (SSH failed)"
    assert rows["node3"]["os"] == "Debian GNU/Linux 12 (bookworm)"


@pytest.fixture
def mount_on_all_but_node2(testbed):
    """A folder in each host's private /srv, made on every host but node2; removed after the test."""
    path = f"/srv/k3-preflight-{uuid.uuid4().hex[:8]}"
    hosts = [h for h in testbed.hosts[:4] if h.name != "node2"]
    for host in hosts:
        testbed.ssh(host, f"mkdir {path}")
    try:
        yield path
    finally:
        for host in hosts:
            testbed.ssh(host, f"rmdir {path}", check=False)


def test_a_missing_mount_path_fails_naming_node_and_path(prefect_server, testbed, tmp_path, mount_on_all_but_node2):
    path = mount_on_all_but_node2
    mounts = [*SEED_MOUNTS, f"{path}:/data:ro"]
    error = failed(config(testbed, tmp_path, serve__container__mounts=mounts))
    result = error.result
    assert failures(result) == [("node2", "mounts")]
    assert result.failures[0].detail == f"missing mount path: {path}"
    assert f"node2: mounts: missing mount path: {path}" in str(PreflightFailed(result))  # the message names both
    assert table()["node0"]["mounts"] == "all 5 present"


def test_host_keys_of_reachable_unreachable_and_local_nodes(testbed):
    """Read straight from the transports: a ghost address fails ssh within its timeout, a local node has no key."""
    node0 = testbed.hosts[0]
    transports = {
        "node0": SSHTransport(node0.ip, name="node0", private_key_file=testbed.key, known_hosts=testbed.known_hosts),
        "ghost": SSHTransport(
            "10.213.0.250",
            name="ghost",
            private_key_file=testbed.key,
            known_hosts=testbed.known_hosts,
            connect_timeout=2,
        ),
        "local": LocalTransport("local"),
    }
    try:
        got = read_host_keys(transports)
        assert host_key_fingerprint(transports["node0"]) == keygen_fingerprints(testbed.known_hosts)[node0.ip]
    finally:
        for t in transports.values():
            t.close()
    assert (got["node0"].host_key_type, got["node0"].ssh_error) == ("ssh-ed25519", None)
    assert got["ghost"].host_key is None and got["ghost"].ssh_error.startswith("cannot reach 10.213.0.250:22 within 2s")
    assert (got["local"].host_key, got["local"].ssh_error) == ("local (no SSH)", None)


def test_two_nodes_that_are_one_machine_fail_preflight_each_naming_the_other(prefect_server, testbed, tmp_path):
    """node1's address an alias of node0's (a second address on node0's interface, forwarded to its sshd, its host
    key pinned under that address as a site's known_hosts would hold it): two ranks would share one machine's NPUs.
    Both fail preflight, each naming the other and the key."""
    host, alias = testbed.hosts[0], "10.213.0.200"  # outside the bed's hosts (.10 up)
    line = next(x for x in testbed.known_hosts.read_text().splitlines() if x.startswith(f"{host.ip} "))
    known = tmp_path / "known_hosts"
    known.write_text(testbed.known_hosts.read_text() + line.replace(host.ip, alias, 1) + "\n")
    forward = [
        "PREROUTING",
        "-d",
        alias,
        "-p",
        "tcp",
        "--dport",
        "22",
        "-j",
        "DNAT",
        "--to-destination",
        f"{host.ip}:22",
    ]
    nat = ["ip", "netns", "exec", host.netns, "iptables", "-t", "nat"]
    subprocess.run(["ip", "-n", host.netns, "addr", "add", f"{alias}/24", "dev", "eth0"], check=True)
    subprocess.run([*nat, "-A", *forward], check=True)  # the bed's sshd listens on the host's own address only
    try:
        nodes = [
            {"name": "node0", "address": host.ip, "nic": "eth0"},
            {"name": "node1", "address": alias, "nic": "eth0"},
        ]
        data = bed_config(testbed, hosts=2, cluster__nodes=nodes, cluster__ssh__known_hosts=str(known))
        err = failed(write_config(tmp_path / "one-machine.yaml", data))
    finally:
        subprocess.run([*nat, "-D", *forward], check=True)
        subprocess.run(["ip", "-n", host.netns, "addr", "del", f"{alias}/24", "dev", "eth0"], check=True)
    by_node = {f.subject: f.detail for f in err.result.failures}
    key = keygen_fingerprints(known)[host.ip]  # as OpenSSH prints it
    assert set(by_node) == {"node0", "node1"}, by_node
    assert (
        f"the same host key as node1 ({key})" in by_node["node0"]
        and "one machine listed as 2 nodes" in by_node["node0"]
    )
    assert f"the same host key as node0 ({key})" in by_node["node1"]
