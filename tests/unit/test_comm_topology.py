"""Logical NPU id ↔ (board, die) on an A3 node, and the npu-smi commands built from it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3deploy.tasks.comm.npu_checks import spod_info_cmd
from k3deploy.tasks.comm.topology import board_die, boards, logical_id
from k3deploy.tasks.node_facts import ToolPaths

pytestmark = pytest.mark.comm


def test_a3_mapping_matches_npu_smi_table_order():
    # npu-smi info lists board 0 dies 0,1 (Phy-ID 0,1), board 1 dies 0,1 (Phy-ID 2,3), ...
    assert [board_die(i) for i in range(16)] == [(b, d) for b in range(8) for d in range(2)]
    assert board_die(15) == (7, 1) and board_die(6) == (3, 0)
    assert boards(16)[-1] == (7, 1) and len(boards(16)) == 16


@given(st.integers(min_value=0, max_value=4096), st.integers(min_value=1, max_value=4))
def test_logical_id_inverts_board_die(npu: int, dies: int):
    assert logical_id(*board_die(npu, dies), dies) == npu


@pytest.mark.parametrize(("board", "die"), [(-1, 0), (0, 2), (3, -1)])
def test_impossible_positions_are_refused(board: int, die: int):
    with pytest.raises(ValueError):
        logical_id(board, die)


def test_negative_npu_is_refused():
    with pytest.raises(ValueError):
        board_die(-1)


def test_spod_info_command_addresses_board_and_die():
    assert spod_info_cmd(ToolPaths(npu_smi="npu-smi"), 13) == [
        "npu-smi",
        "info",
        "-t",
        "spod-info",
        "-i",
        "6",
        "-c",
        "1",
    ]
