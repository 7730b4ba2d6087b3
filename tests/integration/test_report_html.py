"""The HTML report rendered by a real headless Chromium: the page loads and its plots are drawn.

The report comes from the REAL recorded history (tests/data/history); the screenshot is kept in
test-artifacts/ (gitignored) for a person to look at, and checked here to be far from blank: the
plot lines' colour and the baseline band's are painted in quantity.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from k3deploy.records.charts import BAND, COLOURS
from k3deploy.records.history import RegressionVerdict
from k3deploy.records.record import RunRecord, write_record
from k3deploy.records.run_report import REPORT_HTML, REPORT_MD, write_report_files

pytestmark = [pytest.mark.report, pytest.mark.anywhere]
ROOT = Path(__file__).parents[2]
HISTORY = ROOT / "tests" / "data" / "history" / "local-cpu"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, RunRecord]:
    """A runs store holding the recorded history; the regressed run is the one reported."""
    records = [RunRecord.model_validate_json(p.read_text()) for p in sorted(HISTORY.glob("*.json"))]
    for record in records:
        write_record(record, tmp_path)
    changed = next(r for p, r in zip(sorted(HISTORY.glob("*.json")), records, strict=True) if "-changed" in p.name)
    return tmp_path, changed


def test_the_markdown_and_html_carry_verdicts_tables_and_links(store):
    root, record = store
    comparison, links, md = write_report_files(record, root)
    assert comparison.verdict is RegressionVerdict.REGRESSED
    assert "Regression verdict: **REGRESSED**" in md and "config serve.max_num_seqs: 4 → 1" in md
    assert "| bench | pass |" in md and "random" in md and links["run record"] in md
    page = (root / record.run_id / REPORT_HTML).read_text()
    assert page.count("<svg") >= 4 and "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")
    assert (root / record.run_id / REPORT_MD).read_text() == md


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt install chromium; .ci/run installs it)")
def test_headless_chromium_draws_the_report_with_its_plots(store, tmp_path):
    from PIL import Image

    root, record = store
    write_report_files(record, root)
    page = (root / record.run_id / REPORT_HTML).resolve()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    shot.unlink(missing_ok=True)
    command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,3000",
               page.as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert shot.exists(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 3000)
    counts = {colour: n for n, colour in image.getcolors(maxcolors=1 << 20)}
    assert len(counts) > 50  # text, tables and plots, not a blank page
    line = sum(n for colour, n in counts.items() if _near(colour, rgb(COLOURS[0])))
    band = sum(n for colour, n in counts.items() if _near(colour, rgb(BAND)))
    assert line > 500, f"plot lines: {line} pixels"
    assert band > 5000, f"baseline bands: {band} pixels"


def _near(a: tuple[int, int, int], b: tuple[int, int, int], tolerance: int = 12) -> bool:
    return all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True))
