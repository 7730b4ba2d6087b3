"""The sized read: a file's text only when its size line and end marker both arrived and agree.

The command runs in a real shell here (`sh -c`, as the runtimes run it), so what the parser reads is what
the command prints; the lost and cut answers are the ones Podman's exec gave back (empty) or could.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from k3deploy.tasks.sized_read import parse_sized, sized_read_command

pytestmark = pytest.mark.bench


def shell(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("text", ['{"a": 1}\n', '{"a": 1}', "", "\n\n", 'k3deploy-end\n{"é": "x"}\n'])
def test_a_whole_answer_gives_the_file_back_exactly(tmp_path: Path, text: str):
    path = tmp_path / "result dir" / "r.json"  # a space: the path is quoted
    path.parent.mkdir()
    path.write_text(text)
    done = shell(sized_read_command(str(path)))
    assert done.returncode == 0
    assert parse_sized(done.stdout) == text


def test_lines_a_setup_script_prints_first_are_skipped(tmp_path: Path):
    path = tmp_path / "r.json"
    path.write_text('{"ok": true}\n')
    done = shell(f"echo 'set_env: ascend toolkit 8.3'; {sized_read_command(str(path))}")
    assert parse_sized(done.stdout) == '{"ok": true}\n'


def test_an_answer_lost_or_cut_on_the_way_is_not_the_file(tmp_path: Path):
    path = tmp_path / "r.json"
    path.write_text('{"output_throughput": 12.5}\n')
    whole = shell(sized_read_command(str(path))).stdout
    assert parse_sized(whole) is not None
    assert parse_sized("") is None  # what Podman's exec handed back
    assert parse_sized(whole[: len(whole) // 2]) is None  # cut before the end marker
    assert parse_sized(whole.replace("12.5", "12")) is None  # a byte lost in between
    assert parse_sized(whole.split("\n", 1)[1]) is None  # no size line


def test_a_missing_file_fails_the_command_and_prints_no_marker(tmp_path: Path):
    done = shell(sized_read_command(str(tmp_path / "absent.json")))
    assert done.returncode != 0
    assert parse_sized(done.stdout) is None
