"""Re-record the comm stage's test data from the test bed's simulators (over SSH, as the stage runs them).

    python -m tests.data.comm.record        # needs a running bed: python -m testbed up

Writes one file per output beside this script and `recorded.json` (command, host, faults,
exit code per file). Faults are injected on one host and cleared again afterwards.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from k3deploy.tasks.batch import render_script
from k3deploy.tasks.comm.checks import HCCN_QUERIES
from k3deploy.tasks.comm.runner import phase1_sections
from k3deploy.tasks.node_facts import ToolPaths
from testbed.layout import load_state, resolve_state_file

HERE = Path(__file__).parent
TOKEN = "recorded0001"  # fixed token of the recorded batch outputs
NPU = 3
FAULTS = {  # on node1 for the faulty recordings: one of each kind, on different NPUs
    "link_down": [3],
    "net_health": {"5": "Socket fail"},
    "tls_switch": {"7": 1},
    "missing_npus": [15],
    "health": {"9": "Critical"},
    "ping_loss": {"node2": 1.0, "node3": 0.34},
}
H, S = ToolPaths().hccn_tool, ToolPaths().npu_smi


def hccn(npu: int, query: str, *tail: str) -> str:
    return shlex.join([H, "-i", str(npu), f"-{query}", "-g", *tail])


def spod(npu: int) -> str:
    return shlex.join([S, "info", "-t", "spod-info", "-i", str(npu // 2), "-c", str(npu % 2)])


def healthy_singles() -> dict[str, str]:
    """File name → command of every single-command recording on a healthy node1 (NPU 3)."""
    return {
        "npu_smi_info": f"{S} info",
        **{q: hccn(NPU, q) for q in HCCN_QUERIES},
        "spod_info": spod(NPU),
        "hccn_conf": "cat /etc/hccn.conf",
        "ip_link": "ip -o link show",
        "ip_addr": "ip -o addr show",
        "version_info": "cat /usr/local/Ascend/driver/version.info",
        "board_info": f"{S} info -t board -i 0 -c 0",
        "ping_node2": hccn(NPU, "ping", "address", f"10.213.{64 + NPU}.12"),
        "hccs_ping_node2": hccn(NPU, "hccs_ping", "address", f"10.213.{96 + NPU}.12"),
    }


def faulty_singles() -> dict[str, str]:
    """File name → command on node1 with FAULTS: each shows one fault."""
    return {
        "npu_smi_info": f"{S} info",  # NPU 15 absent, board 4 (NPU 9) Critical
        "link_npu3": hccn(3, "link"),
        "ping_npu3_node2": hccn(3, "ping", "address", "10.213.67.12"),  # from a DOWN link
        "hccs_ping_npu3_node2": hccn(3, "hccs_ping", "address", "10.213.99.12"),
        "ping_npu4_node2": hccn(4, "ping", "address", "10.213.68.12"),  # 100 % loss
        "ping_npu4_node3": hccn(4, "ping", "address", "10.213.68.13"),  # 34 % loss
        "hccs_ping_npu4_node3": hccn(4, "hccs_ping", "address", "10.213.100.13"),
        "net_health_npu5": hccn(5, "net_health"),
        "tls_npu7": hccn(7, "tls"),
        "tls_npu8": hccn(8, "tls"),
        "lldp_npu15": hccn(15, "lldp"),
        "ip_npu15": hccn(15, "ip"),
        "spod_info_npu15": spod(15),
    }


def main() -> None:
    state = load_state(resolve_state_file())
    hosts = {h.name: h for h in state.hosts}
    ssh = ["ssh", "-F", state.ssh["config"]]
    index: dict[str, Any] = {}

    def record(name: str, host: str, command: str, faults: dict[str, Any]) -> None:
        proc = subprocess.run([*ssh, host, command], capture_output=True, text=True, timeout=120, check=False)
        (HERE / name).write_text(proc.stdout + proc.stderr)
        index[name] = {"host": host, "command": command, "rc": proc.returncode, "faults": faults}

    faults_file = Path(hosts["node1"].faults_file)
    try:
        for label, faults in (("healthy", {}), ("faulty", FAULTS)):
            faults_file.write_text(json.dumps(faults) + "\n")
            (HERE / label).mkdir(exist_ok=True)
            for name, command in (faulty_singles() if faults else healthy_singles()).items():
                record(f"{label}/{name}.txt", "node1", command, faults)
            batch = render_script(phase1_sections(16, ToolPaths()), TOKEN)
            record(f"{label}/phase1_node1.txt", "node1", batch, faults)
        ports = {"service_port": 8000, "rpc_port": 13345}
        record("healthy/phase1_node0.txt", "node0", render_script(phase1_sections(16, ToolPaths(), ports), TOKEN), {})
        record("healthy/ss_node0.txt", "node0", "ss -Hltn", {})
    finally:
        faults_file.write_text("{}\n")
    (HERE / "recorded.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
