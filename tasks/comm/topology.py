"""Where a logical NPU sits on an Atlas 800 A3 node: 8 boards × 2 dies = 16 logical NPUs.

`hccn_tool -i` takes the logical id (0..15); `npu-smi -i` takes the board and `-c` the die.
Mixing them up silently checks the wrong device, so the conversion lives here, tested once.
"""

from __future__ import annotations

DIES_PER_BOARD = 2  # A3: every NPU board carries two dies, each a logical NPU


def board_die(npu: int, dies_per_board: int = DIES_PER_BOARD) -> tuple[int, int]:
    """Logical NPU id → (npu-smi `-i` board, npu-smi `-c` die)."""
    if npu < 0 or dies_per_board < 1:
        raise ValueError(f"bad NPU id {npu} or dies per board {dies_per_board}")
    return divmod(npu, dies_per_board)


def logical_id(board: int, die: int, dies_per_board: int = DIES_PER_BOARD) -> int:
    """(board, die) → logical NPU id, the inverse of `board_die`."""
    if board < 0 or not 0 <= die < dies_per_board:
        raise ValueError(f"bad board {board} / die {die} (dies per board: {dies_per_board})")
    return board * dies_per_board + die


def boards(npus_per_node: int, dies_per_board: int = DIES_PER_BOARD) -> list[tuple[int, int]]:
    """Every (board, die) of a node, in logical-id order."""
    return [board_die(npu, dies_per_board) for npu in range(npus_per_node)]
