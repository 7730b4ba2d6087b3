"""Re-record preflight's test data: the real commands, on this machine and on bed host node0 over SSH.

    python -m tests.data.preflight.record        # needs a running bed: python -m testbed up

Writes one file per output beside this script (stdout and stderr together, as the batch
captures them), `recorded.json` (command, where, when, exit code per file) and README.md.
A listener on node0's service port is started for the `ss` recording and stopped again.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k3deploy.blocks.loader import parse_config
from k3deploy.tasks.batch import render_script
from k3deploy.tasks.preflight import facts as pf
from k3deploy.tasks.preflight.gather import engine_version, node_sections
from k3deploy.tasks.transport import LocalTransport, SSHTransport
from k3deploy.tasks.transport.base import Transport
from testbed.layout import load_state, resolve_state_file
from testbed.pytest_plugin import Testbed
from tests.bedconfig import bed_config

HERE = Path(__file__).parent
TOKEN = "recorded0001"  # fixed token of the recorded batch output
PORT = 8000  # the reference config's service_port
LISTENER = (
    "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    f"s.bind(('0.0.0.0', {PORT})); s.listen(); time.sleep(120)"
)
MISSING = "/opt/k3deploy-preflight-missing"


def free_space(path: str) -> str:
    return shlex.join(pf.free_space_argv(path))


def present(paths: list[str]) -> str:
    return shlex.join(pf.present_argv(paths) or [])


COMMON = {
    "os_release": "cat /etc/os-release",
    "uname_r": "uname -r",
    "df_shm": "df -PB1 /dev/shm",
    "ss": "ss -Hltn",
    "df_missing_path": f"df -PB1 {MISSING}",
    "os_release_missing": "cat /etc/os-release.missing",
}
LOCAL = {
    **COMMON,
    "free_space_parent": free_space("/var/tmp/k3deploy-preflight/models/none"),
}
NODE0 = {
    **COMMON,
    "free_space": free_space("/srv/models"),
    "free_space_parent": free_space("/srv/models/not-yet/there"),
    "mounts_present": present(["/usr/local/dcmi", "/usr/local/Ascend/driver", "/usr/local/bin/npu-smi"]),
    "mounts_one_missing": present(["/usr/local/dcmi", MISSING, "/etc/ascend_install.info"]),
    "devices_present": present(["/dev/davinci0", "/dev/davinci15", "/dev/davinci_manager", "/dev/hisi_hdc"]),
}


def now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def run(transport: Transport, command: str) -> tuple[int, str]:
    result = transport.run(f"{{ {command}; }} 2>&1", 30)
    return result.exit_code, result.stdout


def save(meta: dict[str, Any], name: str, text: str, command: str, where: str, rc: int) -> None:
    (HERE / name).write_text(text)
    meta[name] = {"command": command, "where": where, "when": now(), "rc": rc}


def record_commands(meta: dict[str, Any], transport: Transport, commands: dict[str, str], folder: str, where: str):
    (HERE / folder).mkdir(exist_ok=True)
    for name, command in commands.items():
        rc, text = run(transport, command)
        save(meta, f"{folder}/{name}.txt", text, command, where, rc)


def record_node0(meta: dict[str, Any], bed: Testbed) -> None:
    host = bed.host("node0")
    where = f"bed host node0 ({host.ip}) over SSH"
    node0 = SSHTransport(host.ip, name="node0", private_key_file=bed.key, known_hosts=bed.known_hosts)
    try:
        record_commands(meta, node0, NODE0, "node0", where)
        pid = node0.run(f"setsid nohup python3 -c {shlex.quote(LISTENER)} >/dev/null 2>&1 & echo $!", 10).stdout
        try:
            node0.run("sleep 0.5", 10)
            rc, text = run(node0, "ss -Hltn")
            save(meta, "node0/ss_port_taken.txt", text, f"ss -Hltn (listener on :{PORT})", where, rc)
        finally:
            node0.run(f"kill {int(pid)}", 10)
        cfg = parse_config(bed_config(bed, ["node0"]), "bed")
        sections = node_sections(cfg, 0)
        result = node0.run(render_script(sections, TOKEN, parallel=len(sections), section_timeout=20), 60)
        keys = ", ".join(s.key for s in sections)
        command = f"batch of node_sections(bed config, node 0): {keys}; token {TOKEN}"
        save(meta, "node0/batch.txt", result.stdout, command, where, result.exit_code)
        engine = engine_version(cfg, "node0")
        save(meta, "node0/engine_version.json", json.dumps(engine, indent=1) + "\n",
             "docker SDK DockerClient.version() over SSH", where, 0)  # fmt: skip
    finally:
        node0.close()
    line = next(x for x in bed.known_hosts.read_text().splitlines() if x.startswith(f"{host.ip} "))
    save(meta, "node0/known_hosts.txt", line + "\n", f"line of {bed.known_hosts} for {host.ip}", "this machine", 0)
    with tempfile.NamedTemporaryFile("w", suffix=".known_hosts") as f:
        f.write(line + "\n")
        f.flush()
        proc = subprocess.run(["ssh-keygen", "-lf", f.name], capture_output=True, text=True, check=False)
    save(meta, "node0/ssh_keygen_lf.txt", proc.stdout, "ssh-keygen -lf node0/known_hosts.txt", "this machine",
         proc.returncode)  # fmt: skip


README_HEAD = """# Preflight test data

Real outputs of the commands preflight runs, recorded by `python -m tests.data.preflight.record`
(needs a running test bed). `local/`: this machine (Debian 12, 2 cores, root), through
`LocalTransport`; `node0/`: bed host node0 over the SSH transport, as the stage reads it. Each
file is the command's stdout and stderr together (as the batch captures them). The same
table, as data, is `recorded.json`. NPU driver and firmware outputs are not here: the tests
use the comm stage's recordings (`tests/data/comm/healthy/version_info.txt`, `board_info.txt`,
recorded from the bed's npu-smi simulator; see `tests/data/comm/recorded.json`).

| file | command | where | when (UTC) | rc |
|---|---|---|---|---|
"""


def main() -> None:
    bed = Testbed.from_state(load_state(resolve_state_file()))
    meta: dict[str, Any] = {}
    record_commands(meta, LocalTransport("local"), LOCAL, "local", "this machine (LocalTransport)")
    record_node0(meta, bed)
    (HERE / "recorded.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    rows = [
        f"| `{name}` | `{m['command']}` | {m['where']} | {m['when']} | {m['rc']} |" for name, m in sorted(meta.items())
    ]
    (HERE / "README.md").write_text(README_HEAD + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
