"""The documentation: the README a newcomer reads first stays short, and the site built from docs/ with MkDocs in
strict mode (a broken link, a missing anchor or a page left out of the navigation fails), its start page drawn
by a real headless Chromium (the screenshot kept in test-artifacts/ for a person to look at)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.docs, pytest.mark.anywhere]
ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return [page for entry in config["nav"] for page in entry.values()]


def build(site: Path, docs: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict`; with `docs`, from a copy of the docs folder instead of the repository's."""
    config = ROOT / "mkdocs.yml"
    if docs is not None:
        data = yaml.safe_load(config.read_text()) | {"docs_dir": str(docs)}
        config = site.parent / "mkdocs.yml"
        config.write_text(yaml.safe_dump(data))
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir",
                           str(site)], capture_output=True, text=True, env=env, timeout=300, check=False)  # fmt: skip


def test_the_readme_is_short_and_gives_the_two_commands_and_the_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "\nbash .ci/run\n" in readme and "&& k3deploy run -c configs/local.yaml\n" in readme
    for page in nav_pages():
        assert f"docs/{page}" in readme or page == "index.md", f"the README does not say where {page} is"


def test_the_site_builds_strictly_with_every_page_and_its_start_page_is_drawn(tmp_path):
    site = tmp_path / "site"
    built = build(site)
    assert built.returncode == 0, built.stdout + built.stderr
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md")) == sorted(nav_pages())  # every page navigable
    for page in nav_pages():
        html = site / ("index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html")
        assert html.exists(), page
    start = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in start  # readable offline
    if CHROMIUM is None:
        pytest.skip("needs chromium (apt install chromium; .ci/run installs it)")
    from PIL import Image

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "docs-start-page.png"
    shot.unlink(missing_ok=True)
    command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,1600",
               (site / "index.html").as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert shot.exists(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert image.size == (1280, 1600) and len(colours) > 50  # a header, a navigation and text: not a blank page


@pytest.mark.parametrize(
    ("fault", "said"),
    [("left out of the navigation", "scratch.md"), ("a broken link", "nowhere.md"), ("a missing anchor", "#nowhere")],
)
def test_a_page_left_out_a_broken_link_or_a_missing_anchor_fails_the_build(tmp_path, fault, said):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    if fault == "left out of the navigation":
        (docs / "scratch.md").write_text("# Scratch\n")
    else:
        with (docs / "bisect.md").open("a") as page:
            page.write("\n[there](nowhere.md)\n" if said == "nowhere.md" else "\n[there](tune.md#nowhere)\n")
    built = build(tmp_path / "site", docs)
    assert built.returncode != 0 and said in built.stdout + built.stderr, built.stdout + built.stderr
