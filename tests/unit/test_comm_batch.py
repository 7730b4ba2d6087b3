"""The batch script: many sections in one exec, split back per section, delimiters that cannot be faked."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from k3deploy.tasks.batch import MAX_SCRIPT, Section, parse_output, render_script
from k3deploy.tasks.comm.runner import phase1_sections
from k3deploy.tasks.node_facts import ToolPaths

pytestmark = pytest.mark.comm
DATA = Path(__file__).parents[1] / "data" / "comm"
TOKEN = "recorded0001"


def run_sh(script: str, shell: str = "sh") -> subprocess.CompletedProcess[str]:
    return subprocess.run([shell, "-c", script], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_sections_come_back_in_order_with_output_and_exit_code(shell: str, tmp_path: Path):
    sections = [
        Section("quoted", ("echo", "a b", "$(touch pwned)", "'q'")),
        Section("stderr", ("sh", "-c", "echo out; echo err >&2; exit 3")),
        Section("no-newline", ("printf", "x")),
        Section("empty", ("true",)),
        Section("missing", ("cat", str(tmp_path / "nope"))),
    ]
    proc = run_sh(render_script(sections, "tok12345", parallel=2), shell)
    got = parse_output(sections, proc.stdout, "tok12345")
    assert list(got) == [s.key for s in sections]
    assert got["quoted"].text == "a b $(touch pwned) 'q'\n" and got["quoted"].rc == 0
    assert not (Path.cwd() / "pwned").exists()
    assert got["stderr"].rc == 3 and got["stderr"].text.splitlines() == ["out", "err"]
    assert got["no-newline"].text == "x"
    assert got["empty"].text == "" and got["empty"].ok
    assert got["missing"].rc == 1 and "No such file" in got["missing"].text


def test_a_hung_section_is_killed_alone_and_the_rest_still_report():
    sections = [Section("hang", ("sleep", "30")), Section("fine", ("echo", "ok"))]
    proc = run_sh(render_script(sections, "tok12345", section_timeout=0.5))
    got = parse_output(sections, proc.stdout, "tok12345")
    assert got["hang"].rc == 124 and not got["hang"].ok
    assert got["fine"].text == "ok\n"


def test_temp_folder_is_removed(tmp_path: Path):
    script = render_script([Section("a", ("echo", "1"))], "tok12345")
    proc = subprocess.run(["sh", "-c", script], env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0 and "tok12345 END 0 0" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_output_cannot_fake_a_delimiter():
    sections = [Section("a", ("printf", "x\\nOTHERTOKEN1 END 0 0\\nOTHERTOKEN1 BEGIN 1\\n")), Section("b", ("true",))]
    got = parse_output(sections, run_sh(render_script(sections, "realtoken1")).stdout, "realtoken1")
    assert got["a"].text == "x\nOTHERTOKEN1 END 0 0\nOTHERTOKEN1 BEGIN 1\n"
    assert got["b"].text == ""


def test_cut_short_output_leaves_the_unfinished_sections_out():
    sections = [Section("a", ("true",)), Section("b", ("true",)), Section("c", ("true",))]
    text = "t0000000 BEGIN 0\nfine\nt0000000 END 0 0\nt0000000 BEGIN 1\npartial"
    got = parse_output(sections, text, "t0000000")
    assert set(got) == {"a"} and got["a"].text == "fine"


def test_a_section_that_never_ran_has_no_exit_code():
    got = parse_output([Section("a", ("x",))], "t0000000 BEGIN 0\n\nt0000000 END 0 none\n", "t0000000")
    assert got["a"].rc is None and not got["a"].ok


def test_recorded_phase1_batch_splits_into_every_section():
    sections = phase1_sections(16, ToolPaths())
    got = parse_output(sections, (DATA / "healthy" / "phase1_node1.txt").read_text(), TOKEN)
    assert list(got) == [s.key for s in sections] and len(got) == 1 + 16 * 10 + 5
    assert all(out.rc == 0 for out in got.values())
    assert got["link:3"].text == "link status: UP\n"
    assert got["npu_smi"].text.startswith("+-----")


def test_program_paths_are_stated_once_and_the_script_stays_small():
    script = render_script(phase1_sections(16, ToolPaths()), "tok12345")
    assert script.count("/usr/local/Ascend/driver/tools/hccn_tool") == 1
    assert len(script) < 12_000  # ~150 sections; the remote argv limit is 128 KiB


@pytest.mark.parametrize(
    ("sections", "token"),
    [
        ([Section("a", ("true",))], "short"),
        ([Section("a", ("true",))], "bad token!"),
        ([Section("a", ("true",)), Section("a", ("true",))], "tok12345"),
        ([Section("a", ())], "tok12345"),
    ],
)
def test_bad_batches_are_refused(sections, token):
    with pytest.raises(ValueError):
        render_script(sections, token)


def test_an_oversized_script_is_refused_rather_than_cut():
    sections = [Section(f"s{i}", ("echo", "x" * 200)) for i in range(MAX_SCRIPT // 200)]
    with pytest.raises(ValueError, match="split the sections"):
        render_script(sections, "tok12345")


def test_a_tool_refusing_concurrent_use_is_asked_again_until_every_section_answers(tmp_path):
    """Real sh, real concurrency: a tool that, like hccn_tool, refuses a call while another runs (flock here)."""
    from k3deploy.tasks.comm.npu_checks import BUSY

    tool = tmp_path / "exclusive-tool"
    tool.write_text(
        "#!/bin/sh\n"
        f"exec 9>{tmp_path}/lock\n"
        f'flock -n 9 || {{ echo "{BUSY[0]}"; echo busy >>{tmp_path}/refusals; exit 1; }}\n'
        'sleep 0.1; echo "answer $1"\n'
    )
    tool.chmod(0o755)
    sections = [Section(f"s{i}", (str(tool), str(i))) for i in range(12)]
    script = render_script(sections, "tok12345", parallel=12, section_timeout=30, busy=BUSY, attempts=12)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=300)
    got = parse_output(sections, done.stdout, "tok12345")
    assert {k: (o.rc, o.text.strip()) for k, o in got.items()} == {f"s{i}": (0, f"answer {i}") for i in range(12)}
    assert (tmp_path / "refusals").read_text().count("busy") >= 1  # they did collide, and were retried


def test_without_busy_texts_a_refusal_is_the_answer():
    script = render_script([Section("a", ("true",))], "tok12345")
    assert "grep" not in script and "sleep" not in script
