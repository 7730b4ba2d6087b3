"""Building the image from a vllm-ascend revision on the build host (seed 4.2): the shell commands.

The build runs with the engine's CLI on the build host, where the checkout is: the SDK would have
to upload the whole context from here.
"""

from __future__ import annotations

import hashlib
import re
import shlex

from k3deploy.blocks.image import ImageBuild
from k3deploy.core.errors import K3DeployError

WORK_ROOT = "/var/tmp/k3deploy-build"
COMMIT = re.compile(r"[0-9a-f]{7,40}")


class UnreadableCheckout(K3DeployError, ValueError):
    """The checkout did not report a source commit and a VLLM_COMMIT; the message says which."""


def work_dir(build: ImageBuild) -> str:
    """One checkout folder per (repository, revision), so a rerun reuses nothing stale from another."""
    key = hashlib.sha256(f"{build.repo_url}\0{build.revision}".encode()).hexdigest()[:12]
    return f"{WORK_ROOT}/{key}"


def checkout_command(build: ImageBuild) -> str:
    """Fresh clone with submodules at the revision; prints the resolved commit and the pinned vLLM commit."""
    work = shlex.quote(work_dir(build))
    commit_file = shlex.quote(build.vllm_commit_file)
    return " && ".join(
        [
            "set -e",
            f"rm -rf {work}",
            f"mkdir -p {shlex.quote(WORK_ROOT)}",
            f"git clone --quiet --recurse-submodules {shlex.quote(build.repo_url)} {work}",
            f"git -C {work} checkout --quiet {shlex.quote(build.revision)}",
            f"git -C {work} submodule update --quiet --init --recursive",
            f'echo "source_revision=$(git -C {work} rev-parse HEAD)"',
            f'echo "vllm_commit=$(tr -d "[:space:]" < {work}/{commit_file})"',
        ]
    )


def parse_checkout(output: str) -> tuple[str, str]:
    """(source revision, VLLM_COMMIT) from checkout_command's output; UnreadableCheckout names what is wrong."""
    values = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    source, vllm = values.get("source_revision", ""), values.get("vllm_commit", "")
    if not COMMIT.fullmatch(source):
        raise UnreadableCheckout(f"the checkout reported no commit: {source!r}")
    if not vllm or not re.fullmatch(r"[0-9A-Za-z._/-]+", vllm):
        raise UnreadableCheckout(f"the VLLM_COMMIT file holds {vllm!r}, not a commit or tag")
    return source, vllm


def build_command(build: ImageBuild, vllm_commit: str, source_revision: str) -> list[str]:
    work = work_dir(build)
    return [
        "docker",
        "build",
        "--file",
        f"{work}/{build.dockerfile}",
        "--build-arg",
        f"VLLM_COMMIT={vllm_commit}",
        "--label",
        f"org.opencontainers.image.revision={source_revision}",
        "--label",
        f"org.opencontainers.image.source={build.repo_url}",
        "--tag",
        build.tag,
        work,
    ]


def push_commands(tag: str, repository: str) -> str:
    """Tag for the registry and push; the engine prints the pushed digest."""
    target = f"{repository}:{tag.rpartition(':')[2] or 'latest'}"
    return f"docker tag {shlex.quote(tag)} {shlex.quote(target)} && docker push {shlex.quote(target)}"


def cleanup_command(build: ImageBuild) -> str:
    return f"rm -rf {shlex.quote(work_dir(build))}"
