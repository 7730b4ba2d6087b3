"""`pip install .` (not editable) into a fresh virtual environment claims only the name `k3deploy`."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging
ROOT = Path(__file__).parents[2]


def sh(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_a_plain_install_claims_only_k3deploy_and_its_cli_runs(tmp_path):
    # The dependencies come from this interpreter's site-packages; k3deploy itself is built from the checkout.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # This interpreter may itself be a virtual environment (.venv/): its site-packages, added as plain paths
    # (their .pth files, among them the checkout's editable hook, are not run), come after the new env's own.
    own = sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).stdout.strip()
    Path(own, "test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = sh(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", ROOT, cwd=tmp_path)
    assert install.returncode == 0, install.stderr

    probe = (
        "import importlib.util, k3deploy, k3deploy.flows.validate, k3deploy.tasks.watch.logwatch as lw;"
        "print(k3deploy.__file__);"
        "print(lw.DEFAULT_PATTERNS.exists());"
        "print([n for n in ('tasks', 'flows', 'blocks', 'deployments') if importlib.util.find_spec(n)])"
    )
    out = sh(python, "-c", probe, cwd=tmp_path)  # not the repository folder: nothing of the checkout on sys.path
    assert out.returncode == 0, out.stderr
    location, patterns, claimed = out.stdout.splitlines()
    assert location.startswith(str(env_dir)), location  # the installed copy, not the checkout
    assert patterns == "True"  # package data (the fatal-line patterns) came along
    assert claimed == "[]"
    for name in ("tasks", "flows", "blocks", "deployments"):
        assert sh(python, "-c", f"import {name}", cwd=tmp_path).returncode != 0

    cli = sh(env_dir / "bin" / "k3deploy", "plan", "-c", ROOT / "configs" / "local.yaml", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "--headless" in cli.stdout
