"""harness/kernels/fused/plan.py, the splits of K and the blocks' width."""
from __future__ import annotations

import dataclasses
import functools

import pytest

from harness.cli.precheck import compose_single_run
from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import HOPPER_SMS, blocks_and_splits, split_count
from tests.unit.kernels.fused.support import gpu_products


def test_k_is_split_only_where_column_blocks_are_too_few():
    splits = functools.partial(split_count, KNOBS, HOPPER_SMS)
    # Llama-3.2-1B's down_proj in 64-column blocks: 32 blocks, split 8 ways (max_splits), unless splits are off
    assert splits(n=2048, k=8192, bn=64, bk=128, allowed=True) == 8
    assert splits(n=2048, k=8192, bn=64, bk=128, allowed=False) == 1
    assert splits(n=2048 * 64, k=2048, bn=64, bk=128, allowed=True) == 1  # an lm_head's 2048 blocks fill the GPU
    assert splits(n=96 * 64, k=4096, bn=64, bk=128, allowed=True) == 4  # Qwen3-8B's QKV: 96 x 2 under 2 an SM
    assert splits(n=256 * 64, k=2048, bn=64, bk=128, allowed=True) == 2  # 256 blocks x 2: 2 an SM
    assert splits(n=64, k=256, bn=64, bk=128, allowed=True) == 2  # no split of less than a whole tile


def test_blocks_narrow_where_even_splits_leave_sms_without_a_program(monkeypatch):
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan (the interpreter's keeps wide tiles)
    layout = functools.partial(blocks_and_splits, KNOBS, HOPPER_SMS)
    assert layout(n=2048, k=2048, bk=128, split_k=True) == (64, 8)  # Llama-3.2-1B's O: 256
    # Qwen3-0.6B's O: 16 blocks x 8 < 132, so 16 splits (K has the tiles) before narrower blocks
    assert layout(n=1024, k=2048, bk=128, split_k=True) == (64, 16)
    # its down_proj: K (24 tiles) has no 16 whole-tile splits, so 32-column blocks split 8 ways
    assert layout(n=1024, k=3072, bk=128, split_k=True) == (32, 8)
    assert layout(n=1024, k=2048, bk=128, split_k=False) == (16, 1)  # unsplit: 64 blocks
    assert layout(n=2 * 8192, k=2048, bk=128, split_k=False) == (64, 1)  # 256 blocks: enough


@pytest.mark.slow
def test_qkv_splits_for_one_program_an_sm_at_bs1_only_where_a_tma_rule_reaches(monkeypatch):
    """The rules split QKV's K for one program an SM (four tiles a program) in Llama-3.2-1B and Qwen3-1.7B at bs=1,
    and in Qwen3-0.6B and Qwen3-4B at bs=1 where the copies-first rule takes them (without it, for two); for two
    (two tiles) at bs=8; O keeps its splits; qkv_one_an_sm_max_rows holds the rule to its rows (none, or every
    batch size). fused.tma=false (the plan before the large products' rule and this one) splits it for two."""
    def splits(model, rows, knobs=KNOBS, tma=True):
        products = gpu_products(monkeypatch, compose_single_run(["mode=fused", f"model={model}"]).model, knobs, rows,
                                FusedConfig(tma=tma))
        return products["qkv"].grid, products["o"].grid

    assert splits("llama-3.2-1b", 1) == ((48, 4), (32, 8)) and splits("llama-3.2-1b", 8) == ((48, 8), (32, 8))
    assert splits("qwen3-1.7b", 1) == ((64, 4), (32, 8)) and splits("qwen3-1.7b", 8) == ((64, 8), (32, 8))
    # where the copies-first rule reaches them at one row (1024 and 2560 wide); without it, 2 an SM
    assert splits("qwen3-0.6b", 1)[0] == (64, 4) and splits("qwen3-4b", 1)[0] == (96, 2)
    before_reach = dataclasses.replace(KNOBS, copies_first_from_hidden=1 << 30, copies_first_warps=0)
    assert splits("qwen3-0.6b", 1, before_reach)[0] == (64, 8) and splits("qwen3-4b", 1, before_reach)[0] == (96, 4)
    assert splits("qwen3-0.6b", 8)[0] == (64, 8) and splits("qwen3-4b", 8)[0] == (96, 4)
    # where neither the large rule nor the copies-first rule's width holds
    assert splits("llama-3.2-1b", 1, dataclasses.replace(before_reach, tma_from_hidden=2048))[0] == (48, 8)
    assert splits("llama-3.2-1b", 1, tma=False)[0] == (48, 8)
    assert splits("llama-3.2-1b", 1, dataclasses.replace(KNOBS, qkv_one_an_sm_max_rows=0))[0] == (48, 8)
    assert splits("llama-3.2-1b", 8, dataclasses.replace(KNOBS, qkv_one_an_sm_max_rows=1 << 30))[0] == (48, 4)
