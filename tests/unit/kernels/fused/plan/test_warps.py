"""harness/kernels/fused/plan.py, the warps a program runs on."""
from __future__ import annotations

import torch

from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import PlanChoice, plan, plan_swiglu, default_choice


def test_products_take_fewer_warps_from_32_batch_rows_in_a_wide_model(monkeypatch):
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan
    weight, options = torch.zeros(256, 128), FusedConfig(slices=False)  # the tiles' rule at every batch
    warps = [plan(weight, options, KNOBS, True, rows, hidden=4096).warps for rows in (1, 8, 31, 32, 64)]
    assert warps == [8, 8, 8, 4, 4]
    assert plan(weight, options, KNOBS, True, 32, hidden=2048).warps == 8  # a 1B model keeps eight
    gate = torch.zeros(128, 128)
    assert [plan_swiglu(gate, gate, options, KNOBS, rows, hidden).warps
            for hidden in (2048, 4096) for rows in (8, 32)] == [8, 8, 8, 4]
    # fused.slices (on by default) plans row slices at one row for gate/up, down and lm_head of a model up to 2048
    # wide (tiles from two rows, for QKV and O, and in an 8B model); an unsplit slice of 2048 columns or more on
    # eight warps, a split one on slice_warps
    sliced = [plan(weight, FusedConfig(), KNOBS, True, rows, hidden, kind=kind)
              for rows, kind, hidden in ((1, "down", 2048), (2, "down", 2048), (1, "qkv", 1024), (1, "o", 1024),
                                         (1, "down", 4096))]
    assert [(p.choice.slices, p.dot, p.warps) for p in sliced] == [
        (True, False, KNOBS.slice_warps), (False, True, 8), (False, True, 8), (False, True, 8), (False, True, 8)]
    wide = torch.zeros(256, 2048)
    assert plan(wide, FusedConfig(), KNOBS, False, 1, 2048, kind="lm_head").warps == 8
    assert plan(torch.zeros(256, 1024), FusedConfig(), KNOBS, False, 1, 1024, kind="lm_head").warps == 4
    assert plan(wide, FusedConfig(split_k=False), KNOBS, True, 1, 2048, kind="down").warps == 8  # unsplit


def test_the_rules_warps_a_program_by_layout_k_and_rows(monkeypatch):
    """The rules' plan (default_choice, rule_warps) on the GPU: an unsplit slice of K 2048 or more on eight warps, a
    split or shorter one on four; tiles on eight, four from 32 rows in a model 4096 wide."""
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)

    def rules(n, k, kind, rows=1, hidden=2048, options=FusedConfig()):
        return default_choice(KNOBS, n, k, options, rows, hidden, kind)

    # Llama-3.2-1B at bs=1, its large products sliced (fused.tma off: with it, they stream through TMA as tiles):
    # gate/up and lm_head unsplit (K 2048) on eight, down split (K 8192) on four, QKV tiles
    no_tma = FusedConfig(tma=False)
    assert rules(16384, 2048, "gate_up", options=no_tma) == PlanChoice(2, True, 8, slices=True)
    assert rules(128256, 2048, "lm_head", options=no_tma) == PlanChoice(2, True, 8, slices=True)
    assert rules(2048, 8192, "down", options=no_tma) == PlanChoice(2, True, 4, slices=True)
    assert rules(3072, 2048, "qkv") == PlanChoice(1, True, 8)  # QKV split for one program an SM at bs=1 here
    assert rules(3072, 2048, "qkv", rows=8) == PlanChoice(2, True, 8)
    # with fused.split_k off, down's K stays whole: eight
    assert rules(2048, 8192, "down", options=FusedConfig(split_k=False, tma=False)) == PlanChoice(2, True, 8,
                                                                                               slices=True)
    # the large products' rule: 16-bit weights of a model 2048 wide stream through TMA as tiles on eight warps; 32-bit
    # ones (which fused.tma does not stream) stay sliced
    assert [rules(n, k, kind) for n, k, kind in ((16384, 2048, "gate_up"), (2048, 8192, "down"))] == [
        PlanChoice(2, True, 8)] * 2
    assert default_choice(KNOBS, 2048, 8192, FusedConfig(), 1, 2048, "down", 4).slices
    # Qwen3-0.6B (1024 wide): a K of 1024 is short of 2048, four (fused.tma off; with it, at one row, the copies-first
    # rule takes the large products as tiles, and QKV for one program an SM)
    assert rules(6144, 1024, "gate_up", hidden=1024, options=no_tma) == PlanChoice(2, True, 4, slices=True)
    assert rules(6144, 1024, "gate_up", hidden=1024) == PlanChoice(2, True, 8)
    assert rules(4096, 1024, "qkv", hidden=1024) == PlanChoice(1, True, 8)
    # Qwen3-8B: tiles (no product of a model 4096 wide is sliced), on four from 32 rows
    assert rules(24576, 4096, "gate_up", hidden=4096) == PlanChoice(2, True, 8)
    assert rules(24576, 4096, "gate_up", rows=32, hidden=4096) == PlanChoice(2, True, 4)
