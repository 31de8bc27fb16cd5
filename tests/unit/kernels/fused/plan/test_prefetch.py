"""harness/kernels/fused/plan.py, the L2 prefetch a program asks for."""
from __future__ import annotations

import dataclasses

import torch

from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import Product, prefetch_bytes


def test_each_program_prefetches_its_share_of_the_l2_budget_never_past_its_slice(monkeypatch):
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)
    on, knobs = FusedConfig(prefetch=True), dataclasses.replace(KNOBS, l2_prefetch_bytes=16 << 20)

    def chunk(n, k, bn, splits, options=on):  # bytes a program, for bf16 tiles 128 wide in K
        return prefetch_bytes(knobs, n, k, bn, 128, splits, 2, options)

    # Llama-3.2-1B's gate/up: 256 programs of 16 tiles (256 KiB); 16 MiB / 256 = 64 KiB each
    assert chunk(2 * 8192, 2048, 64, 1) == (16 << 20) // 256 == 65536
    # its qkv, 48 blocks x 8 splits: the budget (43690 bytes a program) exceeds a slice of 2 tiles (32 KiB)
    assert chunk(3072, 2048, 64, 8) == 2 * 64 * 128 * 2 == 32768
    # its lm_head, 2004 programs: 8371 bytes a program, down to the bulk prefetch's 16-byte unit
    assert chunk(128256, 2048, 64, 1) == 8368
    assert chunk(128256, 2048, 64, 1, FusedConfig(prefetch=False)) == 0
    assert chunk(128256, 2048, 64, 1, FusedConfig(prefetch=True, packed=False)) == 0  # row-major: tiles apart
    monkeypatch.setattr(fused_plan, "interpreted", lambda: True)
    assert chunk(2 * 8192, 2048, 64, 1) == 0  # Triton's interpreter runs no inline PTX


def test_the_rolling_prefetch_runs_as_far_ahead_as_the_first_prefetch_reached():
    def ahead(chunk, bn=64):  # K columns between the tile loaded and the tile asked of L2, for bf16 x 128-wide tiles
        weight = torch.empty(1, dtype=torch.bfloat16)
        return Product(weight, 2 * 8192, 2048, bn, 128, 1, True, True, 4, chunk).prefetch_ahead

    assert ahead(65536) == 4 * 128  # gate/up's 64 KiB a program: 4 tiles of 64 x 128 x 2 bytes
    assert ahead(65536, bn=16) == 16 * 128  # 16-column tiles of 4 KiB: 16 of them
    assert ahead(8368) == 128  # lm_head's 8 KiB, under a tile: still the next tile
    assert ahead(0) == 0  # no prefetch at all
