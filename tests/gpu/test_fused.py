"""GPU tests of mode=fused: its kernels compiled and captured with PDL, verified against fp32. Skipped where there is no
CUDA."""
from __future__ import annotations

import pytest
import torch

from harness.measure.job import measure
from tests.support import gpu, run_config
from tests.gpu.support import QWEN, QWEN_DECODE_TOKENS, run_with_knobs


pytestmark = [pytest.mark.gpu, gpu]


@pytest.mark.parametrize("bs,graph_steps", [(1, 1), (8, 1), (1, 4), (8, 4)])
def test_fused_kernels_captured_with_pdl_decode_within_fp32_fidelity(bs, graph_steps):
    result = measure(run_config(*QWEN, f"bs={bs}", "mode=fused", "repeats=1", f"graph_steps={graph_steps}"))
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert len(result.step_ms) * graph_steps == QWEN_DECODE_TOKENS  # one sample a replay of graph_steps
    assert result.mode_tags["fused"] == ("pdl=on split_k=on packed=on prefetch=off fold_attention=on tune=off slices=on "
                                             "weights_ahead=on tma=on")
    assert "captured" not in result.mode_tags
    assert m["kl_nats"] <= m["eager_kl_nats"]  # fp32 accumulation: at least native bf16's fidelity (a third, measured)


def test_a_fused_graph_of_many_steps_decodes_from_a_kept_context_in_a_cache_that_just_holds_it():
    """The sweep that failed its fp32 check on an H100 (2026-12-07, Qwen3-0.6B at context 1024, cache 1280,
    graph_steps=127 after graph_steps=1): a graph of several steps after a job that kept its context, the cache just
    long enough for the context and two replays. Its capture's warm-up writes neither past the cache nor over the
    context: the kept context is decoded from, not prefilled again, and the run passes its checks."""
    tight = ("model=qwen3-0.6b", "mode=fused", "repeats=1", "context_len=128", "warmup=2", "decode_tokens=64",
             "cache_len=256")
    assert measure(run_config(*tight)).failure is None  # keeps its context for the next job
    many = measure(run_config(*tight, "graph_steps=64"))  # 128 + 64 + 64 slots: three warm-up replays would pass 256
    assert many.failure is None and many.metrics["verified"] == 1.0, many.failure
    assert many.metrics["prefill_reused"] == 1.0


def test_the_greedy_kernel_under_pdl_feeds_torch_argmax_captured():
    """The greedy choice of a graph of several fused steps, compiled for the GPU with PDL's wait and captured: each
    row's token is torch.argmax's (equal largest in two programs: the first), replay after replay."""
    from harness.kernels.fused.greedy import GreedyFeed
    from harness.kernels.fused.knobs import KNOBS

    BLOCK = KNOBS.greedy_block

    logits = torch.empty(8, 151936, device="cuda")
    ids, tokens = torch.full((8, 1), -1, device="cuda"), torch.full((8,), -1, device="cuda")
    greedy = GreedyFeed(logits, ids, pdl=True)

    def new_logits() -> None:  # each replay's own, with equal largest in two programs' spans of row 3
        logits.normal_()
        logits[3, [3 * BLOCK + 7, 9 * BLOCK + 1]] = 9.0
        tokens.fill_(-1)

    new_logits()
    greedy(tokens)  # compiled before capture
    assert torch.equal(tokens, logits.argmax(-1)) and tokens[3] == 3 * BLOCK + 7
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        greedy(tokens)
    for _ in range(3):
        new_logits()
        graph.replay()
        assert torch.equal(tokens, logits.argmax(-1)) and torch.equal(ids[:, 0], tokens) and tokens[3] == 3 * BLOCK + 7


def test_a_fused_attention_that_reads_enough_kv_asks_l2_for_the_mlp_weights_and_is_verified():
    """fused.weights_ahead where it applies (K/V of 1-6 MiB: bs=1 at context 1024), the bulk prefetches in the
    captured step, and the run within fp32 fidelity; at the short context of the tests above it asks for none."""
    result = measure(run_config("model=qwen3-0.6b", "bs=1", "context_len=1024", "cache_len=1280", "decode_tokens=32",
                                "mode=fused", "repeats=1"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    assert result.mode_tags["fused_plan"].endswith(
        "; attention: 6.0 MiB of the MLP's weights asked of L2; mlp: gate/up, then down")
    short = measure(run_config(*QWEN, "bs=1", "mode=fused", "repeats=1"))
    assert short.mode_tags["fused_plan"].endswith("; attention: no weights asked of L2; mlp: gate/up, then down")


@pytest.mark.parametrize("context, asked", [(2048, ""), (512, "; 6.0 MiB of the MLP's weights asked of L2 by its merge")])
def test_a_bs1_fused_run_past_one_chunk_with_little_kv_or_too_much_attends_in_three_launches_and_is_verified(context,
                                                                                                          asked):
    """attention_folded's rule on the GPU: Qwen3-0.6B at bs=1, context 2048 (9 MB of K/V a layer, past
    fused.weights_ahead's budget) or 512 (2.7 MB, under FOLD_MIN_KV_BYTES), runs the attention as three launches a
    layer, the merge asking L2 for the MLP's weights where the K/V leave room, and within fp32 fidelity."""
    result = measure(run_config("model=qwen3-0.6b", "bs=1", f"context_len={context}", f"cache_len={context + 256}",
                                "decode_tokens=32", "mode=fused", "repeats=1"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    assert result.metrics["kernel_launches_per_step"] == 7 * 28 + 1
    plan = result.mode_tags["fused_plan"]
    assert "; attention: three launches (bs=1 past one chunk a KV head" in plan
    assert f"weights asked ahead{asked}); mlp:" in plan, plan


@pytest.mark.parametrize("bs", [1, 8])
def test_tiles_through_tma_decode_within_fp32_fidelity_and_say_so(bs, monkeypatch):
    """fused.tma on a Hopper GPU: the tile products' weights copied into shared memory by the tensor memory
    accelerator (the rule, tma_from_hidden wide and up, brought down to Qwen3-0.6B's 1024 so that a small model runs
    it: its QKV and O at bs=1, every product at bs=8; the copies-first rule's width held off, which would take the
    rest at bs=1), the step captured with PDL, verified against fp32, and the plan naming each TMA product;
    fused.tma=false runs none."""
    run_with_knobs(monkeypatch, tma_from_hidden=1024, copies_first_from_hidden=1 << 30)
    result = measure(run_config(*QWEN, f"bs={bs}", "mode=fused", "repeats=1"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    plan = result.mode_tags["fused_plan"]
    assert plan.count(", TMA ") == plan.count("tiles") == (2 if bs == 1 else 5), plan
    off = measure(run_config(*QWEN, f"bs={bs}", "mode=fused", "repeats=1", "fused.tma=false"))
    assert off.failure is None and "TMA" not in off.mode_tags["fused_plan"] and "tma=off" in off.mode_tags["fused"]


def test_the_large_products_through_tma_where_the_rules_sliced_them_decode_within_fp32_fidelity(monkeypatch):
    """The large products' rule (tma_large_from_hidden, brought down to Qwen3-0.6B's 1024) on a Hopper GPU at bs=1
    with row-major weights (which the copies-first kernel does not take, so `_matvec_tma` runs them, as at bs>1):
    gate/up, down and lm_head as tiles through TMA on tma_large_stages, QKV and O tiles through registers, nothing
    sliced; captured with PDL and verified against fp32; a wrong RoPE position inside a kernel of such a step still
    fails the run."""
    knobs = run_with_knobs(monkeypatch, tma_large_from_hidden=1024)
    result = measure(run_config(*QWEN, "bs=1", "mode=fused", "repeats=1", "fused.packed=false"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    plan = result.mode_tags["fused_plan"]
    assert plan.count(f", TMA {knobs.tma_large_stages} stages") == plan.count(", TMA ") == 3, plan
    assert "slices" not in plan and plan.count("tiles") == 5, plan
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "fused_rope_off_by_one")  # as the fault test below runs it
    faulty = measure(run_config(*QWEN, "bs=2", "mode=fused", "repeats=1", "model.tie_word_embeddings=false"))
    assert faulty.failure is not None and faulty.metrics["verified"] == 0.0
    assert faulty.mode_tags["fused_plan"].count(", TMA ") == 3  # (the rule holds at any batch)


def test_the_large_products_copying_before_their_pdl_wait_decode_within_fp32_fidelity(monkeypatch):
    """The copies-first rule on a Hopper GPU at bs=1 (the large products' rule brought down to Qwen3-0.6B's 1024
    wide, the copies-first width held off): gate/up, down (split, added atomically) and lm_head (normed logits, the
    position bumped), and QKV by the rule, as harness/kernels/fused/copies_first.py's Gluon kernel, captured with
    PDL and verified against fp32; at bs=2 the rule's `_matvec_tma` runs them (that kernel computes one row)."""
    knobs = run_with_knobs(monkeypatch, tma_large_from_hidden=1024, copies_first_from_hidden=1 << 30)
    result = measure(run_config(*QWEN, "bs=1", "mode=fused", "repeats=1"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    plan = result.mode_tags["fused_plan"]
    # the large products on their stages, and QKV (the rule's copies_first_small_kinds) where its stages match
    assert plan.count(f", TMA {knobs.copies_first_stages} stages, copied before the wait") == 3 + (
        knobs.copies_first_small_stages == knobs.copies_first_stages), plan
    copied_first = 3 + len(knobs.copies_first_small_kinds)
    assert plan.count(", copied before the wait") == plan.count(", TMA ") == copied_first, plan
    two = measure(run_config(*QWEN, "bs=2", "mode=fused", "repeats=1"))
    assert two.failure is None and two.metrics["verified"] == 1.0, two.failure
    assert "copied before" not in two.mode_tags["fused_plan"] and two.mode_tags["fused_plan"].count(", TMA ") == 3


def test_qkv_and_o_copying_before_their_pdl_wait_decode_within_fp32_fidelity(monkeypatch):
    """copies_first_small_kinds with O on a Hopper GPU at bs=1 (the large products' rule brought down to Qwen3-0.6B's
    1024 wide): every product of the step as harness/kernels/fused/copies_first.py's Gluon kernel, QKV's split
    partial sums and squares (the embedding's row at layer 0, written as the residual) and O's atomic adds among
    them, O letting gate/up launch at its wait; verified against fp32."""
    run_with_knobs(monkeypatch, tma_large_from_hidden=1024, copies_first_small_kinds=("qkv", "o"))
    result = measure(run_config(*QWEN, "bs=1", "mode=fused", "repeats=1"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    assert result.mode_tags["fused_plan"].count(", copied before the wait") == 5, result.mode_tags["fused_plan"]


def test_a_tuned_fused_step_times_its_candidates_and_is_verified():
    """fused.tune on the GPU: the candidates captured and timed, the plan the step runs named, and the run verified
    against fp32 like any fused run (a choice changes how a product launches, never what it computes)."""
    result = measure(run_config(*QWEN, "bs=1", "mode=fused", "repeats=1", "fused.tune=true"))
    m, tags = result.metrics, result.mode_tags
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert m["tune_candidates"] >= 10 and m["tune_ms"] > 0
    assert f"(of {m['tune_candidates']:.0f} tried)" in tags["tune"]
    again = measure(run_config(*QWEN, "bs=1", "mode=fused", "repeats=1", "fused.tune=true"))  # the plan kept: untimed
    assert again.failure is None and again.metrics["tune_kept"] == 1.0 and "; kept from GPU-" in again.mode_tags["tune"]
    assert again.mode_tags["fused_plan"] == tags["fused_plan"]
    assert tags["fused_plan"].count("tiles") + tags["fused_plan"].count("row slices") == 5  # QKV, O, gate/up, down, lm_head
    print(tags["tune"], "|", tags["fused_plan"])
