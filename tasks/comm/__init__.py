"""Comm stage: the vLLM-Ascend multi-node communication checks (pure builders and parsers + a runner)."""

from k3deploy.tasks.batch import Section, SectionOutput, parse_output, render_script
from k3deploy.tasks.comm.cross import PingTarget, consistent, majority, ping_plan
from k3deploy.tasks.comm.report import CommReport, NotApplicable
from k3deploy.tasks.comm.runner import run_comm_checks
from k3deploy.tasks.comm.topology import board_die, logical_id
from k3deploy.tasks.node_facts import ToolPaths

__all__ = [
    "CommReport",
    "NotApplicable",
    "PingTarget",
    "Section",
    "SectionOutput",
    "ToolPaths",
    "board_die",
    "consistent",
    "logical_id",
    "majority",
    "parse_output",
    "ping_plan",
    "render_script",
    "run_comm_checks",
]
