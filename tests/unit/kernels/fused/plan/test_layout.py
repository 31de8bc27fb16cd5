"""harness/kernels/fused/plan.py, the weights' layout: packed tiles and gate/up paired."""
from __future__ import annotations

import torch

from harness.kernels.fused.plan import pack, pair_blocks


def test_packing_puts_each_program_tile_in_one_contiguous_run():
    weight = torch.arange(6 * 5, dtype=torch.float32).view(6, 5)
    tiles = pack(weight, 4, 2)  # 2 x 3 tiles of 4 x 2, zeros past the edges
    assert tiles.shape == (2, 3, 4, 2)
    assert torch.equal(tiles[1, 2, :2, :1], weight[4:6, 4:5]) and tiles[1, 2, 2:].abs().sum() == 0
    assert torch.equal(tiles[0, 1], weight[0:4, 2:4])


def test_gate_and_up_are_paired_block_by_block():
    gate, up = torch.full((6, 3), 1.0), torch.full((6, 3), 2.0)
    gate[:, 0], up[:, 0] = torch.arange(6), 10 + torch.arange(6)
    paired = pair_blocks(gate, up, 4)  # 6 rows of each in blocks of 4: the second block padded with zeros
    assert paired.shape == (16, 3)
    assert paired[:4, 0].tolist() == [0, 1, 2, 3] and paired[4:8, 0].tolist() == [10, 11, 12, 13]
    assert paired[8:10, 0].tolist() == [4, 5] and paired[12:14, 0].tolist() == [14, 15]
    assert paired[10:12].abs().sum() == 0 and paired[14:].abs().sum() == 0
