"""harness/kernels/fused/plan.py, the row slices' rule and layout."""
from __future__ import annotations

import torch

from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import plan, plan_swiglu, slice_values, slice_layout


def test_a_model_1024_wide_slices_128_values_a_thread_and_a_wider_one_64(monkeypatch):
    """The slice rule: at one row, in a model 1024 wide (Qwen3-0.6B) each thread holds 128 of a slice's values, twice
    the rows a program of 64 would take; in one 2048 wide (Llama-3.2-1B) 64, its gate/up still sliced on eight warps
    (as tiles it was faster at one workload and slower at others: docs/fused-knobs.md). (fp32 weights here: 16-bit
    ones of a model 2048 wide stream through TMA as tiles, the large products' rule, test_warps.py.)"""
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan
    wide, narrow = torch.zeros(8192, 2048), torch.zeros(3072, 1024)
    sliced = plan_swiglu(narrow, narrow, FusedConfig(), KNOBS, 1, 1024)
    assert sliced.choice.slices and (sliced.warps, sliced.bk) == (4, 1024) and sliced.bn == 128 * 4 * 32 // 1024
    down = plan(torch.zeros(1024, 3072), FusedConfig(), KNOBS, True, 1, 1024, kind="down")
    assert (down.bn, down.bk, down.splits) == (128 * 4 * 32 // 2048, 2048, 2)
    gate_up = plan_swiglu(wide, wide, FusedConfig(), KNOBS, 1, 2048)
    assert gate_up.choice.slices and (gate_up.warps, gate_up.bk, gate_up.bn) == (8, 2048, 64 * 8 * 32 // 2048)
    assert [slice_values(KNOBS, h) for h in (0, 1024, 2048)] == [64, 128, 64]  # 0: the model's size not given


def test_slice_layout_fills_a_thread_with_whole_rows_of_a_split():
    # Llama-3.1-8B's down (4096 x 14336): 8 splits of 1792 in BK of 2048, 4 rows a program on four warps
    assert slice_layout(KNOBS, 4096, 14336, True, 4) == (4, 2048, 8)
    assert slice_layout(KNOBS, 4096, 14336, True, 8) == (8, 2048, 8)
    # Qwen3-0.6B's down (1024 x 3072): 2 splits of 1536; unsplit (lm_head, gate/up) its whole K: 2 rows at least
    assert slice_layout(KNOBS, 1024, 3072, True, 4) == (4, 2048, 2)
    assert slice_layout(KNOBS, 128256, 4096, False, 4) == (2, 4096, 1)
    assert slice_layout(KNOBS, 2048, 2048, True, 4) == (4, 2048, 1)
