"""Issue 4 on CPU: byte and FLOP counts by hand, the report on a real tiny sweep, a real mlflow server."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.labels import run_variant
from harness.report import table_markdown
from harness.roofline import floor, kv_read_factor, step_cost
from harness.summary import speedups
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
    c = step_cost(TINY, bs=2, cache_len=64, dtype_bytes=2)
    matmul = 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128) + 1024 * 64  # 2 layers + lm_head
    assert c["step_flops"] == 2 * 2 * matmul + 2 * 4 * 2 * 4 * 16 * 64
    kv = 2 * 2 * 2 * 2 * 16 * 64 * 2  # K and V x layers x bs x kv_heads x head_dim x cache_len x bytes
    assert c["kv_bytes"] == kv * kv_read_factor(2, compiled=False)
    assert c["activation_bytes"] == 2 * (2 * 2 * (10 * 64 + 3 * 128 + 2 * (64 + 64)) + 2 * 2 * 1024)
    assert c["step_bytes"] == c["weight_bytes"] + c["kv_bytes"] + c["activation_bytes"]


def test_qwen3_floor_is_a_quarter_millisecond_at_bs1():
    c = step_cost(QWEN, bs=1, cache_len=256, dtype_bytes=2)
    assert 1.19e9 < c["weight_bytes"] < 1.20e9  # 596M parameters in bf16
    f = floor(c, {"copy_bytes_per_s": 4.8e12, "bf16_flops_per_s": 990e12})
    assert 0.24 < f["floor_ms"] < 0.27 and f["floor_ms"] == f["floor_memory_ms"]


def test_kv_copies_are_counted_where_transformers_repeats_kv():
    assert kv_read_factor(1, compiled=True) == 1  # no GQA, nothing to expand
    assert kv_read_factor(2, compiled=True) == 5  # read K/V, write the 2x copy, read it
    cost = lambda compiled: step_cost(QWEN, 1, 1024, 2, compiled)["kv_bytes"]  # noqa: E731
    assert cost(True) == 5 * 2 * 28 * 8 * 128 * 1024 * 2 and cost(True) >= cost(False)
    assert kv_read_factor(2, compiled=True, attn="sdpa-gqa") == 1  # the packed query reads K/V once
    assert kv_read_factor(2, compiled=False, attn="eager") == 5  # eager attention always repeats


def test_variants_get_their_own_columns_against_the_plain_eager_baseline():
    params = {"mode": "compiled", "graph_steps": "1", "model.fuse_projections": "True", "attn": "sdpa-gqa",
              "compile_mode": "max-autotune"}  # as MLflow logs them
    assert run_variant(params) == "compiled max-autotune fused sdpa-gqa"
    assert run_variant({"mode": "graphed", "graph_steps": 4, "model.fuse_projections": False}) == "graphed steps=4"
    runs = [("eager", "eager fused", 8.0), ("eager", "eager", 10.0), ("compiled", "compiled fused", 2.0),
            ("compiled", "compiled max-autotune fused", 1.0)]
    rows = [dict(id=i, status="FINISHED", model="tiny", cache_len=64, bs=1, context_len=8, dtype="bf16", mode=mode,
                 variant=variant, median_ms=ms, efficiency=None, floor_ms=None, reason="")
            for i, (mode, variant, ms) in enumerate(runs)]
    assert speedups(rows) == {0: 1.25, 1: 1.0, 2: 5.0, 3: 10.0}
    header, _, cells = table_markdown(rows).splitlines()
    assert header == "| model | cache_len | bs | eager | eager fused | compiled fused | compiled max-autotune fused |"
    assert cells.startswith("| tiny | 64 | 1 | 10.000 ms, 1.00x | 8.000 ms, 1.25x | 2.000 ms, 5.00x |")
