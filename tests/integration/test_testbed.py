"""The test bed itself: real sshd, Podman over docker-py ssh://, registry, NPU simulators."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
import pytest

from testbed import userssh

pytestmark = pytest.mark.bed  # the test bed itself

if TYPE_CHECKING:
    from testbed.layout import HostState
    from testbed.pytest_plugin import FaultInjector, Testbed

pytest_plugins = ("testbed.pytest_plugin",)

CHIP_ROW = re.compile(r"^\| \d+\s+\d+\s+\| 0000:", re.M)


def wait_for(what: str, probe: Callable[[], bool], timeout: float = 30) -> None:
    """Poll a condition with a deadline (no fixed sleeps as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.testbed
def test_each_host_answers_ssh_with_its_own_hostname(testbed: Testbed) -> None:
    assert len(testbed.hosts) >= 2
    for host in testbed.hosts:
        out = testbed.ssh(host, "hostname; cat /etc/hostname; ip -4 -o addr show eth0").stdout.split()
        assert out[:2] == [host.name, host.name]
        assert f"{host.ip}/24" in out


@pytest.mark.testbed
def test_host_key_matches_the_pinned_known_hosts(testbed: Testbed) -> None:
    pinned = paramiko.HostKeys(str(testbed.known_hosts))
    for host in testbed.hosts:
        transport = paramiko.Transport((host.ip, host.port))
        try:
            transport.start_client(timeout=10)
            key = transport.get_remote_server_key()
        finally:
            transport.close()
        assert pinned.lookup(host.ip)[key.get_name()] == key


@pytest.mark.testbed
def test_unknown_or_wrong_host_key_is_refused(testbed: Testbed, tmp_path: Path) -> None:
    host, other = testbed.hosts[0], testbed.hosts[1]
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    proc = testbed.ssh_argv(host, "true", known_hosts=empty)
    res = subprocess.run(proc, capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 255 and "Host key verification failed" in res.stderr
    other_key = next(line for line in testbed.known_hosts.read_text().splitlines() if line.startswith(other.ip + " "))
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(other_key.replace(other.ip, host.ip, 1) + "\n")
    res = subprocess.run(testbed.ssh_argv(host, "true", wrong), capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr


@pytest.mark.testbed
def test_passwords_are_not_accepted(testbed: Testbed) -> None:
    host = testbed.hosts[0]
    argv = testbed.ssh_argv(host, "true")
    argv[1:1] = ["-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 255 and "Permission denied (publickey)" in res.stderr


@pytest.mark.testbed
def test_hosts_reach_each_other_over_the_bridge_and_nothing_else(testbed: Testbed) -> None:
    first, last = testbed.hosts[0], testbed.hosts[-1]
    hop = " ".join(testbed.ssh_argv(last, "hostname")[:-1]) + " hostname"
    assert testbed.ssh(first, hop).stdout.strip() == last.name
    routes = testbed.ssh(first, "ip route; ip -4 -o addr").stdout
    assert "default" not in routes
    assert f"{testbed.hosts[1].ip}\t{testbed.hosts[1].name}" in testbed.ssh(first, "cat /etc/hosts").stdout


@pytest.mark.testbed
def test_hosts_have_private_srv_etc_and_neutral_shell(testbed: Testbed) -> None:
    a, b = testbed.hosts[0], testbed.hosts[1]
    testbed.ssh(a, "echo only-on-a > /srv/models/marker")
    try:
        assert Path(a.srv_dir, "models", "marker").read_text() == "only-on-a\n"
        assert testbed.ssh(b, "ls /srv/models").stdout.strip() == ""
        conf_a = testbed.ssh(a, "cat /etc/hccn.conf").stdout
        conf_b = testbed.ssh(b, "cat /etc/hccn.conf").stdout
        assert f"address_0={a.npus[0]['ip']}" in conf_a and f"address_0={b.npus[0]['ip']}" in conf_b
        assert not Path("/etc/hccn.conf").exists()  # nothing leaked onto the machine itself
        env = testbed.ssh(a, "echo rc=$(wc -c < ~/.bashrc 2>/dev/null || echo none) pyenv=${PYENV_ROOT:-unset}")
        assert "pyenv=unset" in env.stdout and ("rc=0" in env.stdout or "rc=none" in env.stdout)
    finally:
        testbed.ssh(a, "rm -f /srv/models/marker")


@pytest.mark.testbed
def test_user_ssh_blocks_pin_every_host(testbed: Testbed) -> None:
    touched = testbed.state.ssh.get("user_ssh_blocks")
    if not touched:
        pytest.skip("bed started with --no-user-ssh")
    config = (Path(touched["dir"]) / "config").read_text()
    assert config.startswith(userssh.BEGIN)
    assert all(h.ip in config.split(userssh.END)[0] for h in testbed.hosts)


@pytest.mark.testbed
@pytest.mark.parametrize("index", [0, -1], ids=["first", "last"])
def test_docker_api_over_ssh_pulls_runs_execs_and_removes(
    testbed: Testbed, testbed_docker: Callable[[HostState | str], Any], index: int
) -> None:
    host = testbed.hosts[index]
    client = testbed_docker(host)
    assert client.ping()
    by_tag = client.images.pull(testbed.image_ref)
    by_digest = client.images.pull(testbed.image_ref_by_digest)
    assert by_tag.id == by_digest.id
    assert testbed.image_ref_by_digest in by_tag.attrs["RepoDigests"]
    name = f"k3tb-selftest-{host.name}"
    container = client.containers.run(
        testbed.image_ref,
        ["sh", "-c", "hostname; ip -4 -o addr show eth0; echo ready; exec sleep 300"],
        name=name,
        network_mode="host",
        detach=True,
    )
    try:
        wait_for("container log", lambda: b"ready" in container.logs())
        logs = container.logs().decode()
        assert logs.splitlines()[0] == host.name and f"{host.ip}/24" in logs  # lands in the host's netns
        code, _out = container.exec_run(["cat", "/etc/hostname"])
        assert code == 0
        assert container.exec_run(["hostname"]).output.decode().strip() == host.name
        container.stop(timeout=1)
        container.reload()
        assert container.status == "exited"
    finally:
        container.remove(force=True)
    assert name not in [c.name for c in client.containers.list(all=True)]


@pytest.mark.testbed
def test_the_bed_check_names_a_container_and_a_fault_left_behind(
    testbed: Testbed, testbed_docker: Callable[..., Any], testbed_faults: FaultInjector
) -> None:
    """What `testbed_left_as_found` reads after each module of bed tests: a left container and a left NPU fault
    are named with their host; once removed and healed, nothing is."""
    from testbed.pytest_plugin import bed_snapshot, snapshot_changes

    before = bed_snapshot(testbed)
    client = testbed_docker("node1")
    container = client.containers.run(testbed.image_ref, ["sleep", "300"], name="k3tb-left-behind", detach=True)
    try:
        testbed_faults.set("node2", {"npus": {"3": {"health": "Alarm"}}})
        changes = snapshot_changes(before, bed_snapshot(testbed))
        assert changes == [
            "node1: containers left behind: k3tb-left-behind",
            "node2: NPU faults {} became {'npus': {'3': {'health': 'Alarm'}}}",
        ]
    finally:
        container.remove(force=True)
        testbed_faults.clear()
    assert snapshot_changes(before, bed_snapshot(testbed)) == []


@pytest.mark.testbed
def test_every_host_pulls_the_image_by_digest(testbed: Testbed, testbed_docker: Callable[..., Any]) -> None:
    ids = {testbed_docker(h).images.pull(testbed.image_ref_by_digest).id for h in testbed.hosts}
    assert ids == {testbed.state.image["id"]}


@pytest.mark.testbed
def test_npu_simulators_show_16_healthy_npus_on_every_host(testbed: Testbed) -> None:
    loop = "for i in $(seq 0 15); do hccn_tool -i $i -link -g; hccn_tool -i $i -net_health -g; done"
    for host in testbed.hosts:
        info = testbed.ssh(host, "npu-smi info").stdout
        assert len(CHIP_ROW.findall(info)) == 16
        out = testbed.ssh(host, loop).stdout
        assert out.count("link status: UP") == 16 and out.count("net health status: Success") == 16
    peer = testbed.hosts[-1].npus[0]
    ping = testbed.ssh(testbed.hosts[0], f"hccn_tool -i 0 -hccs_ping -g address {peer['vnic_ip']}").stdout
    assert "3 packets transmitted, 3 received, 0.00% packets loss" in ping


@pytest.mark.testbed
def test_injected_faults_are_seen_on_that_host_only(testbed: Testbed, testbed_faults: FaultInjector) -> None:
    sick, healthy, peer = testbed.hosts[0], testbed.hosts[1], testbed.hosts[-1]
    testbed_faults.set(sick, {"link_down": [3], "missing_npus": [15], "tls_switch": 1, "ping_loss": [peer.name]})
    assert testbed.ssh(sick, "hccn_tool -i 3 -link -g").stdout == "link status: DOWN\n"
    assert testbed.ssh(healthy, "hccn_tool -i 3 -link -g").stdout == "link status: UP\n"
    assert len(CHIP_ROW.findall(testbed.ssh(sick, "npu-smi info").stdout)) == 15
    gone = testbed.ssh(sick, "hccn_tool -i 15 -ip -g", check=False)
    assert gone.returncode != 0 and gone.stdout == ""
    assert "tls switch[1]" in testbed.ssh(sick, "hccn_tool -i 0 -tls -g | grep switch").stdout
    ping = testbed.ssh(sick, f"hccn_tool -i 0 -ping -g address {peer.npus[0]['ip']}").stdout
    assert "3 packets transmitted, 0 received, 100.00% packet loss" in ping
    testbed_faults.set(healthy, {"net_health": [2]}, via_ssh=True)
    assert testbed.ssh(healthy, "hccn_tool -i 2 -net_health -g").stdout == "net health status: Fault\n"
    testbed_faults.clear()
    assert testbed.ssh(sick, "hccn_tool -i 3 -link -g").stdout == "link status: UP\n"


def test_user_ssh_blocks_are_added_and_removed_exactly(tmp_path: Path) -> None:
    d = tmp_path / ".ssh"
    d.mkdir()
    (d / "config").write_text("Host *\n    ServerAliveInterval 30\n")
    touched = userssh.install(["Host 10.213.0.10", "    User root"], ["10.213.0.10 ssh-ed25519 AAAA"], d)
    config = (d / "config").read_text()
    assert config.startswith(userssh.BEGIN) and config.endswith("Host *\n    ServerAliveInterval 30\n")
    userssh.install(["Host 10.213.0.11"], ["10.213.0.11 ssh-ed25519 BBBB"], d)  # replaces, never duplicates
    assert (d / "config").read_text().count(userssh.BEGIN) == 1
    userssh.remove(touched)
    assert (d / "config").read_text() == "Host *\n    ServerAliveInterval 30\n"
    assert not (d / "known_hosts").exists()  # created by the bed, so removed by it


@pytest.mark.testbed
def test_the_a3_docker_run_devices_and_mounts_work_on_a_host(
    testbed: Testbed, testbed_docker: Callable[[HostState | str], Any]
) -> None:
    """The seed's `docker run` flags (--device davinci*, driver/npu-smi mounts, --shm-size) are accepted."""
    host = testbed.hosts[0]
    client = testbed_docker(host)
    client.images.pull(testbed.image_ref_by_digest)
    devices = [f"/dev/davinci{i}" for i in range(16)] + ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    mounts = ["/usr/local/dcmi", "/usr/local/Ascend/driver", "/usr/local/bin/npu-smi", "/etc/ascend_install.info"]
    out = client.containers.run(
        testbed.image_ref_by_digest,
        ["sh", "-c", "ls /dev/davinci15 /usr/local/Ascend/driver/version.info /srv/models && df -m /dev/shm"],
        devices=[f"{d}:{d}:rwm" for d in devices],
        volumes={**{m: {"bind": m, "mode": "ro"} for m in mounts}, host.model_root: {"bind": host.model_root}},
        network_mode="host",
        shm_size="1g",
        remove=True,
    ).decode()
    assert "/dev/davinci15" in out and "version.info" in out
    assert re.search(r"\s1024\s", out)  # the 1 GiB shm
