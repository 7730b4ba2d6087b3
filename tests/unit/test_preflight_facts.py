"""Preflight's facts on recorded outputs: every builder, parser and judge, and faulty outputs of each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import paramiko
import pytest

from k3deploy.blocks.loader import parse_config
from k3deploy.tasks.batch import SectionOutput, parse_output
from k3deploy.tasks.preflight import facts as pf
from k3deploy.tasks.preflight.evaluate import NodeOutputs, evaluate, evaluate_node, one_machine_twice, table_row
from k3deploy.tasks.preflight.gather import node_sections
from k3deploy.tasks.transport.ssh import openssh_fingerprint
from tests.configs import site_data, with_changes

pytestmark = pytest.mark.preflight
DATA = Path(__file__).parents[1] / "data" / "preflight"
COMM = Path(__file__).parents[1] / "data" / "comm" / "healthy"
LOCAL, NODE0 = DATA / "local", DATA / "node0"
VERSION_INFO = (COMM / "version_info.txt").read_text()
BOARD_INFO = (COMM / "board_info.txt").read_text()
ENGINE = json.loads((NODE0 / "engine_version.json").read_text())
FACT = {f.name: f for f in pf.COMMAND_FACTS}


def cfg(**changes):
    """The reference deployment (seed mounts and devices, ports 8000 / 13345), model root /srv/models."""
    return parse_config(with_changes(site_data(), **{"cluster__model_root": "/srv/models", **changes}), "test")


def local_profile():
    return cfg(serve__container__mounts=[], serve__container__devices=[])


def text(path: Path) -> str:
    return path.read_text()


# -- builders --------------------------------------------------------------------------------------


def test_plain_builders():
    c = cfg()
    assert pf.os_cmd(c, 1) == ["cat", "/etc/os-release"]
    assert pf.kernel_cmd(c, 1) == ["uname", "-r"]
    assert pf.shm_cmd(c, 1) == ["df", "-PB1", "/dev/shm"]
    assert pf.driver_cmd(c, 1) == ["cat", "/usr/local/Ascend/driver/version.info"]
    assert pf.firmware_cmd(c, 1) == ["/usr/local/bin/npu-smi", "info", "-t", "board", "-i", "0", "-c", "0"]
    assert pf.free_space_cmd(c, 2)[-1] == "/srv/models" and pf.free_space_cmd(c, 2)[:2] == ["sh", "-c"]


def test_ports_are_read_on_node_0_only():
    assert pf.ports_cmd(cfg(), 0) == ["ss", "-Hltn"]
    assert [pf.ports_cmd(cfg(), i) for i in (1, 2, 3)] == [None, None, None]


def test_npu_facts_only_where_npu_devices_are_configured():
    assert pf.npus_configured(cfg()) and not pf.npus_configured(local_profile())
    assert pf.driver_cmd(local_profile(), 0) is None and pf.firmware_cmd(local_profile(), 0) is None
    other = cfg(serve__container__devices=["/dev/fuse"])
    assert pf.driver_cmd(other, 0) is None and pf.devices_cmd(other, 0)[-1] == "/dev/fuse"


def test_mount_and_device_paths_are_the_host_sides():
    c = cfg(serve__container__mounts=["/data:/data:ro", "named-volume:/cache", "/opt/x:/y"],
            serve__container__devices=["/dev/davinci0", "/dev/hisi_hdc:/dev/hisi_hdc:rwm"])  # fmt: skip
    assert pf.mount_paths(c) == ["/data", "/opt/x"]  # a named volume has no host path
    assert pf.device_paths(c) == ["/dev/davinci0", "/dev/hisi_hdc"]
    assert pf.mounts_cmd(c, 0)[-2:] == ["/data", "/opt/x"] and pf.mounts_cmd(c, 0)[3] == "sh"
    assert pf.mounts_cmd(local_profile(), 0) is None and pf.devices_cmd(local_profile(), 0) is None
    seed = cfg()
    assert len(pf.device_paths(seed)) == 19 and "/usr/local/bin/npu-smi" in pf.mount_paths(seed)


def test_sections_of_a_node_are_the_facts_that_apply():
    assert [s.key for s in node_sections(cfg(), 0)] == [f.name for f in pf.COMMAND_FACTS]
    assert "ports" not in [s.key for s in node_sections(cfg(), 1)]
    assert [s.key for s in node_sections(local_profile(), 0)] == ["os", "kernel", "model_root_free", "shm", "ports"]


def test_scripts_run_here_print_what_the_parsers_read(tmp_path: Path):
    """The two `sh -c` builders, run on this machine: nearest existing parent, and present / missing."""
    (tmp_path / "there").mkdir()
    out = subprocess.run(pf.free_space_argv(str(tmp_path / "not" / "yet")), capture_output=True, text=True)
    assert pf.parse_free_space(out.stdout, out.returncode)["path"] == str(tmp_path)
    paths = [str(tmp_path / "there"), str(tmp_path / "gone"), str(tmp_path / "with space")]
    (tmp_path / "with space").touch()
    out = subprocess.run(pf.present_argv(paths), capture_output=True, text=True)
    assert pf.parse_present(out.stdout, out.returncode) == {paths[0]: True, paths[1]: False, paths[2]: True}


# -- os and kernel ---------------------------------------------------------------------------------


def test_os_pretty_name():
    assert pf.parse_os(text(NODE0 / "os_release.txt"), 0) == "Debian GNU/Linux 12 (bookworm)"
    assert pf.parse_os(text(LOCAL / "os_release.txt"), 0) == "Debian GNU/Linux 12 (bookworm)"
    assert pf.parse_os("PRETTY_NAME=Unquoted\n", 0) == "Unquoted"


@pytest.mark.parametrize(
    ("output", "rc", "why"),
    [
        (text(NODE0 / "os_release_missing.txt"), 1, "exited 1: cat: /etc/os-release.missing: No such file"),
        ("\n".join(text(NODE0 / "os_release.txt").splitlines()[1:]), 0, "no PRETTY_NAME line"),  # field missing
        ('PRETTY_NAME="Debian GNU/Li', 0, "No closing quotation"),  # cut short inside the value
        ('PRETTY_NAME=""\n', 0, "no PRETTY_NAME line"),
        ("", None, "did not finish"),
    ],
)
def test_os_faulty(output, rc, why):
    with pytest.raises(pf.Unreadable, match=why):
        pf.parse_os(output, rc)


def test_kernel_release():
    assert pf.parse_kernel(text(NODE0 / "uname_r.txt"), 0) == "6.18.44-fc-v657"
    for bad, rc in (("", 0), ("uname: extra operand\n", 1), ("Linux node0 6.1\n", 0), ("6.1\n", 124)):
        with pytest.raises(pf.Unreadable):
            pf.parse_kernel(bad, rc)


def test_read_facts_pass_with_their_value():
    assert pf.judge_read("6.18.44-fc-v657", cfg(), 0) == pf.Judgement(True, "6.18.44-fc-v657")


# -- driver and firmware (the comm stage's recordings of the bed's simulator) ----------------------


def test_driver_and_firmware_versions():
    assert pf.parse_driver(VERSION_INFO, 0) == "24.1.rc3.7"
    assert pf.parse_firmware(BOARD_INFO, 0) == "7.5.0.5.220"


def test_driver_and_firmware_faulty():
    with pytest.raises(pf.Unreadable, match=r"exited 1: cat: /usr/local/Ascend/driver/version\.info: No such"):
        pf.parse_driver("cat: /usr/local/Ascend/driver/version.info: No such file or directory\n", 1)
    with pytest.raises(pf.Unreadable, match="no Version= line"):
        pf.parse_driver(VERSION_INFO.replace("Version=", "Versoin="), 0)
    with pytest.raises(pf.Unreadable, match="no 'Firmware Version' line"):
        pf.parse_firmware(BOARD_INFO[: BOARD_INFO.index("Firmware")], 0)  # cut short before the line
    with pytest.raises(pf.Unreadable, match="timed out"):
        pf.parse_firmware(BOARD_INFO, 124)


def test_unreadable_driver_fails_naming_the_file():
    got = SectionOutput("driver", 1, "cat: /usr/local/Ascend/driver/version.info: No such file or directory")
    result = evaluate(FACT["driver"], cfg(), 2, "node2", got)
    assert (result.state, result.fact, result.node) == ("fail", "driver", "node2")
    assert result.detail.startswith("cannot read cat /usr/local/Ascend/driver/version.info: exited 1")


# -- free space and /dev/shm -----------------------------------------------------------------------


def test_free_space_at_the_model_root():
    value = pf.parse_free_space(text(NODE0 / "free_space.txt"), 0)
    assert value == {"path": "/srv/models", "filesystem": "/dev/vda", "bytes_total": 270553174016,
                     "bytes_available": 85110362112, "mount": "/srv"}  # fmt: skip
    verdict = pf.judge_free_space(value, cfg(), 0)
    assert verdict == pf.Judgement(True, "85.11 GB free at /srv/models, on /srv")


def test_free_space_of_the_nearest_parent_says_so():
    value = pf.parse_free_space(text(LOCAL / "free_space_parent.txt"), 0)
    assert (value["path"], value["mount"]) == ("/var/tmp", "/")
    detail = pf.judge_free_space(value, cfg(cluster__model_root="/var/tmp/k3deploy-preflight/models/none"), 0).detail
    assert detail == "85.11 GB free at /var/tmp (/var/tmp/k3deploy-preflight/models/none does not exist yet), on /"


def test_no_space_left_fails():
    value = pf.parse_free_space(text(NODE0 / "free_space.txt").replace(" 85110362112 ", " 0 "), 0)
    verdict = pf.judge_free_space(value, cfg(), 0)
    assert not verdict.ok and verdict.detail.startswith("no space left: 0 B free at /srv/models")


@pytest.mark.parametrize(
    ("output", "rc", "why"),
    [
        ("path /srv/models\n" + text(NODE0 / "df_missing_path.txt"), 1, "exited 1: path /srv/models"),
        ("path /srv/models\n", 0, "no df -PB1 data line"),  # cut short after the path line
        ("\n".join(text(NODE0 / "free_space.txt").splitlines()[:2]), 0, "no df -PB1 data line"),  # no data line
        (text(NODE0 / "free_space.txt").split("\n", 1)[1], 0, "no measured path"),  # path line missing
        (text(NODE0 / "free_space.txt").replace("22%", "").replace("/srv\n", "\n"), 0, "df line not understood"),
        (text(NODE0 / "free_space.txt")[:-30], 0, "df line not understood"),  # cut inside the data line
    ],
)
def test_free_space_faulty(output, rc, why):
    with pytest.raises(pf.Unreadable, match=why):
        pf.parse_free_space(output, rc)


def test_free_space_that_cannot_be_determined_fails_the_fact():
    got = SectionOutput("model_root_free", 0, "path /srv/models\n")
    result = evaluate(FACT["model_root_free"], cfg(), 0, "node0", got)
    assert result.state == "fail" and result.detail.startswith("cannot read df -PB1 /srv/models: no df -PB1 data")


def test_shm():
    value = pf.parse_shm(text(NODE0 / "df_shm.txt"), 0)
    assert (value["bytes_total"], value["mount"]) == (12638253056, "/dev/shm")
    assert pf.judge_shm(value, cfg(), 0) == pf.Judgement(True, "12.64 GB (12.64 GB free)")
    local = pf.parse_shm(text(LOCAL / "df_shm.txt"), 0)
    assert pf.judge_shm(local, cfg(), 0).ok and local["filesystem"] == "tmpfs"


def test_shm_faulty():
    with pytest.raises(pf.Unreadable, match="exited 1: df: /dev/shm: No such"):
        pf.parse_shm("df: /dev/shm: No such file or directory\n", 1)
    with pytest.raises(pf.Unreadable, match="no df -PB1 data line"):
        pf.parse_shm(text(NODE0 / "df_shm.txt").splitlines()[0], 0)
    on_root = pf.parse_shm(text(LOCAL / "df_shm.txt").replace("/dev/shm", "/"), 0)
    assert pf.judge_shm(on_root, cfg(), 0) == pf.Judgement(False, "/dev/shm is not a mount of its own (it is on /)")
    full = {**pf.parse_shm(text(NODE0 / "df_shm.txt"), 0), "bytes_available": 0}
    assert pf.judge_shm(full, cfg(), 0).detail == "/dev/shm is full: 0 B free of 12.64 GB"


def test_human_bytes():
    assert [pf.human_bytes(n) for n in (0, 999, 1000, 1_490_000_000_000, 10**16)] == [
        "0 B", "999 B", "1.00 kB", "1.49 TB", "10000.00 TB"]  # fmt: skip


# -- ports -----------------------------------------------------------------------------------------


def test_ports_free_on_the_recorded_node0():
    value = pf.parse_ports(text(NODE0 / "ss.txt"), 0)
    assert list(value) == [22]
    assert pf.judge_ports(value, cfg(), 0) == pf.Judgement(True, "service_port 8000 free, rpc_port 13345 free")
    assert pf.judge_ports(pf.parse_ports("", 0), cfg(), 0).ok  # nothing listening at all


def test_taken_port_fails_naming_it_and_the_listener():
    verdict = pf.judge_ports(pf.parse_ports(text(NODE0 / "ss_port_taken.txt"), 0), cfg(), 0)
    assert not verdict.ok
    assert verdict.detail == "service_port 8000 is taken: LISTEN 0      128        0.0.0.0:8000 0.0.0.0:*"
    rpc = pf.judge_ports(pf.parse_ports(text(NODE0 / "ss_port_taken.txt"), 0), cfg(serve__rpc_port=22), 0)
    assert rpc.detail.startswith("service_port 8000 is taken") and "; rpc_port 22 is taken: LISTEN" in rpc.detail


def test_ports_faulty():
    with pytest.raises(pf.Unreadable, match="exited 127: sh: ss: not found"):
        pf.parse_ports("sh: ss: not found\n", 127)
    with pytest.raises(pf.Unreadable, match="did not finish"):
        pf.parse_ports(text(NODE0 / "ss_port_taken.txt"), None)


# -- mounts and devices ----------------------------------------------------------------------------


def test_mounts_and_devices_present():
    mounts = pf.parse_present(text(NODE0 / "mounts_present.txt"), 0)
    c = cfg(serve__container__mounts=[f"{p}:{p}" for p in mounts])
    assert pf.judge_mounts(mounts, c, 0) == pf.Judgement(True, "all 3 present")
    devices = pf.parse_present(text(NODE0 / "devices_present.txt"), 0)
    c = cfg(serve__container__devices=list(devices))
    assert pf.judge_devices(devices, c, 0) == pf.Judgement(True, "all 4 present")


def test_missing_mount_path_fails_naming_the_path():
    value = pf.parse_present(text(NODE0 / "mounts_one_missing.txt"), 0)
    c = cfg(serve__container__mounts=[f"{p}:{p}" for p in value])
    verdict = pf.judge_mounts(value, c, 0)
    assert verdict == pf.Judgement(False, "missing mount path: /opt/k3deploy-preflight-missing")


def test_paths_cut_short_are_not_taken_as_present():
    full = text(NODE0 / "devices_present.txt")
    value = pf.parse_present(full[: full.index("/dev/davinci15") + 5], 0)  # cut inside the second line
    c = cfg(serve__container__devices=["/dev/davinci0", "/dev/davinci15", "/dev/davinci_manager"])
    verdict = pf.judge_devices(value, c, 0)
    assert not verdict.ok
    assert verdict.detail == "not reported (output cut short?): /dev/davinci15, /dev/davinci_manager"
    with pytest.raises(pf.Unreadable, match="exited 2"):
        pf.parse_present(full, 2)


# -- engine ----------------------------------------------------------------------------------------


def test_engine_version_from_the_recorded_podman_answer():
    value = pf.parse_engine(ENGINE)
    assert value == {"name": "Podman Engine", "version": "4.3.1", "api_version": "1.41",
                     "components": ["Podman Engine", "Conmon", "OCI Runtime (runc)"]}  # fmt: skip
    assert pf.judge_engine(value, cfg(), 0) == pf.Judgement(True, "Podman Engine 4.3.1 (API 1.41)")
    bare = {k: v for k, v in ENGINE.items() if k != "Components"}
    assert pf.parse_engine(bare)["name"] == "Engine" and pf.parse_engine(bare)["components"] == []


@pytest.mark.parametrize("missing", ["Version", "ApiVersion"])
def test_engine_answer_missing_a_field(missing):
    with pytest.raises(pf.Unreadable, match="lacks Version or ApiVersion"):
        pf.parse_engine({k: v for k, v in ENGINE.items() if k != missing})
    with pytest.raises(pf.Unreadable):
        pf.parse_engine({**ENGINE, missing: ""})


def test_engine_is_asked_only_for_the_docker_runtime():
    assert pf.engine_applies(cfg())


# -- host keys -------------------------------------------------------------------------------------


def test_fingerprint_as_ssh_keygen_prints_it():
    import base64

    _, _, blob = text(NODE0 / "known_hosts.txt").split()
    expected = text(NODE0 / "ssh_keygen_lf.txt").split()[1]
    assert openssh_fingerprint(base64.b64decode(blob)) == expected
    assert not expected.endswith("=") and expected.startswith("SHA256:")
    assert openssh_fingerprint(base64.b64decode(blob)[:-1]) != expected


# -- a whole node ----------------------------------------------------------------------------------


def recorded_node0() -> NodeOutputs:
    """node0 as gathered on the bed: the recorded batch of node_sections, host key and engine answer."""
    sections = node_sections(cfg(), 0)
    parsed = parse_output(sections, text(NODE0 / "batch.txt"), "recorded0001")
    fingerprint = text(NODE0 / "ssh_keygen_lf.txt").split()[1]
    return NodeOutputs("node0", fingerprint, "ssh-ed25519", sections=parsed, engine=ENGINE)


def test_recorded_node0_passes_every_fact_with_a_cell_each():
    results = evaluate_node(cfg(), 0, recorded_node0())
    assert [r.fact for r in results] == list(pf.FACT_NAMES)
    assert [(r.fact, r.state) for r in results if r.state != "ok"] == []
    row = table_row("node0", results)
    assert list(row) == ["node", *pf.FACT_NAMES]
    assert row["ssh"] == "ssh-ed25519 SHA256:GX78FC6FTNfaEri7YItlCttYls0UW8TLXI0Ck1aPcf8"
    assert row["driver"] == "24.1.rc3.7" and row["firmware"] == "7.5.0.5.220"
    assert row["devices"] == "all 19 present" and row["ports"] == "service_port 8000 free, rpc_port 13345 free"


def test_a_section_cut_short_fails_that_fact_only():
    got = recorded_node0()
    del got.sections["shm"]
    results = {r.fact: r for r in evaluate_node(cfg(), 0, got)}
    assert results["shm"].state == "fail" and "cut short" in results["shm"].detail
    assert [f for f, r in results.items() if not r.ok] == ["shm"]


def test_ports_held_by_a_server_of_k3deploys_own_pass_naming_it_and_anyone_elses_fail():
    """A `--keep-serving` run's server, or a tune cell's left by a killed tune: launch adopts or refuses it by
    name, so preflight passes the port it holds. Taken ports with no server of ours running still fail."""
    got = recorded_node0()
    got.sections["ports"] = SectionOutput("ports", 0, text(NODE0 / "ss_port_taken.txt"))
    taken = {r.fact: r for r in evaluate_node(cfg(), 0, got)}["ports"]
    assert taken.state == "fail" and taken.detail.startswith("service_port 8000 is taken: LISTEN")
    got.own_servers = ["vllm-kimi-k3-node0"]
    held = {r.fact: r for r in evaluate_node(cfg(), 0, got)}["ports"]
    assert held.state == "ok" and held.value == taken.value
    assert held.detail.startswith("service_port 8000 held by k3deploy's own vllm-kimi-k3-node0: launch adopts")
    got.own_servers = []  # read, and none of ours runs: someone else's listener
    assert {r.fact: r for r in evaluate_node(cfg(), 0, got)}["ports"].state == "fail"
    got.sections["ports"] = SectionOutput("ports", 0, text(NODE0 / "ss.txt"))
    got.own_servers = ["vllm-kimi-k3-node0"]  # running, but on other ports: the wanted ones are simply free
    assert {r.fact: r for r in evaluate_node(cfg(), 0, got)}["ports"].detail == (
        "service_port 8000 free, rpc_port 13345 free"
    )


def test_other_nodes_show_ports_not_applicable():
    results = {r.fact: r for r in evaluate_node(cfg(), 1, recorded_node0())}
    assert results["ports"].state == "n/a" and results["ports"].cell == "n/a (node 0 only)"
    assert not results["ports"].judged


def test_unreachable_node_fails_ssh_and_reads_nothing_else():
    got = NodeOutputs("node2", ssh_error="host key CHANGED for 10.213.0.12: …")
    results = evaluate_node(cfg(), 2, got)
    assert [(r.fact, r.state) for r in results if r.judged] == [("ssh", "fail")]
    assert results[0].detail.startswith("host key CHANGED") and results[0].cell.startswith("FAIL: host key")
    assert {r.state for r in results[1:]} == {"not read"}
    assert list(table_row("node2", results)) == ["node", *pf.FACT_NAMES]


def test_failed_script_fails_each_fact_it_held():
    got = NodeOutputs("node1", "SHA256:x", batch_error="the facts script did not finish within 60s")
    results = {r.fact: r for r in evaluate_node(cfg(), 1, got)}
    failed = sorted(f for f, r in results.items() if r.state == "fail")
    assert failed == sorted(s.key for s in node_sections(cfg(), 1))
    assert results["os"].detail == "not read: the facts script did not finish within 60s"
    assert results["engine"].state == "not read"  # asked apart from the script; here no answer was gathered


def test_engine_error_and_bad_answer():
    got = recorded_node0()
    got.engine, got.engine_error = None, "ConnectionFault: no Docker API over SSH"
    engine = {r.fact: r for r in evaluate_node(cfg(), 0, got)}["engine"]
    assert (engine.state, engine.detail) == ("fail", "no Docker API answer: ConnectionFault: no Docker API over SSH")
    got.engine, got.engine_error = {"Version": "1"}, None
    engine = {r.fact: r for r in evaluate_node(cfg(), 0, got)}["engine"]
    assert engine.state == "fail" and "lacks Version or ApiVersion" in engine.detail


def test_local_profile_leaves_npu_facts_and_paths_not_applicable():
    got = NodeOutputs("local0", pf.LOCAL_HOST_KEY)
    results = {r.fact: r for r in evaluate_node(local_profile(), 0, got)}
    assert {f for f, r in results.items() if r.state == "n/a"} == {"driver", "firmware", "mounts", "devices"}
    assert results["ssh"].cell == "local (no SSH)"


def test_two_nodes_with_one_host_key_are_one_machine_and_both_are_named():
    """An address and its alias listed as two nodes: the same host key twice. Their ranks would share one
    machine's NPUs; both nodes fail, each naming the other. Local nodes (no SSH, one machine by design) do not."""
    a, b = (openssh_fingerprint(paramiko.RSAKey.generate(1024).asbytes()) for _ in range(2))
    found = one_machine_twice({"node0": a, "node1": a, "node2": b, "node3": b}, pf.LOCAL_HOST_KEY)
    assert found["node0"].startswith(f"the same host key as node1 ({a})") and "node0" in found["node1"]
    assert set(found) == {"node0", "node1", "node2", "node3"}
    assert one_machine_twice({"node0": a, "node1": b}, pf.LOCAL_HOST_KEY) == {}
    assert one_machine_twice({"local0": pf.LOCAL_HOST_KEY, "local1": pf.LOCAL_HOST_KEY}, pf.LOCAL_HOST_KEY) == {}
