"""Where the time goes (harness/measure/roofline.py): byte and FLOP counts and the speed-of-light floor by hand."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.measure.roofline import floor, implementation_bytes, kv_read_factor, slots_read, step_cost
from tests.support import run_config


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True)


QWEN = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)


def parameters(model_name: str) -> int:
    """The real parameter count, from the architecture built on the meta device (no memory)."""
    m = run_config(f"model={model_name}").model
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(m.model_type, **m.architecture()))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, arch", [("tiny", TINY), ("qwen3-0.6b", QWEN)])
def test_weight_bytes_are_the_parameters_read_once(name, arch):
    # every parameter once (the tied table once, by lm_head) plus the bs embedding rows looked up
    for bs in (1, 8):
        assert step_cost(arch, bs, 256, 2)["weight_bytes"] == 2 * (parameters(name) + bs * arch["hidden_size"])


def test_tiny_counts_by_hand():
    c = step_cost(TINY, bs=2, valid_slots=64, dtype_bytes=2)
    matmul = 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128) + 1024 * 64  # 2 layers + lm_head
    assert c["step_flops"] == 2 * 2 * matmul + 2 * 4 * 2 * 4 * 16 * 64
    kv = 2 * 2 * 2 * 2 * 16 * (64 + 1) * 2  # K and V x layers x bs x kv_heads x head_dim x (valid + new) x bytes
    assert c["kv_bytes"] == kv
    assert c["activation_bytes"] == 2 * (2 * 2 * (10 * 64 + 3 * 128 + 2 * (64 + 64)) + 2 * 2 * 1024)
    assert c["step_bytes"] == c["weight_bytes"] + c["kv_bytes"] + c["activation_bytes"]


def test_qwen3_useful_bytes_by_hand_at_bs1_context_256():
    """qwen3-0.6b: hidden 1024, MLP 3072, 28 layers, 16 q heads and 8 KV heads of 128, vocab 151936, tied."""
    c = step_cost(QWEN, bs=1, valid_slots=256, dtype_bytes=2)
    per_layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 1024 * 3072  # q, k and v, o, gate/up/down
    matmul = 28 * per_layer + 151936 * 1024  # + lm_head (the tied table, read once)
    assert matmul == 595_984_384
    weights = matmul + 28 * (2 * 1024 + 2 * 128) + 1024 + 1024  # norms, final norm, one embedding row
    assert c["weight_bytes"] == 2 * weights == 1_192_101_888
    assert c["kv_bytes"] == 2 * 28 * 8 * 128 * (256 + 1) * 2 == 29_474_816  # 256 read, the new token written
    assert c["activation_bytes"] == 2 * (28 * (10 * 1024 + 3 * 3072 + 2 * (2048 + 2048)) + 2 * 151936) == 2_156_032
    assert c["step_bytes"] == 1_223_732_736
    f = floor(c, {"copy_bytes_per_s": 4.25e12, "bf16_flops_per_s": 990e12})
    assert f["floor_ms"] == f["floor_memory_ms"] == pytest.approx(1_223_732_736 / 4.25e12 * 1e3)


def test_the_issue_floor_at_bs8_context_16384_is_3_8_ms():
    f = floor(step_cost(QWEN, bs=8, valid_slots=16384, dtype_bytes=2), {"copy_bytes_per_s": 4.25e12,
                                                                      "bf16_flops_per_s": 990e12})
    assert 3.7 < f["floor_ms"] < 3.9  # 1.19 GB of weights + 15 GB of K/V


def test_what_an_implementation_reads_against_what_is_useful():
    steps = range(1034, 1034 + 128)  # context 1024 + warm-up 10, then 128 timed steps
    useful = step_cost(QWEN, 8, 1034 + 64.5, 2)["step_bytes"]
    sdpa, gqa, flex = (implementation_bytes(QWEN, 8, attn, 16384, steps, 2) for attn in ("sdpa", "sdpa-gqa", "flex"))
    per_slot = 2 * 28 * 8 * 128 * 8 * 2  # K and V of 8 rows, bf16
    assert sdpa - gqa == per_slot * 16384 * 4  # repeat_kv: 1 + 2 x 2 reads of every slot instead of 1
    assert slots_read("flex", 16384, steps) == sum(-(-(p + 1) // 128) * 128 for p in steps) / 128
    assert 1152 <= slots_read("flex", 16384, steps) <= 1280  # whole 128-slot blocks of the valid prefix
    assert useful < flex < gqa < sdpa
    assert kv_read_factor(1, "sdpa") == 1 and kv_read_factor(2, "eager") == 5 and kv_read_factor(2, "flex") == 1
    assert slots_read("triton-decode", 16384, steps) == 1034 + 64.5 and kv_read_factor(2, "triton-decode") == 1
    triton = implementation_bytes(QWEN, 8, "triton-decode", 16384, steps, 2)
    assert triton < flex and triton == pytest.approx(useful, rel=1e-3)  # the valid slots, each read once


def test_a_mixture_of_experts_reads_the_experts_its_rows_touch():
    arch = run_config("model=qwen3-30b-a3b").model.architecture()
    active = step_cost(arch, 1, 256, 2)["weight_bytes"] / 2  # one row: its 8 experts of 128 in each layer
    assert 2.9e9 < active < 3.2e9  # "A3B": 3.3 B active, of which the 0.31 B embedding table is one row here
    rows = 4096  # so many rows touch every expert: the whole model but the embedding table, once
    every = step_cost(arch, rows, 256, 2)["weight_bytes"] / 2 - rows * 2048
    assert every == pytest.approx(30_532_122_624 - 151936 * 2048, rel=1e-6)


def test_the_floor_is_the_slower_of_memory_and_compute():
    """2.125 GB at 4.25 TB/s is 0.5 ms; 1 TFLOP at 1000 TFLOP/s is 1 ms: the floor is 1 ms, compute-bound. Bugs
    caught: the faster of the two taken (0.5), bytes read as GB or FLOP/s as TFLOP/s (a floor off by 1e3)."""
    ceilings = {"copy_bytes_per_s": 4.25e12, "bf16_flops_per_s": 1e15}
    assert floor({"step_bytes": 2.125e9, "step_flops": 1e12}, ceilings) == pytest.approx(
        {"floor_ms": 1.0, "floor_memory_ms": 0.5, "floor_compute_ms": 1.0})
    assert floor({"step_bytes": 2.125e9, "step_flops": 1e11}, ceilings)["floor_ms"] == pytest.approx(0.5)
