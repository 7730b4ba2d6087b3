"""Comm stage: the vLLM-Ascend multi-node communication checks (pure builders and parsers + a runner)."""

from k3deploy.tasks.comm.batch import Section, SectionOutput, parse_output, render_script
from k3deploy.tasks.comm.cross import PingTarget, consistent, majority, ping_plan
from k3deploy.tasks.comm.npu_checks import ToolPaths
from k3deploy.tasks.comm.report import CommReport, Finding, NotApplicable, Verdict
from k3deploy.tasks.comm.runner import run_comm_checks
from k3deploy.tasks.comm.topology import board_die, logical_id

__all__ = [
    "CommReport",
    "Finding",
    "NotApplicable",
    "PingTarget",
    "Section",
    "SectionOutput",
    "ToolPaths",
    "Verdict",
    "board_die",
    "consistent",
    "logical_id",
    "majority",
    "parse_output",
    "ping_plan",
    "render_script",
    "run_comm_checks",
]
