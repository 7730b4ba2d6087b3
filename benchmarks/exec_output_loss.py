"""How often Podman's Docker-API exec hands back a lost answer, and what the sized read makes of it.

Why: a clean-clone CI run failed its bench stage with "the saved result is not JSON: Expecting value:
line 1 column 1" although `vllm bench serve` had exited 0: the `cat` of the saved result, run by exec
in node 0's container (the way DockerRuntime runs everything beside the server), came back empty.
This runs the same exec (exec_create + exec_start(stream=True), as DockerRuntime._exec) of a plain
`cat` and of the sized read (tasks/sized_read.py) on a bed host's Podman, interleaved, with busy
processes beside it as vLLM's were, and counts plain reads that did not return the file and sized
reads that had to be repeated or came back wrong.

    python3 -m testbed up --hosts 1
    python3 -m benchmarks.exec_output_loss [--reads 300] [--busy 3] [--host node0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from uuid import uuid4

import docker

from k3deploy.tasks.bench.steps import READ_ATTEMPTS
from k3deploy.tasks.sized_read import parse_sized, sized_read_command
from testbed.layout import load_state, resolve_state_file
from testbed.pytest_plugin import Testbed

IMAGE = "10.213.0.1:5000/k3deploy/testimg:1"
PATH = "/tmp/k3d-exec-loss/result.json"


def exec_output(api: docker.APIClient, container: str, command: str) -> str:
    exec_id = api.exec_create(container, ["sh", "-c", command])["Id"]
    return b"".join(api.exec_start(exec_id, stream=True)).decode(errors="replace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=300, help="reads of each kind")
    parser.add_argument("--busy", type=int, default=3, help="busy processes beside (0: a quiet machine)")
    parser.add_argument("--host", default="node0")
    args = parser.parse_args()

    host = Testbed.from_state(load_state(resolve_state_file(None))).host(args.host)
    client = docker.DockerClient(base_url=host.docker_url, timeout=120)
    name = f"k3d-exec-loss-{uuid4().hex[:6]}"
    text = json.dumps({"output_throughput": 12.5, "ttfts": [0.1] * 2000}) + "\n"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    container = client.containers.run(IMAGE, ["sleep", "3600"], name=name, detach=True)
    plain_lost = sized_repeated = sized_wrong = 0
    started = time.monotonic()
    try:
        write = f"mkdir -p /tmp/k3d-exec-loss && cat > {PATH} <<'EOF'\n{text}EOF"
        exec_output(client.api, name, write)
        assert parse_sized(exec_output(client.api, name, sized_read_command(PATH))) == text, "the file was not written"
        for i in range(args.reads):
            if exec_output(client.api, name, f"cat {PATH}") != text:
                plain_lost += 1
            got = parse_sized(exec_output(client.api, name, sized_read_command(PATH)))
            for _ in range(READ_ATTEMPTS - 1):  # what read_beside does
                if got is not None:
                    break
                sized_repeated += 1
                got = parse_sized(exec_output(client.api, name, sized_read_command(PATH)))
            sized_wrong += got != text  # None after every attempt counts as wrong: bench would have failed
            if (i + 1) % 50 == 0:
                print(f"{i + 1}/{args.reads} reads of each kind", file=sys.stderr)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait(timeout=30)
        container.remove(force=True)
        client.close()
    print(json.dumps({"host": args.host, "reads": args.reads, "busy": args.busy,
                      "plain_cat_not_the_file": plain_lost, "sized_reads_repeated": sized_repeated,
                      "sized_reads_wrong": sized_wrong, "seconds": round(time.monotonic() - started, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
