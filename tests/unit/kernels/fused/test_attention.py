"""harness/kernels/fused/attention.py: the fused attention (folded, or three launches) against eager in Triton's
interpreter, its chunks a KV head, and where it folds."""
from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from harness.cli.precheck import compose_single_run
from harness.config.fused import FusedConfig
from harness.kernels.fused import decoder as fused_decoder
from harness.kernels.fused.attention import attention_chunks, attention_folded
from harness.kernels.fused.decoder import FusedDecoder
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.triton_decode import BLOCK_N, splits_for
from harness.modes.base import Stepper
from tests.unit.kernels.fused.support import (CAPACITY_GRID, LLAMA, _Recording, _assert, assert_same_cache,
                                              decode_like_eager, fused_and_eager, tiny_model_and_prompt)


@pytest.mark.slow
def test_the_attention_query_tile_padding_never_reaches_the_output():
    """The folded attention's query tile has 16 rows for a group of fewer heads: the padding rows (masked: zero
    queries) are computed and never stored; the logits are eager's."""
    eager, run, decoder = fused_and_eager(*LLAMA)
    assert decoder.heads // decoder.kv_heads < 16  # there is padding
    decode_like_eager(eager, run, decoder, 2)


@pytest.mark.slow
@pytest.mark.parametrize("family", [(), LLAMA], ids=["qwen3", "llama"])
@pytest.mark.parametrize("serial_max, max_block, merge_block", [(4, 64, 1), (2, 64, 4), (1, 2, 2)],
                         ids=["one-a-load", "all-in-one-load", "two-loads"])
def test_the_folded_attention_merges_its_chunks_once_the_last_is_done(family, serial_max, max_block, merge_block):
    """Past one chunk of the valid prefix each KV head's chunks run as programs of their own, and the last to finish
    merges them (one at a time, all in one load, or, where the chunks outnumber the merge's block, in two loads): the
    step still computes eager's logits and cache, and every count is back to 0 for the next layer (a count left over
    would make the next layer's merge wait for a chunk that never comes, or merge early)."""
    knobs = dataclasses.replace(CAPACITY_GRID, serial_merge_max_chunks=serial_max, max_merge_block=max_block)
    cfg, model, prompt = tiny_model_and_prompt(*family, "context_len=130", "cache_len=256")
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedConfig(pdl=False), knobs)
    assert decoder.merge_block == merge_block
    splits = decoder.attn_acc.shape[2]
    valid = 131  # slots the first step's query (at slot 130) attends to
    chunk = math.ceil(math.ceil(valid / splits) / BLOCK_N) * BLOCK_N
    assert splits > 1 and math.ceil(valid / chunk) == 3  # three chunks hold slots at this position
    decode_like_eager(eager, run, decoder, 3, lambda: _assert(decoder.chunks_done.eq(0).all()))
    assert_same_cache(run, eager, 133)


@pytest.mark.slow
@pytest.mark.parametrize("context", [128, 129], ids=["new-token-alone-in-its-chunk", "beside-the-context"])
def test_the_new_token_attends_to_itself_once_read_back_from_the_cache(context):
    """The chunk that holds the new token's slot appends its K/V first and then reads every slot of the chunk back
    from the cache, its own included (a barrier between). Where the new token opens a chunk of its own (slot 128: no
    slot of the context in it) and beside the context's slots, the logits and cache are eager's, at that step and
    the next (whose chunk then reads the appended slot from the cache)."""
    cfg, model, prompt = tiny_model_and_prompt(f"context_len={context}", "cache_len=256")
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedConfig(pdl=False), CAPACITY_GRID)  # chunks of a block
    splits = decoder.attn_acc.shape[2]
    chunk = math.ceil(math.ceil((context + 1) / splits) / BLOCK_N) * BLOCK_N
    assert chunk == BLOCK_N and (context % chunk == 0) == (context == 128)  # slot 128 starts a chunk
    decode_like_eager(eager, run, decoder, 2)
    assert_same_cache(run, eager, context + 2)


@pytest.mark.slow
@pytest.mark.parametrize("one_chunk_max, chunks", [(0, 2), (KNOBS.one_chunk_max_slots, 1)],
                         ids=["two-chunks", "one-chunk"])
def test_an_attention_grid_sized_for_a_shorter_prefix_still_attends_to_every_slot(one_chunk_max, chunks):
    """The attention's chunks sized by the longest prefix the run was planned for (70 slots: two chunks, or one,
    which merges nothing, where so short a prefix takes one): a step past it (slot 130) attends in longer chunks (two
    or three blocks), to every slot, and computes what the capacity's grid (one block a chunk) computes, logits and
    cache, from the same prefilled context. (Against each other, not eager: the first prefill of a CPU process has
    been seen to differ from the later ones by more than this test's tolerance.)"""
    cfg, model, prompt = tiny_model_and_prompt("context_len=130", "cache_len=256")
    run, wide_run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len, prefill=False)
    wide_run.adopt([(layer.keys[:, :, :130], layer.values[:, :, :130]) for layer in run.cache.layers], run.first_ids)
    wide = FusedDecoder(model, wide_run.cache, run.static_ids, FusedConfig(pdl=False), CAPACITY_GRID)
    knobs = dataclasses.replace(KNOBS, one_chunk_max_slots=one_chunk_max)
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedConfig(pdl=False), knobs, longest_prefix=70)
    assert decoder.attn_acc.shape[2] == chunks < wide.attn_acc.shape[2]  # fewer chunks than the capacity's grid
    with torch.inference_mode():
        for step in range(3):
            want, got = wide.step(), decoder.step()
            assert torch.allclose(got, want, atol=1e-5, rtol=0), f"step {step}: {(got - want).abs().max()}"
            assert decoder.chunks_done.eq(0).all()
            run.input_ids.copy_(want.argmax(-1, keepdim=True))
    assert_same_cache(run, wide_run, 133)  # keys and values


def test_one_attention_chunk_a_kv_head_up_to_256_slots_of_prefix_or_384_at_bs1_with_heads_of_64():
    """One chunk a (row, KV head), nothing to merge, where the longest prefix is 256 slots or fewer, at any batch and
    head width; at bs=1 with heads of at most 64 (Llama-3.2-1B's), up to 384 (its graph of 127 steps at the study's
    workload plans for 286 slots, which one chunk covers). Past that, the grid for about 264 programs, where one
    chunk's serial loop over many blocks costs more than the merge (docs/fused-knobs.md)."""
    chunks = functools.partial(attention_chunks, KNOBS, programs=KNOBS.attention_programs)
    for rows in (1, 8, 32):
        for head_dim in (64, 128):
            assert chunks(rows, 8, 170, head_dim=head_dim) == chunks(rows, 8, 256, head_dim=head_dim) == 1
        assert chunks(rows, 8, 257, head_dim=128) == splits_for(rows, 8, 257, 264)
    assert chunks(1, 8, 257, head_dim=128) == 8 and chunks(8, 8, 394, head_dim=128) == 4
    assert chunks(1, 8, 286, head_dim=64) == chunks(1, 8, 384, head_dim=64) == 1  # Llama-3.2-1B, 127 steps a replay
    assert chunks(1, 8, 385, head_dim=64) == splits_for(1, 8, 385, 264) > 1
    assert chunks(8, 8, 286, head_dim=64) == splits_for(8, 8, 286, 264) > 1  # bs=8: not measured
    assert chunks(1, 8, 1290, head_dim=128) == 32  # Qwen3-0.6B at context 1024


def test_the_attention_of_one_chunk_is_folded_at_bs1_as_far_as_one_chunk_reaches():
    """A single chunk merges nothing, so its attention is one kernel, never the three launches: Llama-3.2-1B at bs=1
    and the study's workload as one graph of 127 steps (prefix up to 286 slots) folds, and past 384 slots takes three
    launches as before; Qwen3-0.6B (heads of 128) takes three launches past 256."""
    assert _folded_at("llama-3.2-1b", 1, 32, 254) and not _folded_at("llama-3.2-1b", 1, 32, 400)
    assert _folded_at("qwen3-0.6b", 1, 32, 200) and not _folded_at("qwen3-0.6b", 1, 32, 254)


def _folded_at(model_name: str, rows: int, context: int, steps: int = 138, knobs=KNOBS, **options) -> bool:
    """attention_folded's answer for a model of conf/model/ at `rows` rows decoding `steps` tokens after `context`
    (a job's default: 10 warm-up, 128 timed), from its config's sizes in bf16 (the K/V a layer reads at the longest
    prefix, its MLP's weights)."""
    m = compose_single_run(["mode=fused", f"model={model_name}"]).model
    prefix, bf16 = context + steps + 1, 2
    kv_bytes = 2 * rows * m.num_key_value_heads * prefix * m.head_dim * bf16
    mlp_bytes = 3 * m.hidden_size * m.intermediate_size * bf16
    return attention_folded(FusedConfig(**options), knobs, rows, prefix, kv_bytes, mlp_bytes, m.head_dim)


@pytest.mark.slow
def test_the_attention_takes_its_three_launches_back_at_bs1_past_one_chunk_unless_it_hosts_the_mlp_weights():
    """At bs=1 past one chunk a KV head the folded attention pays only as the host of a request for a good share of
    the MLP's weights over a long enough chain of K/V: the workloads that were paired fold or not as the faster plan
    did (docs/fused-knobs.md); one chunk, more rows, and the switch off decide as before."""
    assert _folded_at("qwen3-0.6b", 1, 1024)  # 4.8 MB of K/V, a third of its MLP asked ahead: folded
    assert _folded_at("qwen3-1.7b", 1, 1024)  # 8.3% of its MLP asked ahead: folded
    assert not _folded_at("qwen3-8b", 1, 1024)  # 2.1% of its MLP: under the share, three launches
    assert not _folded_at("qwen3-0.6b", 1, 512)  # 2.7 MB of K/V: under the bound, three launches whose merge asks
    assert not _folded_at("qwen3-0.6b", 1, 768)  # 3.7 MB: under the bound
    assert not _folded_at("qwen3-1.7b", 1, 512)  # 2.7 MB: under the bound
    assert not _folded_at("qwen3-4b", 1, 1024)  # 4.2% of its MLP asked: under the share
    assert not _folded_at("qwen3-0.6b", 1, 2048) and not _folded_at("qwen3-0.6b", 1, 4096)  # K/V past the budget
    for context in (512, 1024, 2048):  # 6 MiB is 6.2% of Llama-3.2-1B's MLP
        assert not _folded_at("llama-3.2-1b", 1, context)
    assert _folded_at("llama-3.2-1b", 1, 32, steps=137)  # the study's workload: one chunk a KV head
    assert _folded_at("qwen3-0.6b", 8, 16384) and _folded_at("llama-3.2-1b", 2, 2048)  # more rows keep the fold
    assert not _folded_at("qwen3-0.6b", 1, 1024, fold_attention=False)
    assert not _folded_at("qwen3-0.6b", 8, 32, fold_attention=False)


@pytest.mark.slow
@pytest.mark.parametrize("fold_attention", [True, False], ids=["folded", "three-launches"])
def test_the_three_launches_aim_their_chunks_at_programs_of_their_own(fold_attention):
    """unfolded_attention_programs sizes the three launches' grid and attention_programs the folded kernel's: each
    plan's chunks follow its own aim and not the other's, and its step decodes eager's logits at that grid."""
    knobs = dataclasses.replace(KNOBS, attention_programs=16, unfolded_attention_programs=8)
    eager, run, decoder = fused_and_eager("context_len=100", "cache_len=320", knobs=knobs,
                                          options=FusedConfig(pdl=False, fold_attention=fold_attention))
    rows_times_kv_heads = 2 * decoder.kv_heads  # two rows; 320 slots are 5 blocks, so up to 8 chunks
    assert decoder.folded == fold_attention
    assert decoder.attn_acc.shape[2] == (16 if fold_attention else 8) // rows_times_kv_heads
    decode_like_eager(eager, run, decoder, 3)


@pytest.mark.slow
@pytest.mark.parametrize("fold_attention", [True, False], ids=["folded", "three-launches"])
def test_each_attention_plan_launches_on_the_warps_and_stages_of_its_own_knobs(fold_attention, monkeypatch):
    """folded_attention_warps/stages reach the folded kernel's launch and split_kv_warps/stages the split-KV's, not
    the other's (a variant that sets one pair must not time the other plan under it), and the step still decodes
    eager's logits."""
    knobs = dataclasses.replace(KNOBS, folded_attention_warps=2, folded_attention_stages=5, split_kv_warps=8,
                                split_kv_stages=2)
    launched = {name: [] for name in ("_attention", "_split_kv")}
    for name, launches in launched.items():
        monkeypatch.setattr(fused_decoder, name, _Recording(getattr(fused_decoder, name), launches))
    eager, run, decoder = fused_and_eager("context_len=100", "cache_len=320", knobs=knobs,
                                          options=FusedConfig(pdl=False, fold_attention=fold_attention))
    decode_like_eager(eager, run, decoder, 2)
    used, unused = ("_attention", "_split_kv") if fold_attention else ("_split_kv", "_attention")
    assert {(warps, stages) for _, warps, stages in launched[used]} == {(2, 5) if fold_attention else (8, 2)}
    assert not launched[unused]
