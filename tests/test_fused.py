"""mode=fused: its kernels (in Triton's interpreter here) against eager and fp32, the job verified, the faults that a
fused kernel can hide failing the run, and what the config refuses before anything is built."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
import torch
import triton
import triton.language as tl

from harness import models
from harness.config.labels import FUSED_SWITCHES
from harness.cli.precheck import compose_single_run
from harness.config.schema import ConfigError, FusedConfig
from harness.kernels import fused_decode, tma_before_wait
from harness.kernels.fused_decode import ATTN_BLOCK_N, FusedDecoder, FusedOptions, pack, pair_blocks, split_count
from harness.measure.job import measure, seeded_prompt
from harness.modes.base import Stepper
from tests.support import FAST, REPO, compiled_for_the_gpu, run_config

FUSED = (*FAST, "device=cpu", "dtype=fp32", "bs=2", "mode=fused")
LLAMA = ("model.model_type=llama", "+model.extra.rope_scaling={rope_type: llama3, factor: 8.0, high_freq_factor: 4.0, "
         "low_freq_factor: 1.0, original_max_position_embeddings: 16}")  # tiny's sizes, Llama-3's layer and RoPE


def tiny_model_and_prompt(*overrides: str):
    """A fused run's config, its tiny fp32 model and a seeded prompt of two rows."""
    cfg = run_config(*FUSED, *overrides)
    model = models.get_model(cfg.model, "fp32", cfg.attn, torch.device("cpu"), 0).model
    return cfg, model, seeded_prompt(2, cfg.context_len, model.config.vocab_size, 0, torch.device("cpu"))


def fused_and_eager(*overrides: str, options=FusedOptions(pdl=False)):
    """A tiny fp32 model's eager stepper and a fused decoder over a second prefilled cache of the same prompt."""
    cfg, model, prompt = tiny_model_and_prompt(*overrides)
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    return eager, run, FusedDecoder(model, run.cache, run.static_ids, options)


def decode_like_eager(eager, run, decoder, steps: int, after_each=lambda: None) -> None:
    """Teacher-forced: both fed eager's choice; the fused logits are eager's at every step."""
    with torch.inference_mode():
        for step in range(steps):
            want, got = eager.step(), decoder.step()
            assert torch.allclose(got, want, atol=1e-4, rtol=0), f"step {step}: {(got - want).abs().max()}"
            after_each()
            token = want.argmax(-1, keepdim=True)
            eager.input_ids.copy_(token)
            run.input_ids.copy_(token)


def assert_same_cache(run, other, slots: int, length: int | None = None) -> None:
    """Every layer's K and V over the first `slots` slots as `other`'s (and both caches `length` long, where given)."""
    for ours, theirs in zip(run.cache.layers, other.cache.layers):
        if length is not None:
            assert int(ours.cumulative_length) == int(theirs.cumulative_length) == length
        assert torch.allclose(ours.keys[:, :, :slots], theirs.keys[:, :, :slots], atol=1e-5)
        assert torch.allclose(ours.values[:, :, :slots], theirs.values[:, :, :slots], atol=1e-5)


def _assert(condition) -> None:
    assert condition


@pytest.mark.parametrize("family", [(), LLAMA], ids=["qwen3", "llama"])
@pytest.mark.parametrize("options", [FusedOptions(pdl=False), FusedOptions(pdl=False, split_k=False, packed=False),
                                     FusedOptions(pdl=False, fold_attention=False)],
                         ids=["split-packed", "plain", "attention-unfolded"])
def test_the_fused_step_computes_eager_decode_logits_and_cache(family, options):
    eager, run, decoder = fused_and_eager(*family, options=options)
    assert eager.model.config.model_type == ("llama" if family else "qwen3")
    assert decoder.layers[0].down.splits > 1 if options.split_k else decoder.layers[0].down.splits == 1
    start = eager.context_len
    decode_like_eager(eager, run, decoder, 4)
    assert_same_cache(run, eager, start + 4, length=start + 4)  # the new tokens' K/V, appended where eager's are


def test_the_pipelined_weight_loop_computes_eager_logits(monkeypatch):
    """The products' other loop (Triton's pipeliner after the first tile), over splits of several tiles each: the
    same logits as eager's, step after step."""
    monkeypatch.setattr(fused_decode, "PIPELINE_STAGES", 3)
    monkeypatch.setattr(fused_decode, "INTERPRETED_BK", 16)  # tiny's hidden 64: 4 tiles of K, 2 a split
    monkeypatch.setattr(fused_decode, "MAX_SPLITS", 2)
    eager, run, decoder = fused_and_eager()
    assert decoder.layers[0].qkv.k // decoder.layers[0].qkv.bk // decoder.layers[0].qkv.splits >= 2
    decode_like_eager(eager, run, decoder, 3)


@pytest.mark.parametrize("packed, gate_up_columns, first", [(True, 0, False), (False, 0, False), (True, 16, False),
                                                            (True, 0, True), (False, 0, True)],
                         ids=["packed", "row-major", "gate-up-narrow", "packed-first", "row-major-first"])
def test_products_whose_tiles_stream_through_tma_compute_eager_logits(packed, gate_up_columns, first, monkeypatch):
    """Every kind of product through `_matvec_tma` (TMA_KINDS; in the interpreter a descriptor reads the same boxes
    the copy engine would), over splits of several tiles each, packed tiles or row-major rows whose last block passes
    the weight's edge, gate/up in tiles of GATE_UP_TILE_COLUMNS (8 of gate's, 8 of up's) where given, and each split's
    first tile copied before the PDL wait where `first` (TMA_FIRST_BEFORE_WAIT: that tile outside the pipelined loop,
    which a loop still starting at the split's first column would add twice): the same logits and cache as eager's,
    step after step."""
    monkeypatch.setattr(fused_decode, "TMA_FROM_HIDDEN", 64)  # tiny's hidden size: the rule applies
    monkeypatch.setattr(fused_decode, "GATE_UP_TILE_COLUMNS", gate_up_columns)
    monkeypatch.setattr(fused_decode, "TMA_FIRST_BEFORE_WAIT", first)
    monkeypatch.setattr(fused_decode, "INTERPRETED_BK", 16)  # tiny's hidden 64: 4 tiles of K, 2 a split
    monkeypatch.setattr(fused_decode, "MAX_SPLITS", 2)
    launched = []
    real = fused_decode._matvec_tma
    monkeypatch.setattr(fused_decode, "_matvec_tma", _Recording(real, launched))
    eager, run, decoder = fused_and_eager("model.vocab_size=1000", options=FusedOptions(pdl=False, packed=packed))
    products = decoder.products()
    assert all(p.descriptor is not None and p.stages == fused_decode.TMA_STAGES for p in products.values())  # few programs
    assert products["qkv"].k // products["qkv"].bk // products["qkv"].splits >= 2
    assert products["lm_head"].n % products["lm_head"].bn  # its last block passes the edge (zeros: packed or TMA's)
    assert products["gate_up"].bn == (gate_up_columns or fused_decode.INTERPRETED_BN)
    start = eager.context_len
    decode_like_eager(eager, run, decoder, 3)
    assert_same_cache(run, eager, start + 3, length=start + 3)
    assert len(launched) == 3 * (4 * len(decoder.layers) + 1)  # every product of every step


def test_tma_keeps_two_tiles_in_flight_where_that_brings_a_product_into_one_wave_and_three_elsewhere(monkeypatch):
    """An 8B model's products as the rule plans them on the H200 (132 SMs) from two rows: three stages for Qwen3-8B's
    QKV and gate/up (384 programs: one wave at three an SM), two for its O and down (512) and for Llama-3.1-8B's
    gate/up (448), which two bring into one wave, and three again for lm_head (thousands: several waves either way);
    Qwen3-4B (2560 wide) streams too; fused.tma off, or a model narrower than TMA_FROM_HIDDEN (2048 wide), streams
    nothing. At one row the copies-first rule takes the 8B model's products (QKV and O too)."""
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)  # the GPU's plan: 64 x 128 tiles, tensor cores
    options, wide = FusedOptions(), fused_decode.TMA_FROM_HIDDEN
    weight = lambda n, k: torch.empty(n, k, dtype=torch.bfloat16, device="meta")  # noqa: E731 (shapes only)

    def planned(n, k, kind, hidden=wide, options=options, rows=2):  # (at one row the copies-first rule reaches them)
        return fused_decode.plan(weight(n, k), options, kind in ("qkv", "o", "down"), rows, hidden, kind=kind)

    gate_up = fused_decode.plan_swiglu(weight(12288, 4096), weight(12288, 4096), options, 2, wide)
    assert (gate_up.grid, gate_up.stages) == ((384, 1), 3)
    assert [(p.grid[0] * p.grid[1], p.stages) for p in (planned(6144, 4096, "qkv"), planned(4096, 4096, "o"),
                                                       planned(4096, 12288, "down"), planned(151936, 4096, "lm_head"))
            ] == [(384, 3), (512, 2), (512, 2), (2374, 3)]
    llama_gate_up = fused_decode.plan_swiglu(weight(14336, 4096), weight(14336, 4096), options, 2, wide)
    assert (llama_gate_up.grid[0], llama_gate_up.stages) == (448, 2)
    assert planned(4096, 4096, "o", options=FusedOptions(tma=False)).descriptor is None
    assert planned(4096, 4096, "o", hidden=wide // 2).descriptor is None
    # Qwen3-4B (2560 wide: every product tiles) streams; Qwen3-1.7B and Llama-3.2-1B (2048) keep the registers for
    # QKV from two rows (at one, QKV copies its tiles first: tma_before_wait.py's kernel, TMA_COPIES_FIRST_SMALL_KINDS)
    qwen3_4b = fused_decode.plan_swiglu(weight(9728, 2560), weight(9728, 2560), options, 2, 2560)
    assert (qwen3_4b.grid, qwen3_4b.stages, qwen3_4b.descriptor is not None) == ((304, 1), 3, True)
    assert fused_decode.plan(weight(4096, 2048), options, True, 2, 2048, kind="qkv").descriptor is None
    assert planned(4096, 2048, "qkv", hidden=2048, rows=1).copies_first
    assert all(planned(*shape, rows=1).copies_first for shape in ((6144, 4096, "qkv"), (4096, 4096, "o")))
    fp32 = fused_decode.plan(torch.empty(4096, 4096, device="meta"), options, True, 1, wide, kind="o")
    assert fp32.descriptor is None  # an fp32 run's weights keep the registers on a GPU


class _Recording:
    """A kernel whose launches are recorded into `launched` (each its grid, warps and stages), then run."""

    def __init__(self, kernel, launched: list):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launched.append((grid, kwargs.get("num_warps"), kwargs.get("num_stages")))
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.mark.parametrize("masked", [True, False], ids=["padding-masked", "padding-repeats-last-head"])
def test_the_attention_query_tile_padding_never_reaches_the_output(masked, monkeypatch):
    """The folded attention's query tile has 16 rows for a group of fewer heads: the padding rows, masked (zero
    queries) or repeating the last head, are computed and never stored; the logits are eager's either way."""
    monkeypatch.setattr(fused_decode, "QUERY_PADDING_MASKED", masked)
    eager, run, decoder = fused_and_eager(*LLAMA)
    assert decoder.heads // decoder.kv_heads < 16  # there is padding
    decode_like_eager(eager, run, decoder, 2)


@pytest.mark.parametrize("family", [(), LLAMA], ids=["qwen3", "llama"])
@pytest.mark.parametrize("serial_max, longest, merge_block, together", [
    (4, None, 1, False), (2, None, 4, False), (1, 70, 2, False), (4, None, 1, True)],
    ids=["one-a-load", "all-in-one-load", "two-loads", "heads-together"])
def test_the_folded_attention_merges_its_chunks_once_the_last_is_done(family, serial_max, longest, merge_block,
                                                                      together, monkeypatch):
    """Past one chunk of the valid prefix each KV head's chunks run as programs of their own, and the last to finish
    merges them (one at a time, all in one load, or, where the prefix outgrows what the merge was sized for, in two
    loads; or every head of the group at once, each head's chunks in one load): the step still computes eager's
    logits and cache, and every count is back to 0 for the next layer (a count left over would make the next layer's
    merge wait for a chunk that never comes, or merge early)."""
    monkeypatch.setattr(fused_decode, "SERIAL_MERGE_MAX_CHUNKS", serial_max)
    monkeypatch.setattr(fused_decode, "MERGE_HEADS_TOGETHER", together)
    monkeypatch.setattr(fused_decode, "CHUNKS_BY_PREFIX", False)  # the capacity's grid: three chunks past 128 slots
    cfg, model, prompt = tiny_model_and_prompt(*family, "context_len=130", "cache_len=256")
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedOptions(pdl=False), longest_prefix=longest)
    assert decoder.merge_block == merge_block
    splits = decoder.attn_acc.shape[2]
    valid = 131  # slots the first step's query (at slot 130) attends to
    chunk = math.ceil(math.ceil(valid / splits) / ATTN_BLOCK_N) * ATTN_BLOCK_N
    assert splits > 1 and math.ceil(valid / chunk) == 3  # three chunks hold slots at this position
    decode_like_eager(eager, run, decoder, 3, lambda: _assert(decoder.chunks_done.eq(0).all()))
    assert_same_cache(run, eager, 133)


@pytest.mark.parametrize("switches", [dict(NEW_KV_IN_REGISTERS=True), dict(NEW_KV_IN_REGISTERS=False),
                                      dict(POSITION_BEFORE_WAIT=True), dict(PAST_KV_BEFORE_WAIT=True),
                                      dict(PAST_KV_BEFORE_QUERIES=True)],
                         ids=["new-kv-in-registers", "new-kv-read-back", "position-before-wait", "past-kv-before-wait",
                              "past-kv-before-queries"])
@pytest.mark.parametrize("context", [128, 129], ids=["new-token-alone-in-its-chunk", "beside-the-context"])
def test_the_new_token_attends_to_itself_once_whether_from_registers_or_the_cache(switches, context, monkeypatch):
    """The chunk that holds the new token's slot, started from the new K/V as computed (reading only the context's
    slots from the cache; with the chunk's first block of them read ahead, before the PDL wait or after it, before the
    queries), or reading them back after its own append. Where the new token opens a chunk of its own (slot 128: no
    slot of the context in it) and beside the context's slots, the logits and cache are eager's, at that step and the
    next (whose chunk then reads the appended slot from the cache)."""
    for name, value in switches.items():
        monkeypatch.setattr(fused_decode, name, value)
    monkeypatch.setattr(fused_decode, "CHUNKS_BY_PREFIX", False)  # the capacity's grid: chunks of one block
    cfg, model, prompt = tiny_model_and_prompt(f"context_len={context}", "cache_len=256")
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedOptions(pdl=False))
    splits = decoder.attn_acc.shape[2]
    chunk = math.ceil(math.ceil((context + 1) / splits) / ATTN_BLOCK_N) * ATTN_BLOCK_N
    assert chunk == ATTN_BLOCK_N and (context % chunk == 0) == (context == 128)  # slot 128 starts a chunk
    decode_like_eager(eager, run, decoder, 2)
    assert_same_cache(run, eager, context + 2)


@pytest.mark.parametrize("past_kv_before_wait", [False, True], ids=["as-committed", "past-kv-before-wait"])
@pytest.mark.parametrize("one_chunk_max, chunks", [(0, 2), (fused_decode.ONE_CHUNK_MAX_SLOTS, 1)],
                         ids=["two-chunks", "one-chunk"])
def test_an_attention_grid_sized_for_a_shorter_prefix_still_attends_to_every_slot(past_kv_before_wait, one_chunk_max,
                                                                                  chunks, monkeypatch):
    """The attention's chunks sized by the longest prefix the run was planned for (70 slots: two chunks, or one,
    which merges nothing, where so short a prefix takes one): a step past it (slot 130) attends in longer chunks (two
    or three blocks), to every slot, and computes what the capacity's grid (one block a chunk, the kernels as
    committed) computes, logits and cache, from the same prefilled context; also where the chunk's first block is
    read ahead of the rest (PAST_KV_BEFORE_WAIT). (Against each other, not eager: the first prefill of a CPU process
    has been seen to differ from the later ones by 5e-4 in a logit.)"""
    cfg, model, prompt = tiny_model_and_prompt("context_len=130", "cache_len=256")
    run, wide_run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len, prefill=False)
    wide_run.adopt([(layer.keys[:, :, :130], layer.values[:, :, :130]) for layer in run.cache.layers], run.first_ids)
    monkeypatch.setattr(fused_decode, "CHUNKS_BY_PREFIX", False)
    wide = FusedDecoder(model, wide_run.cache, run.static_ids, FusedOptions(pdl=False))
    monkeypatch.setattr(fused_decode, "CHUNKS_BY_PREFIX", True)
    monkeypatch.setattr(fused_decode, "ONE_CHUNK_MAX_SLOTS", one_chunk_max)
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedOptions(pdl=False), longest_prefix=70)
    assert decoder.attn_acc.shape[2] == chunks < wide.attn_acc.shape[2]  # fewer chunks than the capacity's grid
    with torch.inference_mode():
        for step in range(3):
            want = wide.step()
            with mock.patch.object(fused_decode, "PAST_KV_BEFORE_WAIT", past_kv_before_wait):
                got = decoder.step()
            assert torch.allclose(got, want, atol=1e-5, rtol=0), f"step {step}: {(got - want).abs().max()}"
            assert decoder.chunks_done.eq(0).all()
            run.input_ids.copy_(want.argmax(-1, keepdim=True))
    assert_same_cache(run, wide_run, 133)  # keys and values


def test_one_attention_chunk_a_kv_head_up_to_256_slots_of_prefix_or_384_at_bs1_with_heads_of_64():
    """One chunk a (row, KV head), nothing to merge, where the longest prefix is 256 slots or fewer, at any batch and
    head width; at bs=1 with heads of at most 64 (Llama-3.2-1B's), up to 384 (its graph of 127 steps at the study's
    workload plans for 286 slots: one chunk 1.7% faster than 8, verified, on an H100). Past that, the grid for about
    264 programs (at 394 slots one chunk was 11% slower for Qwen3-0.6B, heads of 128; at 478 0.8% slower for
    Llama-3.2-1B, on the H200)."""
    chunks = functools.partial(fused_decode.attention_chunks, programs=fused_decode.ATTENTION_PROGRAMS)
    for rows in (1, 8, 32):
        for head_dim in (64, 128):
            assert chunks(rows, 8, 170, head_dim=head_dim) == chunks(rows, 8, 256, head_dim=head_dim) == 1
        assert chunks(rows, 8, 257, head_dim=128) == fused_decode.splits_for(rows, 8, 257, 264)
    assert chunks(1, 8, 257, head_dim=128) == 8 and chunks(8, 8, 394, head_dim=128) == 4
    assert chunks(1, 8, 286, head_dim=64) == chunks(1, 8, 384, head_dim=64) == 1  # Llama-3.2-1B, 127 steps a replay
    assert chunks(1, 8, 385, head_dim=64) == fused_decode.splits_for(1, 8, 385, 264) > 1
    assert chunks(8, 8, 286, head_dim=64) == fused_decode.splits_for(8, 8, 286, 264) > 1  # bs=8: not measured
    assert chunks(1, 8, 1290, head_dim=128) == 32  # Qwen3-0.6B at context 1024


def test_the_attention_of_one_chunk_is_folded_at_bs1_as_far_as_one_chunk_reaches():
    """A single chunk merges nothing, so its attention is one kernel, never the three launches: Llama-3.2-1B at bs=1
    and the study's workload as one graph of 127 steps (prefix up to 286 slots) folds, and past 384 slots takes three
    launches as before; Qwen3-0.6B (heads of 128) takes three launches past 256."""
    assert _folded_at("llama-3.2-1b", 1, 32, 254) and not _folded_at("llama-3.2-1b", 1, 32, 400)
    assert _folded_at("qwen3-0.6b", 1, 32, 200) and not _folded_at("qwen3-0.6b", 1, 32, 254)


@pytest.fixture
def fused_prefetch(monkeypatch):
    """benchmarks/fused_prefetch.py (benchmarks/ on the path), every fused_decode constant its variants set put back
    after the test."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_prefetch

    for name in fused_prefetch.DEFAULTS:
        monkeypatch.setattr(fused_decode, name, getattr(fused_decode, name))
    return fused_prefetch


def _folded_at(model_name: str, rows: int, context: int, steps: int = 138, **options) -> bool:
    """attention_folded's answer for a model of conf/model/ at `rows` rows decoding `steps` tokens after `context`
    (a job's default: 10 warm-up, 128 timed), from its config's sizes in bf16 (the K/V a layer reads at the longest
    prefix, its MLP's weights)."""
    m = compose_single_run(["mode=fused", f"model={model_name}"]).model
    prefix, bf16 = context + steps + 1, 2
    kv_bytes = 2 * rows * m.num_key_value_heads * prefix * m.head_dim * bf16
    mlp_bytes = 3 * m.hidden_size * m.intermediate_size * bf16
    return fused_decode.attention_folded(FusedOptions(**options), rows, prefix, kv_bytes, mlp_bytes, m.head_dim)


def test_the_attention_takes_its_three_launches_back_at_bs1_past_one_chunk_unless_it_hosts_the_mlp_weights():
    """At bs=1 past one chunk a KV head the folded attention pays only as the host of a request for a good share of
    the MLP's weights over a long enough chain of K/V: the workloads paired on four H100s fold or not as the faster
    did; one chunk, more rows, and the switch off decide as before."""
    assert _folded_at("qwen3-0.6b", 1, 1024)  # 4.8 MB of K/V, a third of its MLP asked ahead: 1.4% faster folded
    assert _folded_at("qwen3-1.7b", 1, 1024)  # 8.3% of its MLP: 0.7% faster folded
    assert not _folded_at("qwen3-8b", 1, 1024)  # 2.1%: 1.2% faster as three launches
    assert not _folded_at("qwen3-0.6b", 1, 512)  # 2.7 MB of K/V: three launches whose merge asks, 4.5% faster
    assert not _folded_at("qwen3-0.6b", 1, 768)  # 3.7 MB: 4.2% faster
    assert not _folded_at("qwen3-1.7b", 1, 512)  # 2.7 MB: under the bound (not paired)
    assert not _folded_at("qwen3-4b", 1, 1024)  # 4.2% of its MLP asked: 2.2% faster as three launches
    assert not _folded_at("qwen3-0.6b", 1, 2048) and not _folded_at("qwen3-0.6b", 1, 4096)  # K/V past the budget
    for context in (512, 1024, 2048):  # 6 MiB is 6.2% of Llama-3.2-1B's MLP
        assert not _folded_at("llama-3.2-1b", 1, context)
    assert _folded_at("llama-3.2-1b", 1, 32, steps=137)  # the study's workload: one chunk a KV head
    assert _folded_at("qwen3-0.6b", 8, 16384) and _folded_at("llama-3.2-1b", 2, 2048)  # more rows keep the fold
    assert not _folded_at("qwen3-0.6b", 1, 1024, fold_attention=False)
    assert not _folded_at("qwen3-0.6b", 8, 32, fold_attention=False)


def test_a_bs1_fused_job_past_one_chunk_runs_the_attention_as_three_launches_and_verifies():
    """The rule in a job: a bs=1 run whose longest prefix passes one chunk a KV head (384 slots for the tiny model's
    heads of 16; its K/V ask L2 for none of its MLP) launches seven kernels a layer, computes what fp32 does, and its
    plan tag says why."""
    result = measure(run_config(*FUSED, "bs=1", "context_len=390", "cache_len=448"))
    m, plan = result.metrics, result.mode_tags["fused_plan"]
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert m["kernel_launches_per_step"] == 7 * 2 + 1 and m["attention_chunks_per_kv_head"] > 1
    assert ("; attention: three launches (bs=1 past one chunk a KV head, under 4.0 MiB of K/V or 7% of the MLP's "
            "weights asked ahead)") in plan  # and none asked by its merge: a CPU has no bulk prefetch
    assert result.mode_tags["fused"].startswith("pdl=off split_k=on packed=on prefetch=off fold_attention=on")


def test_a_gate_up_sliced_on_eight_warps_lets_the_next_kernel_launch_after_its_stores(monkeypatch):
    """launch_point's rule (on the H200 gate/up after its stores took 1.4% off Llama-3.2-1B's step at the study's
    workload, and nothing off models whose gate/up is sliced on four warps or tiled), LAUNCH_AT over it, the point
    passed to the kernel, and each of a step's products knowing its kind."""
    gate, up = torch.randn(64, 2048, dtype=torch.bfloat16), torch.randn(64, 2048, dtype=torch.bfloat16)

    def gate_up(warps: int, slices: bool = True, kind: str = "gate_up"):
        choice = fused_decode.PlanChoice(2, warps=warps, slices=slices)
        product = fused_decode.plan_swiglu(gate, up, FusedOptions(pdl=False), 1, 2048, choice=choice)
        return dataclasses.replace(product, kind=kind)

    point = fused_decode.launch_point
    assert point(gate_up(8)) == fused_decode.AT_END
    assert point(gate_up(4)) == point(gate_up(8, slices=False)) == point(gate_up(8, kind="down")) == 1  # AFTER_LOOP
    launched = {}
    monkeypatch.setattr(fused_decode, "_matvec", mock.MagicMock(**{"__getitem__.return_value": (
        lambda *args, **kwargs: launched.update(kwargs))}))
    fused_decode.launch_product(gate_up(8), torch.zeros(1, 2048), torch.zeros(1, 64), 1, output=fused_decode.SWIGLU)
    assert launched["LAUNCH"] == fused_decode.AT_END and launched["num_warps"] == 8
    monkeypatch.setattr(fused_decode, "LAUNCH_AT", {"gate_up": fused_decode.AT_WAIT})
    fused_decode.launch_product(gate_up(8), torch.zeros(1, 2048), torch.zeros(1, 64), 1, output=fused_decode.SWIGLU)
    assert launched["LAUNCH"] == fused_decode.AT_WAIT
    _, _, decoder = fused_and_eager()
    assert {kind: product.kind for kind, product in decoder.products().items()} == {
        kind: kind for kind in fused_decode.PRODUCT_KINDS}


@pytest.mark.parametrize("steps_after_prompt, one_chunk", [(60, True), (200, False)],
                         ids=["one-chunk", "chunks-and-merge"])
def test_a_fused_run_logs_its_attention_chunks_a_kv_head(steps_after_prompt, one_chunk):
    """The attention's grid as the run planned it, from the longest prefix it decodes to: 100 slots of context and
    60 steps after them (161 slots), one chunk a KV head; 200 steps after them (301 slots), the grid for about 264
    programs, several chunks and their merge."""
    from harness.modes.fused import FusedStepper

    cfg, model, prompt = tiny_model_and_prompt("context_len=100", "cache_len=320")
    stepper = FusedStepper(model, prompt, cfg.cache_len, FusedOptions(pdl=False), steps_after_prompt=steps_after_prompt)
    chunks = stepper.metrics["attention_chunks_per_kv_head"]
    assert chunks == stepper.decoder.attn_acc.shape[2] == fused_decode.attention_chunks(
        2, model.config.num_key_value_heads, 100 + steps_after_prompt + 1, fused_decode.ATTENTION_PROGRAMS,
        model.config.head_dim)
    assert (chunks == 1) == one_chunk


@pytest.mark.parametrize("fold_attention", [True, False], ids=["folded", "three-launches"])
def test_the_three_launches_aim_their_chunks_at_programs_of_their_own(fold_attention, monkeypatch):
    """UNFOLDED_ATTENTION_PROGRAMS sizes the three launches' grid and ATTENTION_PROGRAMS the folded kernel's: each
    plan's chunks follow its own aim and not the other's, and its step decodes eager's logits at that grid."""
    monkeypatch.setattr(fused_decode, "ATTENTION_PROGRAMS", 16)
    monkeypatch.setattr(fused_decode, "UNFOLDED_ATTENTION_PROGRAMS", 8)
    eager, run, decoder = fused_and_eager("context_len=100", "cache_len=320",
                                          options=FusedOptions(pdl=False, fold_attention=fold_attention))
    rows_times_kv_heads = 2 * decoder.kv_heads  # two rows; 320 slots are 5 blocks, so up to 8 chunks
    assert decoder.folded == fold_attention
    assert decoder.attn_acc.shape[2] == (16 if fold_attention else 8) // rows_times_kv_heads
    decode_like_eager(eager, run, decoder, 3)


@pytest.mark.parametrize("fold_attention", [True, False], ids=["folded", "three-launches"])
def test_each_attention_plan_launches_on_the_warps_and_stages_of_its_own_constants(fold_attention, monkeypatch):
    """FOLDED_ATTENTION_WARPS/STAGES reach the folded kernel's launch and SPLIT_KV_WARPS/STAGES the split-KV's, not
    the other's (`--set attention_warps` pairs them), and the step still decodes eager's logits."""
    monkeypatch.setattr(fused_decode, "FOLDED_ATTENTION_WARPS", 2)
    monkeypatch.setattr(fused_decode, "FOLDED_ATTENTION_STAGES", 5)
    monkeypatch.setattr(fused_decode, "SPLIT_KV_WARPS", 8)
    monkeypatch.setattr(fused_decode, "SPLIT_KV_STAGES", 2)
    launched = {name: [] for name in ("_attention", "_split_kv_ahead")}
    for name, launches in launched.items():
        monkeypatch.setattr(fused_decode, name, _Recording(getattr(fused_decode, name), launches))
    eager, run, decoder = fused_and_eager("context_len=100", "cache_len=320",
                                          options=FusedOptions(pdl=False, fold_attention=fold_attention))
    decode_like_eager(eager, run, decoder, 2)
    used, unused = ("_attention", "_split_kv_ahead") if fold_attention else ("_split_kv_ahead", "_attention")
    assert {(warps, stages) for _, warps, stages in launched[used]} == {(2, 5) if fold_attention else (8, 2)}
    assert not launched[unused]


def test_a_fused_job_is_verified_against_fp32_with_its_kernels_named():
    result = measure(run_config(*FUSED, "model.tie_word_embeddings=false"))
    m, tags = result.metrics, result.mode_tags
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert "kl_nats" in m and m["fp32_rows_checked"] == 2  # judged against fp32, as an inexact mode
    assert m["kernel_launches_per_step"] == 5 * 2 + 1  # five a layer, the attention folded into one
    # on a CPU the GPU's techniques are off, and the tag says so
    assert tags["fused"] == ("pdl=off split_k=on packed=on prefetch=off fold_attention=on tune=off slices=off "
                             "weights_ahead=off tma=off")
    assert tags["fused_plan"].endswith("; attention: no weights asked of L2; mlp: gate/up, then down")
    prefetched = run_config(*FUSED, "fused.prefetch=true", "fused.split_k=false", "fused.fold_attention=false")
    assert prefetched.label.endswith("fused split_k=off prefetch=on fold_attention=off")  # each switch named where off its default
    # the label's defaults are the schema's: a default changed in one place only would name (or hide) a switch
    assert FUSED_SWITCHES == {f"fused.{k}": v for k, v in dataclasses.asdict(FusedConfig()).items()}
    assert tags["captured"].startswith("no: ")


def test_a_fused_graph_of_two_steps_is_judged_against_fp32_step_by_step():
    """graph_steps=2: argmax and feeding inside the call; every step's token shown, so fp32 follows it."""
    two = measure(run_config(*FUSED, "model.tie_word_embeddings=false", "graph_steps=2"))
    assert two.failure is None and two.metrics["verified"] == 1.0, two.failure
    assert len(two.step_ms) == 8 // 2  # one sample a call of two steps
    assert two.metrics["checks_applied"] == 1.0 and two.metrics["fp32_max_logit_err"] < 1e-3
    assert two.metrics["token_repeat_fraction"] < 0.5  # varied tokens: a stale one would show


def test_the_greedy_kernel_feeds_torch_argmax_the_first_index_among_equals():
    """A graph of several fused steps feeds each step's argmax by a kernel of its own: the same token as
    torch.argmax where equals fall in two loads of one program or in two programs, at the vocabulary's short end,
    for a NaN and for a row all -inf."""
    from harness.kernels.fused_greedy import BLOCK, GreedyFeed

    vocab = 151936  # Qwen3's: 50 programs of 3 loads, the last program short
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    logits[0, [5, BLOCK + 5]] = 9.0  # equal largest in two loads of one program
    logits[1, [3 * BLOCK + 7, 9 * BLOCK + 1]] = 9.0  # in two programs
    logits[2, [11, 12]] = 9.0  # in one load
    logits[3, vocab - 1] = 9.0  # the last logit
    ids, tokens = torch.full((4, 1), -1, dtype=torch.long), torch.full((4,), -1, dtype=torch.long)
    greedy = GreedyFeed(logits, ids, pdl=False)
    assert (greedy.programs, greedy.span) == (50, 3 * BLOCK)
    greedy(tokens)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 3 * BLOCK + 7, 11, vocab - 1]
    assert ids[:, 0].tolist() == tokens.tolist()  # fed: the next step's input
    assert greedy.count.tolist() == [0] * 4  # each row's count back to 0 for the next step
    logits[1, 2 * BLOCK + 3], logits[3] = float("nan"), float("-inf")
    greedy(tokens)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 2 * BLOCK + 3, 11, 0]


def test_a_fused_graph_of_several_steps_sizes_its_attention_for_whole_replays():
    """The attention's chunks are sized for the longest prefix a timed step reaches: with graph_steps=128 the
    warm-up and the decode are a replay of 128 steps each, past one chunk's slots, where their tokens alone are not."""
    from harness.modes.fused import FusedMode

    cfg, model, prompt = tiny_model_and_prompt("graph_steps=128", "cache_len=null")
    replays = FusedMode().prepare(model, prompt, cfg)  # 8 + 128 + 128 + 1 slots
    assert fused_decode.ONE_CHUNK_MAX_SLOTS < 8 + 2 * 128 + 1
    assert replays.metrics["attention_chunks_per_kv_head"] > 1
    one = FusedMode().prepare(model, prompt, run_config(*FUSED))  # 8 + 2 + 8 + 1 slots
    assert one.metrics["attention_chunks_per_kv_head"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fused_rope_off_by_one", "fused_greedy_not_fed"])
def test_a_fault_inside_a_fused_graph_of_two_steps_fails_the_run(monkeypatch, kind):
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)
    result = measure(run_config(*FUSED, "model.tie_word_embeddings=false", "graph_steps=2"))
    assert result.failure is not None and result.metrics["verified"] == 0.0, kind
    assert result.mode_tags["mutation"] == kind


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kv_append_lost", "fused_rope_off_by_one"])
def test_a_fault_inside_a_fused_kernel_fails_the_run(monkeypatch, kind):
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)
    result = measure(run_config(*FUSED, "model.tie_word_embeddings=false"))
    assert result.failure is not None and result.metrics["verified"] == 0.0, kind
    assert result.mode_tags["mutation"] == kind


def test_a_fault_inside_the_fused_kernels_is_refused_for_another_mode(monkeypatch):
    from harness.measure import mutations

    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "kv_append_lost")
    assert mutations.requested("fused") == "kv_append_lost"
    with pytest.raises(ValueError, match="^HARNESS_INJECT_MUTATION=kv_append_lost acts inside mode=fused's kernels, "
                                         "and this job is mode=eager$"):
        mutations.requested("eager")


def test_a_fault_inside_a_fused_kernel_changes_what_it_computes():
    """The faults the run must catch do change the step (so the job tests above test the check, not a no-op)."""
    eager, run, decoder = fused_and_eager()
    with torch.inference_mode():
        want = eager.step()
        decoder.rope_shift = 1
        assert not torch.allclose(decoder.step(), want, atol=1e-3)
        run.rewind()
        for layer in run.cache.layers:
            layer.keys[:, :, eager.context_len] = 0  # what the shifted step appended
        decoder.rope_shift, decoder.append = 0, False
        decoder.step()
    assert all(layer.keys[:, :, eager.context_len].abs().max() == 0 for layer in run.cache.layers)  # never appended


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


def test_k_is_split_only_where_column_blocks_are_too_few():
    # Llama-3.2-1B's down_proj in 64-column blocks: 32 blocks, split 8 ways (MAX_SPLITS), unless splits are off
    assert split_count(n=2048, k=8192, bn=64, bk=128, allowed=True) == 8
    assert split_count(n=2048, k=8192, bn=64, bk=128, allowed=False) == 1
    assert split_count(n=2048 * 64, k=2048, bn=64, bk=128, allowed=True) == 1  # an lm_head's 2048 blocks fill the GPU
    assert split_count(n=96 * 64, k=4096, bn=64, bk=128, allowed=True) == 4  # Qwen3-8B's QKV: 96 x 2 under 2 an SM
    assert split_count(n=256 * 64, k=2048, bn=64, bk=128, allowed=True) == 2  # 256 blocks x 2: 2 an SM
    assert split_count(n=64, k=256, bn=64, bk=128, allowed=True) == 2  # no split of less than a whole tile


def test_blocks_narrow_where_even_splits_leave_sms_without_a_program(monkeypatch):
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)  # the GPU's plan (the interpreter's keeps wide tiles)
    assert fused_decode.blocks_and_splits(n=2048, k=2048, bk=128, split_k=True) == (64, 8)  # Llama-3.2-1B's O: 256
    # Qwen3-0.6B's O: 16 blocks x 8 < 132, so 16 splits (K has the tiles) before narrower blocks
    assert fused_decode.blocks_and_splits(n=1024, k=2048, bk=128, split_k=True) == (64, 16)
    # its down_proj: K (24 tiles) has no 16 whole-tile splits, so 32-column blocks split 8 ways
    assert fused_decode.blocks_and_splits(n=1024, k=3072, bk=128, split_k=True) == (32, 8)
    assert fused_decode.blocks_and_splits(n=1024, k=2048, bk=128, split_k=False) == (16, 1)  # unsplit: 64 blocks
    assert fused_decode.blocks_and_splits(n=2 * 8192, k=2048, bk=128, split_k=False) == (64, 1)  # 256 blocks: enough


def test_products_take_fewer_warps_from_32_batch_rows_in_a_wide_model(monkeypatch):
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)  # the GPU's plan
    weight, options = torch.zeros(256, 128), FusedOptions(slices=False)  # the tiles' rule at every batch
    warps = [fused_decode.plan(weight, options, True, rows, hidden=4096).warps for rows in (1, 8, 31, 32, 64)]
    assert warps == [8, 8, 8, 4, 4]
    assert fused_decode.plan(weight, options, True, 32, hidden=2048).warps == 8  # a 1B model keeps eight
    gate = torch.zeros(128, 128)
    assert [fused_decode.plan_swiglu(gate, gate, options, rows, hidden).warps
            for hidden in (2048, 4096) for rows in (8, 32)] == [8, 8, 8, 4]
    # fused.slices (on by default) plans row slices at one row for gate/up, down and lm_head of a model up to 2048
    # wide (tiles from two rows, for QKV and O, and in an 8B model); an unsplit slice of 2048 columns or more on
    # eight warps, a split one on SLICE_WARPS
    sliced = [fused_decode.plan(weight, FusedOptions(), True, rows, hidden, kind=kind)
              for rows, kind, hidden in ((1, "down", 2048), (2, "down", 2048), (1, "qkv", 1024), (1, "o", 1024),
                                         (1, "down", 4096))]
    assert [(p.choice.slices, p.dot, p.warps) for p in sliced] == [
        (True, False, fused_decode.SLICE_WARPS), (False, True, 8), (False, True, 8), (False, True, 8), (False, True, 8)]
    wide = torch.zeros(256, 2048)
    assert fused_decode.plan(wide, FusedOptions(), False, 1, 2048, kind="lm_head").warps == 8
    assert fused_decode.plan(torch.zeros(256, 1024), FusedOptions(), False, 1, 1024, kind="lm_head").warps == 4
    assert fused_decode.plan(wide, FusedOptions(split_k=False), True, 1, 2048, kind="down").warps == 8  # unsplit


def test_a_model_1024_wide_slices_128_values_a_thread_and_a_wider_one_64(monkeypatch):
    """The slice rule as paired on four H200s: at one row, in a model 1024 wide (Qwen3-0.6B) each thread holds 128 of
    a slice's values, twice the rows a program of 64 would take; in one 2048 wide (Llama-3.2-1B) 64, its gate/up
    still sliced on eight warps (as tiles it was 0.8% faster at context 32 on two H200s, but 0.4% slower at context
    1024 and 5-6% slower on Qwen3-1.7B). (fp32 weights here: 16-bit ones of a model 2048 wide stream through TMA
    as tiles, the large products' rule, test_fused_tune.)"""
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)  # the GPU's plan
    wide, narrow = torch.zeros(8192, 2048), torch.zeros(3072, 1024)
    sliced = fused_decode.plan_swiglu(narrow, narrow, FusedOptions(), 1, 1024)
    assert sliced.choice.slices and (sliced.warps, sliced.bk) == (4, 1024) and sliced.bn == 128 * 4 * 32 // 1024
    down = fused_decode.plan(torch.zeros(1024, 3072), FusedOptions(), True, 1, 1024, kind="down")
    assert (down.bn, down.bk, down.splits) == (128 * 4 * 32 // 2048, 2048, 2)
    gate_up = fused_decode.plan_swiglu(wide, wide, FusedOptions(), 1, 2048)
    assert gate_up.choice.slices and (gate_up.warps, gate_up.bk, gate_up.bn) == (8, 2048, 64 * 8 * 32 // 2048)
    assert [fused_decode.slice_values(h) for h in (0, 1024, 2048)] == [64, 128, 64]  # 0: the model's size not given


def test_each_program_prefetches_its_share_of_the_l2_budget_never_past_its_slice(monkeypatch):
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)
    on = FusedOptions(prefetch=True)

    def chunk(n, k, bn, splits, options=on):  # bytes a program, for bf16 tiles 128 wide in K
        return fused_decode.prefetch_bytes(n, k, bn, 128, splits, 2, options)

    monkeypatch.setattr(fused_decode, "L2_PREFETCH_BYTES", 16 << 20)
    # Llama-3.2-1B's gate/up: 256 programs of 16 tiles (256 KiB); 16 MiB / 256 = 64 KiB each
    assert chunk(2 * 8192, 2048, 64, 1) == (16 << 20) // 256 == 65536
    # its qkv, 48 blocks x 8 splits: the budget (43690 bytes a program) exceeds a slice of 2 tiles (32 KiB)
    assert chunk(3072, 2048, 64, 8) == 2 * 64 * 128 * 2 == 32768
    # its lm_head, 2004 programs: 8371 bytes a program, down to the bulk prefetch's 16-byte unit
    assert chunk(128256, 2048, 64, 1) == 8368
    assert chunk(128256, 2048, 64, 1, FusedOptions(prefetch=False)) == 0
    assert chunk(128256, 2048, 64, 1, FusedOptions(prefetch=True, packed=False)) == 0  # row-major: tiles apart
    monkeypatch.setattr(fused_decode, "interpreted", lambda: True)
    assert chunk(2 * 8192, 2048, 64, 1) == 0  # Triton's interpreter runs no inline PTX


def test_the_rolling_prefetch_runs_as_far_ahead_as_the_first_prefetch_reached(monkeypatch):
    def ahead(chunk, bn=64):  # K columns between the tile loaded and the tile asked of L2, for bf16 x 128-wide tiles
        weight = torch.empty(1, dtype=torch.bfloat16)
        return fused_decode.Product(weight, 2 * 8192, 2048, bn, 128, 1, True, True, 4, chunk).prefetch_ahead

    assert ahead(65536) == 4 * 128  # gate/up's 64 KiB a program: 4 tiles of 64 x 128 x 2 bytes
    assert ahead(65536, bn=16) == 16 * 128  # 16-column tiles of 4 KiB: 16 of them
    assert ahead(8368) == 128  # lm_head's 8 KiB, under a tile: still the next tile
    assert ahead(0) == 0  # no prefetch at all
    monkeypatch.setattr(fused_decode, "ROLLING_PREFETCH", False)
    assert ahead(65536) == 0


@triton.jit
def _parts_of_each_program(Out, bytes1, bytes2, share):
    """What _weights_to_l2 asks L2 for in each program, written out: (first, length) in each of the two weights."""
    program = tl.program_id(0)
    start = program * share
    first, length = fused_decode._range_part(start, start + share, 0, bytes1)
    tl.store(Out + program * 4 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, first, length))
    first, length = fused_decode._range_part(start, start + share, bytes1, bytes1 + bytes2)
    tl.store(Out + program * 4 + 2 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, first, length))


@pytest.mark.parametrize("budget_from_down, asker", [(0.5, "folded"), (4.0, "folded"), (0.5, "split"), (4.0, "merge")])
def test_the_attention_asks_l2_for_the_mlp_weights_once_each_within_the_budget(monkeypatch, budget_from_down, asker):
    """fused.weights_ahead: the programs' shares of gate/up's then down's weights cover the budget's bytes once each
    (none twice, none past a weight's end), each a whole number of the bulk prefetch's 16 bytes, in the folded
    attention's grid or in that of the three launches' kernel that asks (UNFOLDED_AHEAD_IN: the split-KV's, the
    merge's, one program a head); a context whose K/V alone passes the budget, or falls short of the floor, asks for
    none. (The prefetch itself is inline PTX: the sm_90 compile test below.)"""
    cfg, model, prompt = tiny_model_and_prompt("context_len=40", "cache_len=64")
    run = Stepper(model, prompt, cfg.cache_len)
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)  # the plan as a GPU's, computed here
    decoder = FusedDecoder(model, run.cache, run.static_ids, FusedOptions(pdl=False), longest_prefix=48)
    assert decoder.folded
    layer = decoder.layers[0]
    gate_up_bytes, down_bytes = (w.numel() * w.element_size() for w in (layer.gate_up.weight, layer.down.weight))
    budget = gate_up_bytes + int(down_bytes * budget_from_down) // 16 * 16
    kv_bytes = 2 * decoder.rows * decoder.kv_heads * 48 * decoder.head_dim * 4  # K and V at the longest prefix, fp32
    monkeypatch.setattr(fused_decode, "WEIGHTS_AHEAD_FROM_KV_BYTES", kv_bytes + 16)  # a shorter chain than the floor
    assert decoder.weights_ahead(layer) is None
    monkeypatch.setattr(fused_decode, "WEIGHTS_AHEAD_FROM_KV_BYTES", kv_bytes)
    monkeypatch.setattr(fused_decode, "WEIGHTS_AHEAD_BYTES", budget)
    if asker != "folded":
        decoder.folded = False
        monkeypatch.setattr(fused_decode, "UNFOLDED_AHEAD_IN", "")
        assert decoder.weights_ahead(layer) is None  # three launches that ask for none
        monkeypatch.setattr(fused_decode, "UNFOLDED_AHEAD_IN", asker)
    first, bytes1, second, bytes2, share = decoder.weights_ahead(layer)
    assert (first, second) == (layer.gate_up.weight, layer.down.weight)
    assert (bytes1, bytes2) == (gate_up_bytes, min(down_bytes, budget - gate_up_bytes)) and share % 16 == 0
    if asker != "folded":
        assert decoder.attention_plan().endswith(f"{(bytes1 + bytes2) / 2**20:.1f} MiB of the MLP's weights asked of L2 "
                                                 f"by its {asker})")
    programs = decoder.rows * (decoder.heads if asker == "merge" else decoder.kv_heads * decoder.attn_acc.shape[2])
    parts = torch.zeros(programs, 4, dtype=torch.int64)
    _parts_of_each_program[(programs,)](parts, bytes1, bytes2, share)
    for column, size in ((0, bytes1), (2, bytes2)):
        asked = torch.zeros(size, dtype=torch.int32)
        for start, length in parts[:, column:column + 2].tolist():
            if length > 0:
                assert start % 16 == 0 and length % 16 == 0 and start + length <= size
                asked[start:start + length] += 1
        assert asked.eq(1).all()  # every byte asked for once
    options, decoder.options = decoder.options, dataclasses.replace(decoder.options, weights_ahead=False)
    assert decoder.weights_ahead(layer) is None
    decoder.options = options
    monkeypatch.setattr(fused_decode, "WEIGHTS_AHEAD_BYTES", kv_bytes - 16)  # the attention's own reads pass it
    assert decoder.weights_ahead(layer) is None
    monkeypatch.undo()
    assert decoder.weights_ahead(layer) is None  # in the interpreter: no bulk prefetch to ask with


def test_the_config_gives_fused_its_attention_and_refuses_what_it_cannot_run():
    cfg = run_config(*FUSED, "fused.pdl=false")
    assert cfg.attn == "triton-decode" and cfg.label.endswith("fused pdl=off")
    with pytest.raises(ConfigError, match=r"^model=qwen3-30b-a3b \(model_type=qwen3_moe\) is not covered by mode=fused"):
        run_config("mode=fused", "model=qwen3-30b-a3b")
    with pytest.raises(ConfigError, match="^attn=flex is invalid with mode=fused: .* use attn=triton-decode$"):
        run_config(*FUSED, "attn=flex")
    with pytest.raises(ConfigError, match="^fused.split_k applies to mode=fused only, not mode=eager$"):
        run_config(*FAST, "fused.split_k=false")
    with pytest.raises(ConfigError, match="^model.fuse_projections=true is invalid with mode=fused"):
        run_config(*FUSED, "model.fuse_projections=true")


AOT_COMPILE = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from harness.kernels.fused_decode import _attention, _matvec, _rope_append

ptrs = dict(X="*bf16", ResOut="*fp32", Ids="*i64", Gain="*bf16", W="*bf16", Out="*fp32", SquaresOut="*fp32", Bump="*i64")
ints = dict.fromkeys(["x_row", "rows", "k_total", "n_total", "out_cols", "k_per_split", "k_tiles", "prefetch_bytes",
                     "prefetch_ahead"], "i32")
names = ["INPUT", "NORM", "OUTPUT", "SPLITS", "BUMP", "ROWS", "BN", "BK", "PACKED", "DOT", "PDL", "PREFETCH", "STAGES",
         "ONE_TILE", "LAUNCH"]
products = [  # qkv of layer 0 (embedding rows, split), gate/up (SwiGLU, bf16 out), down (atomic adds), lm_head (bump)
    dict(INPUT=1, NORM=True, OUTPUT=0, SPLITS=8, BUMP=False, PACKED=True),
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=True, X="*fp32", Out="*bf16", BN=32,
         PREFETCH=True),  # its first weights asked of L2 before the wait
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=False),
    dict(INPUT=0, NORM=True, OUTPUT=2, SPLITS=1, BUMP=True, PACKED=True, X="*fp32"),
    dict(INPUT=0, NORM=True, OUTPUT=3, SPLITS=2, BUMP=False, PACKED=True, X="*fp32", W="*fp32", Gain="*fp32"),  # dtype=fp32
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=True, X="*bf16", STAGES=3),
    # fused.slices at bs=1: gate/up's whole rows, and down's rows in splits of K added atomically, on CUDA cores
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=False, X="*fp32", Out="*bf16", ROWS=1, BN=4,
         BK=2048, DOT=False, ONE_TILE=True),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=4, BUMP=False, PACKED=False, ROWS=1, BN=4, BK=2048, DOT=False,
         ONE_TILE=True),
    # the next kernel let launch at the wait (LAUNCH_AT: 0), a slice and tiles in a loop; or at the end (2)
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=False, X="*fp32", Out="*bf16", ROWS=1, BN=4,
         BK=2048, DOT=False, ONE_TILE=True, LAUNCH=0),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=True, LAUNCH=0),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=4, BUMP=False, PACKED=False, ROWS=1, BN=4, BK=2048, DOT=False,
         ONE_TILE=True, LAUNCH=2),
    dict(INPUT=0, NORM=True, OUTPUT=2, SPLITS=1, BUMP=True, PACKED=True, X="*fp32", LAUNCH=2),
    # ... or at the start, before the weights' loads (AT_START: 3), a slice and tiles in a loop
    dict(INPUT=0, NORM=False, OUTPUT=0, SPLITS=1, BUMP=False, PACKED=False, ROWS=1, BN=2, BK=2048, DOT=False,
         ONE_TILE=True, LAUNCH=3),
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=True, X="*fp32", Out="*bf16", BN=32,
         PREFETCH=True, LAUNCH=3),
]
for product in products:
    sig = {**ptrs, **ints, "eps": "fp32", **dict.fromkeys(names, "constexpr"), **{k: v for k, v in product.items() if isinstance(v, str)}}
    consts = {**dict(ROWS=16, BN=64, BK=128, DOT=True, PDL=True, PREFETCH=False, STAGES=0, ONE_TILE=False,
                     LAUNCH=1),
              **{k: v for k, v in product.items() if not isinstance(v, str)}}
    # as Triton's JIT specialises them on the GPU: pointers and the sizes that are multiples of 16 marked so
    aligned = [i for i, (name, kind) in enumerate(sig.items()) if kind.startswith("*") or name in (
        "x_row", "k_total", "n_total", "out_cols", "k_per_split", "prefetch_bytes", "prefetch_ahead")]
    ptx = triton.compile(ASTSource(_matvec, sig, consts, attrs={(i,): [["tt.divisibility", 16]] for i in aligned}),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    # PDL's wait and early launch in every product, and no TF32 (an fp32 run's products are exact)
    print("matvec", "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx and "tf32" not in ptx)
    # the bulk prefetch before the wait where asked (by one thread), and the next kernel launched after the loop's
    # loads and before the stores; or where asked at the wait, before any load that follows it, or after the stores
    launch, prefetch, wait = (ptx.find(op) for op in ("griddepcontrol.launch_dependents", "cp.async.bulk.prefetch.L2",
                                                       "griddepcontrol.wait"))
    at_start = consts["LAUNCH"] == 3
    print("order", (prefetch != -1) == consts["PREFETCH"] and prefetch < wait
          and (launch < wait) == at_start and (at_start or wait < launch)
          and ptx.count("griddepcontrol.launch_dependents") == 1
          and (launch < ptx.find("ld.global", wait)) == (consts["LAUNCH"] in (0, 3))
          and (launch < ptx.find("ld.global") and (prefetch == -1 or launch < prefetch)) == at_start
          and any(op in ptx[launch:] for op in ("st.global", "atom.global", "red.global")) == (consts["LAUNCH"] != 2)
          and (not consts["PREFETCH"] or "setp.eq.u32 first_thread, tid, 0" in ptx)
          and (consts["STAGES"] == 0 or "cp.async.cg.shared.global" in ptx[wait:launch]))  # the pipeliner's copies
sig = dict(Parts="*fp32", Squares="*fp32", Pos="*i64", Cos="*fp32", Sin="*fp32", QNorm="*bf16", KNorm="*bf16",
           Keys="*bf16", Values="*bf16", Acc="*fp32", M="*fp32", L="*fp32", Count="*i32", Out="*bf16",
           **dict.fromkeys(["rows", "n_total", "hidden", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot",
                            "o_row"], "i32"), eps="fp32", scale="fp32", Ahead1="*bf16", ahead1_bytes="i32",
           Ahead2="*bf16", ahead2_bytes="i32", ahead_share="i32",
           **dict.fromkeys(["HEADS", "KV_HEADS", "GROUP_PAD", "D", "QKV_SPLITS", "SPLITS", "BLOCK_N", "QK_NORM",
                            "ROPE_SHIFT", "APPEND", "IEEE", "MERGE_BLOCK", "PDL", "MASK_PAD", "KV_PREFETCH",
                            "TOGETHER", "AHEAD", "NEW_KV_IN_REGISTERS", "POSITION_BEFORE_WAIT",
                            "PAST_KV_BEFORE_WAIT", "LAUNCH_AT_START", "PAST_KV_BEFORE_QUERIES"], "constexpr"))
off = dict(KV_PREFETCH=False, TOGETHER=False, AHEAD=False, NEW_KV_IN_REGISTERS=False, POSITION_BEFORE_WAIT=False,
           PAST_KV_BEFORE_WAIT=False, LAUNCH_AT_START=True, PAST_KV_BEFORE_QUERIES=False)
for variant in (dict(off, NEW_KV_IN_REGISTERS=True), off, dict(off, KV_PREFETCH=True, TOGETHER=True),
                dict(off, AHEAD=True, NEW_KV_IN_REGISTERS=True), dict(off, POSITION_BEFORE_WAIT=True),
                dict(off, PAST_KV_BEFORE_WAIT=True, LAUNCH_AT_START=False), dict(off, PAST_KV_BEFORE_QUERIES=True)):
    consts = dict(HEADS=16, KV_HEADS=8, GROUP_PAD=16, D=128, QKV_SPLITS=8, SPLITS=32, BLOCK_N=64, QK_NORM=True,
                  ROPE_SHIFT=0, APPEND=True, IEEE=False, MERGE_BLOCK=16, PDL=True, MASK_PAD=True, **variant)
    ptx = triton.compile(ASTSource(_attention, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    # the position from L2 and its RoPE rows before the wait, or after it; the chunk's first K/V block before it too
    # (here one 2-byte load a value: the strides are not marked aligned)
    wait, early = ptx.find("griddepcontrol.wait"), variant["POSITION_BEFORE_WAIT"] or variant["PAST_KV_BEFORE_WAIT"]
    print("reads", (-1 < ptx.find("ld.global.cg.b64") < wait) == early and (ptx.count("ld.global", 0, wait) >= 3) == early
          and (ptx.count("ld.global.b16", 0, wait) >= 64) == variant["PAST_KV_BEFORE_WAIT"]
          # the chunk's first K/V block read after the wait ahead of the queries' partial sums (136 4-byte loads here;
          # RoPE's rows may come first: 2 such loads under Triton 3.9, 20 under 3.6), or after them
          and (ptx.count("ld.global.b32", wait, ptx.find("ld.global.b16", wait)) < 64) == variant["PAST_KV_BEFORE_QUERIES"]
          # the O product let launch once, at the kernel's start or after its wait
          and ptx.count("griddepcontrol.launch_dependents") == 1
          and (ptx.find("griddepcontrol.launch_dependents") < wait) == variant["LAUNCH_AT_START"])
    # the chunk's partials written by all threads (a barrier), then counted by one atomic released and acquired at
    # the GPU's scope; the merge reads the other programs' partials from L2, past this SM's L1
    count, prefetch = ptx.find("atom.global.gpu.acq_rel.add"), ptx.find("cp.async.bulk.prefetch.L2")
    ahead = ptx.find("cp.async.bulk.prefetch.L2", ptx.rfind("mma"))  # the MLP's weights, once the chunk's K/V are read
    print("attention", "griddepcontrol.wait" in ptx and count > -1 and "ld.global.cg" in ptx[count:]
          and ptx.rfind("st.global", 0, count) < ptx.rfind("bar.sync", 0, count) and "mma" in ptx
          # K/V, one request each, before the first product; the MLP's weights in two parts, where a chunk is read
          # (before its count) and in the programs past the chunks
          and ptx.count("cp.async.bulk.prefetch.L2") == 2 * variant["KV_PREFETCH"] + 4 * variant["AHEAD"]
          and (not variant["KV_PREFETCH"] or prefetch < ptx.find("mma")) and (not variant["AHEAD"] or -1 < ahead < count))
sig = dict(Parts="*fp32", Squares="*fp32", Pos="*i64", Cos="*fp32", Sin="*fp32", QNorm="*bf16", KNorm="*bf16", Q="*bf16",
           Keys="*bf16", Values="*bf16", rows="i32", n_total="i32", hidden="i32", eps="fp32",
           **dict.fromkeys(["k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"], "i32"),
           **dict.fromkeys(["HEADS", "KV_HEADS", "D", "SPLITS", "QK_NORM", "ROPE_SHIFT", "APPEND", "PDL"], "constexpr"))
consts = dict(HEADS=16, KV_HEADS=8, D=128, SPLITS=8, QK_NORM=True, ROPE_SHIFT=0, APPEND=True, PDL=True)
ptx = triton.compile(ASTSource(_rope_append, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("rope_append", "griddepcontrol.wait" in ptx)
# the three launches' kernels that ask L2 for the MLP's weights (UNFOLDED_AHEAD_IN): the split-KV programs once
# their chunk's products are done, the merge's right after its wait, before its loads; or neither
from harness.kernels.fused_decode import _merge_ahead, _split_kv_ahead
ahead = dict(Ahead1="*bf16", ahead1_bytes="i32", Ahead2="*bf16", ahead2_bytes="i32", ahead_share="i32")
for asks in (True, False):
    sig = dict(Q="*bf16", K="*bf16", V="*bf16", Pos="*i64", Acc="*fp32", M="*fp32", L="*fp32", scale="fp32",
               **dict.fromkeys(["q_row", "q_head", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"], "i32"),
               **ahead, **dict.fromkeys(["GROUP", "GROUP_PAD", "D", "BLOCK_N", "SPLITS", "IEEE", "AHEAD", "PDL"],
                                        "constexpr"))
    consts = dict(GROUP=2, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=32, IEEE=False, AHEAD=asks, PDL=True)
    ptx = triton.compile(ASTSource(_split_kv_ahead, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    asked = ptx.find("cp.async.bulk.prefetch.L2")
    print("split_kv", ptx.count("cp.async.bulk.prefetch.L2") == 2 * asks and "griddepcontrol.wait" in ptx
          and (not asks or ptx.rfind("mma") < asked))
    sig = dict(Acc="*fp32", M="*fp32", L="*fp32", Out="*bf16", o_row="i32", o_head="i32", **ahead,
               **dict.fromkeys(["HEADS", "D", "SPLITS", "AHEAD", "PDL"], "constexpr"))
    consts = dict(HEADS=16, D=128, SPLITS=32, AHEAD=asks, PDL=True)
    ptx = triton.compile(ASTSource(_merge_ahead, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    asked, wait = ptx.find("cp.async.bulk.prefetch.L2"), ptx.find("griddepcontrol.wait")
    print("merge", ptx.count("cp.async.bulk.prefetch.L2") == 2 * asks and -1 < wait
          and (not asks or wait < asked < ptx.find("ld.global", wait)))
# fused.tma: the weight tiles copied by the tensor memory accelerator into shared memory after the PDL wait (with the
# input the kernel before wrote), read there by Hopper's wgmma (`_matvec`'s pass through registers and ldmatrix);
# the first tiles asked of L2 before the wait where PREFETCH; packed (gate/up: SwiGLU) and row-major (down: adds);
# where FIRST, the split's first tile copied before the wait, the pipeliner's copies after it
from harness.kernels.fused_decode import _matvec_tma
for product in (dict(NORM=True, OUTPUT=1, SPLITS=1, PACKED=True, PREFETCH=True, FIRST=False, Out="*bf16"),
                dict(NORM=False, OUTPUT=3, SPLITS=8, PACKED=False, PREFETCH=False, FIRST=False, Out="*fp32"),
                dict(NORM=True, OUTPUT=1, SPLITS=1, PACKED=True, PREFETCH=False, FIRST=True, Out="*bf16")):
    sig = {**ptrs, "X": "*fp32", "Out": product.pop("Out"), "Wdesc": "tensordesc<bf16[64, 128]>",
           **{k: v for k, v in ints.items() if k != "prefetch_ahead"}, "eps": "fp32",
           **dict.fromkeys(["INPUT", "NORM", "OUTPUT", "SPLITS", "BUMP", "ROWS", "BN", "BK", "PACKED", "DOT", "PDL",
                            "STAGES", "PREFETCH", "LAUNCH", "FIRST"], "constexpr")}
    consts = dict(INPUT=0, BUMP=False, ROWS=16, BN=64, BK=128, DOT=True, PDL=True, STAGES=3, LAUNCH=1, **product)
    ptx = triton.compile(ASTSource(_matvec_tma, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=8)).asm["ptx"]
    wait, copy, launch = (ptx.find(op) for op in ("griddepcontrol.wait", "cp.async.bulk.tensor",
                                                  "griddepcontrol.launch_dependents"))
    after = ptx.find("cp.async.bulk.tensor", wait)
    print("tma", (copy < wait) == product["FIRST"] and wait < after < launch and "wgmma.mma_async" in ptx[after:launch]
          and (-1 < ptx.find("cp.async.bulk.prefetch.L2") < wait) == product["PREFETCH"])
"""


def test_the_fused_kernels_compile_for_the_h200_with_programmatic_dependent_launch():
    """The interpreter checks the arithmetic on CUDA cores; Triton's compiler, run ahead of time for sm_90 (no GPU
    needed), checks that each kernel builds as the H200 runs it: bf16 tensor-core products, atomics, PDL's waits."""
    printed = compiled_for_the_gpu("import triton\n" + AOT_COMPILE, timeout=900).split()
    assert printed == (["matvec", "True", "order", "True"] * 14 + ["reads", "True", "attention", "True"] * 7
                       + ["rope_append", "True"] + ["split_kv", "True", "merge", "True"] * 2 + ["tma", "True"] * 3)


def test_each_paired_variant_sets_only_kernel_constants_that_are_restored_before_the_next(monkeypatch):
    """benchmarks/fused_prefetch.py: a variant's constant that fused_decode does not have, or that the set does not put
    back to its default before the next variant is planned, would leave a step measured as another than its label
    says (a misspelt name is set beside the real one, silently)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_prefetch

    for name, variants in fused_prefetch.SETS.items():
        for label, _, constants in variants:
            assert set(constants) <= set(fused_prefetch.DEFAULTS), (name, label)
    assert {"study", "big_tma"} <= set(fused_prefetch.SETS)  # the pairs docs/benchmarks.md asks of the next lease


def test_each_attention_variant_runs_the_plan_its_label_names_where_the_rule_would_choose_another(fused_prefetch):
    """benchmarks/fused_prefetch.py --set attention: "folded at any prefix" folds where the rule would not (K/V under
    its bound, a small share of the MLP asked), each unfolded variant runs three launches where the rule would fold,
    and asks L2 from the kernel its label names; a variant whose constants left the rule's answer in place would time
    one plan twice under two names."""
    workloads = [("qwen3-1.7b", 512), ("qwen3-8b", 1024), ("qwen3-0.6b", 1024)]  # under the K/V bound; 2.1%; folded
    asked_by = {"merge": "by the merge", "split": "by the split-KV", "": "none of the MLP's weights"}
    for label, overrides, constants in fused_prefetch.ATTENTION_VARIANTS[1:]:
        fused_prefetch.set_constants(constants)
        fold = "fused.fold_attention=false" not in overrides
        assert [_folded_at(model, 1, context, fold_attention=fold) for model, context in workloads] == [fold] * 3, label
        assert fold or asked_by[fused_decode.UNFOLDED_AHEAD_IN] in label


def test_each_unfolded_chunks_variant_runs_three_launches_aimed_at_the_programs_its_label_names(fused_prefetch):
    """benchmarks/fused_prefetch.py --set unfolded_chunks: each unfolded variant runs three launches where the rule
    would fold (Qwen3-0.6B at context 1024), and its grid aims at the programs its label names; "folded at any prefix"
    folds where the rule would not (context 768)."""
    variants = fused_prefetch.SETS["unfolded_chunks"]
    fused_prefetch.set_constants(variants[1][2])
    assert _folded_at("qwen3-0.6b", 1, 768) and "fused.fold_attention=false" not in variants[1][1]
    for label, overrides, constants in variants[2:]:
        fused_prefetch.set_constants(constants)
        assert not _folded_at("qwen3-0.6b", 1, 1024, fold_attention="fused.fold_attention=false" not in overrides)
        assert label.endswith(f"its chunks for {fused_decode.UNFOLDED_ATTENTION_PROGRAMS} programs"), label


def test_each_attention_warps_variant_sets_both_attention_plans_to_the_warps_and_stages_its_label_names(
        fused_prefetch):
    """benchmarks/fused_prefetch.py --set attention_warps: each variant sets the split-KV's and the folded kernel's
    warps and stages alike, as its label says, and only the variant labelled the default is the code's default."""
    for label, overrides, constants in fused_prefetch.SETS["attention_warps"]:
        fused_prefetch.set_constants(constants)
        warps, stages = fused_decode.SPLIT_KV_WARPS, fused_decode.SPLIT_KV_STAGES
        assert (fused_decode.FOLDED_ATTENTION_WARPS, fused_decode.FOLDED_ATTENTION_STAGES) == (warps, stages), label
        assert f"on {warps} warps, {stages} stages" in label and not overrides, label
        defaults = all(constants[name] == fused_prefetch.DEFAULTS[name] for name in constants)
        assert defaults == label.endswith("(the default)"), label


def test_a_set_whose_design_was_taken_out_says_so_in_one_line_and_names_the_commit_that_runs_it():
    """benchmarks/fused_prefetch.py --set waits (a design taken out, docs/benchmarks.md "the designs taken out"): one
    line naming the commit where it still runs, not a traceback, and no set of that name left here to run another step
    under its label."""
    done = subprocess.run([sys.executable, "benchmarks/fused_prefetch.py", "--set", "waits", "model=tiny"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith("--set waits: its design was taken out of the code; it runs at commit f561a71")


def test_a_variant_verified_runs_as_a_harness_job_with_its_own_constants_and_no_other_variants(monkeypatch,
                                                                                           fused_prefetch):
    """benchmarks/fused_prefetch.py --verify: the job runs in this process with the variant's constants set, and every
    other constant back at its default (a constant left from a variant set before would verify another step than the
    one named), on the command line given, with the variant's own overrides."""
    seen = {}

    def job(argv):
        seen.update(argv=argv, **{name: getattr(fused_decode, name) for name in fused_prefetch.DEFAULTS})
        return 3

    monkeypatch.setattr(fused_prefetch, "cli_main", job)
    fused_decode.TMA_STAGES = 7  # as a variant set before would leave it
    variant = fused_prefetch.SETS["big_tma"][6]
    assert fused_prefetch.verify(["model=tiny", "bs=1"], variant) == 3  # the job's exit status
    assert seen["argv"] == ["-m", "mode=fused", "model=tiny", "bs=1"]
    assert seen["GATE_UP_TILE_COLUMNS"] == 32 and seen["TMA_KINDS"] == ("gate_up", "down", "lm_head")
    assert seen["TMA_STAGES"] == fused_prefetch.DEFAULTS["TMA_STAGES"] != 7
    tma_off = fused_prefetch.SETS["tma"][0]  # a variant with an override of its own
    fused_prefetch.verify(["model=tiny"], tma_off)
    assert seen["argv"] == ["-m", "mode=fused", "model=tiny", "fused.tma=false"]
    assert seen["GATE_UP_TILE_COLUMNS"] == fused_prefetch.DEFAULTS["GATE_UP_TILE_COLUMNS"]


def test_the_occupancy_table_plans_as_a_gpu_does_and_counts_the_programs_an_sm_holds(monkeypatch):
    """benchmarks/fused_occupancy.py: a product's programs an SM are bounded by its registers (allocated a warp at a
    time, in units of 256), its threads and its shared memory; the plans are a GPU's (fused.slices for gate/up, down
    and lm_head at bs=1), not the interpreter's tiles; a kernel is compiled with its arguments specialised as the JIT
    specialises the step's launch; and a product compiled for sm_90 reports what ptxas gave it."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy as occupancy

    assert occupancy.programs_an_sm(125, 8, 36864) == 2  # 16 registers' units a warp: 16 warps, two programs
    assert occupancy.programs_an_sm(100, 1, 0) == 19  # 3200 registers a warp take 3328: 19 warps, not 20
    assert occupancy.programs_an_sm(80, 4, 32) == 6 and occupancy.programs_an_sm(48, 4, 32) == 10
    assert occupancy.programs_an_sm(32, 4, 0) == 16  # threads: 2048 an SM
    assert occupancy.programs_an_sm(16, 1, 0) == 32  # programs: 32 an SM
    assert occupancy.programs_an_sm(32, 4, 100 * 1024) == 2  # shared memory: 228 KB an SM
    # compiled as the JIT specialises the step's launch: a batch of one compiled in, multiples of 16 marked so (without
    # them Triton cannot prove a 16-byte load aligned and reads the weights two bytes at a time)
    ones, aligned = occupancy.specialised({"rows": 1, "k_total": 2048, "n_total": 3, "prefetch_bytes": 0})
    assert ones == {"rows": 1} and aligned == [*occupancy.POINTERS, "k_total", "prefetch_bytes"]
    # Llama-3.2-1B as the rules planned it before its large products streamed through TMA: sliced (the study's set)
    monkeypatch.setattr(fused_decode, "TMA_LARGE_FROM_HIDDEN", 1 << 30)
    monkeypatch.setattr(fused_decode, "COPIES_FIRST_FROM_HIDDEN", 1 << 30)
    cfg = compose_single_run(["mode=fused", "model=llama-3.2-1b"])
    products = occupancy.step_products(cfg.model, 1, FusedOptions())
    assert occupancy.launch_sizes("gate_up", products["gate_up"], 1) == dict(
        x_row=2048, rows=1, k_total=2048, n_total=16384, out_cols=8192, k_per_split=2048, k_tiles=1, prefetch_bytes=0,
        prefetch_ahead=0)
    assert [p.choice.slices for p in products.values()] == [False, False, True, True, True]
    assert products["gate_up"].grid == (2048, 1) and products["qkv"].grid == (48, 8)
    # compiled for sm_90 in a process of its own (this one's kernels run in Triton's interpreter)
    script = ("import json, sys; sys.path.insert(0, 'benchmarks'); import fused_occupancy as o; "
              "from harness.cli.precheck import compose_single_run; from harness.kernels.fused_decode import "
              "FusedOptions; import harness.kernels.fused_decode as d; "
              "d.TMA_LARGE_FROM_HIDDEN = d.COPIES_FIRST_FROM_HIDDEN = 1 << 30; "
              "cfg = compose_single_run(['mode=fused', 'model=llama-3.2-1b']); "
              "p = o.step_products(cfg.model, 1, FusedOptions()); print(json.dumps(o.occupancy_rows("
              "{'down': p['down']}, 1)))")
    printed = compiled_for_the_gpu(script)
    (down,) = json.loads(printed.splitlines()[-1])
    assert down["kind"] == "down" and down["programs"] == 2048 and 32 <= down["registers"] <= 255
    assert down["wide_loads"] == 8  # a thread's 64 weights (4 rows x 2048 / 128 threads) as 16-byte loads, all before
    # the wait (unspecialised, the same kernel compiled none: a weight at a time)
    assert down["per_sm"] == occupancy.programs_an_sm(down["registers"], 4, down["shared"])
    assert down["waves"] == pytest.approx(2048 / (down["per_sm"] * 132))


def variant_products(monkeypatch, model, constants: dict, rows: int = 1, options: FusedOptions = FusedOptions()):
    """`model`'s step products at `rows` batch rows as the GPU would plan them under a benchmarks/fused_prefetch.py
    variant's constants, every other constant at its default (set_constants' rule; monkeypatch puts all back). The
    test puts benchmarks/ on the path first."""
    import fused_occupancy
    import fused_prefetch

    for constant, value in {**fused_prefetch.DEFAULTS, **constants}.items():
        monkeypatch.setattr(fused_decode, constant, value)
    return fused_occupancy.step_products(model, rows, options)


def test_the_big_tma_set_streams_the_kinds_it_names_and_the_occupancy_table_compiles_their_tma_kernel(monkeypatch):
    """benchmarks/fused_prefetch.py --set big_tma: each variant plans the small model's large products (the rules'
    slices) as tiles through TMA, as tiles through registers, or sliced, as its name says, and leaves QKV and O to the
    rules; benchmarks/fused_occupancy.py compiles a TMA product as `_matvec_tma`, whose stages' tiles are its shared
    memory, and which asks for no weight before its wait."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy as occupancy
    import fused_prefetch

    big = {"gate_up", "down", "lm_head"}
    streamed_and_sliced = [(set(), big), (big, set()), ({"gate_up"}, {"down", "lm_head"}),
                           ({"down"}, {"gate_up", "lm_head"}), ({"lm_head"}, {"gate_up", "down"}), (big, set()),
                           (big, set()), (set(), set()), (set(), big)]  # the last, the rules: 1024 wide, sliced
    cfg = compose_single_run(["mode=fused", "model=qwen3-0.6b"])
    variants = fused_prefetch.SETS["big_tma"]
    assert len(variants) == len(streamed_and_sliced)

    def planned(model, constants, rows=1):
        return variant_products(monkeypatch, model, constants, rows)

    for (name, _, constants), (streamed, sliced) in zip(variants, streamed_and_sliced):
        products = planned(cfg.model, constants)
        assert {kind for kind, p in products.items() if p.descriptor is not None} == streamed, name
        assert {kind for kind, p in products.items() if p.choice.slices} == sliced, name
        assert {p.stages for p in products.values() if p.descriptor is not None} <= ({4} if "4 stages" in name
                                                                                      else {3}), name
        # gate/up never splits: 96 programs of 64 columns (Qwen3-0.6B's 6144), twice as many of 32
        assert products["gate_up"].grid[0] == (192 if "32-column" in name else 96) or "gate_up" in sliced, name
    # In a model 2048 wide the rules stream the large products through TMA on four stages, as the set's fastest
    # variant on Llama-3.2-1B did, and leave QKV and O as tiles through registers; the rules before sliced them
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    for constants in (variants[-1][2], variants[5][2]):
        products = planned(llama, constants)
        assert {kind: p.stages for kind, p in products.items() if p.descriptor is not None} == dict.fromkeys(big, 4)
        assert not any(p.choice.slices for p in products.values())
    assert {kind for kind, p in planned(llama, variants[0][2]).items() if p.choice.slices} == big
    # at every batch (at bs=8 they were tiles through registers before); held to one row, a variant, they are so again
    assert {kind for kind, p in planned(llama, {}, rows=8).items() if p.descriptor} == big
    assert not any(p.descriptor for p in planned(llama, dict(TMA_LARGE_MAX_ROWS=1), rows=8).values())
    assert not any(p.descriptor for p in planned(llama, variants[7][2]).values())  # tiles through registers
    # compiled for sm_90 in a process of its own (this one's kernels run in Triton's interpreter)
    script = ("import json, sys; sys.path.insert(0, 'benchmarks'); import fused_occupancy as o, fused_prefetch as f; "
              "from harness.cli.precheck import compose_single_run; from harness.kernels import fused_decode as d; "
              "[setattr(d, n, v) for n, v in f.SETS['big_tma'][2][2].items()]; "
              "cfg = compose_single_run(['mode=fused', 'model=qwen3-0.6b']); "
              "p = o.step_products(cfg.model, 1, d.FusedOptions()); print(json.dumps(o.occupancy_rows("
              "{'gate_up': p['gate_up']}, 1)))")
    printed = compiled_for_the_gpu(script)
    (gate_up,) = json.loads(printed.splitlines()[-1])
    assert "TMA 3 stages" in gate_up["plan"] and gate_up["programs"] == 6144 // 64  # never split: 96 column blocks
    assert gate_up["shared"] >= 3 * 64 * 128 * 2  # three bf16 64 x 128 tiles in flight (`_matvec` holds none there)
    assert gate_up["wide_loads"] == 0 and gate_up["wave_mb"] == 0  # its copies come after the wait
    assert gate_up["per_sm"] == occupancy.programs_an_sm(gate_up["registers"], 8, gate_up["shared"])


def test_the_persistent_chain_computes_the_fp32_chain_each_way_and_loads_its_weights_where_it_says(monkeypatch):
    """benchmarks/persistent_chain.py: the chain of products as a launch a product and as one persistent kernel
    (here one program, whose barriers each wait for its own arrivals) computes the chain in fp32; each product counts
    one arrival a program; a barrier that counts a program that never arrives gives up and says so; and compiled for
    sm_90, the persistent kernel loads the next product's weights between its arrival and its wait only where it
    says so (the rotated loop's order in the PTX)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import persistent_chain as chained

    chain = chained.Chain.random(2, 32, 64, "cpu")
    reference = chain.fp32()
    runs = {"launches": lambda: chained.run_launches(chain, 2, False),
            "persistent, loaded early": lambda: chained.run_persistent(chain, 1, True, spin_limit=4),
            "persistent, loaded late": lambda: chained.run_persistent(chain, 1, False, spin_limit=4)}
    for name, run in runs.items():
        chain.down.zero_()
        run()
        torch.testing.assert_close(chain.down, reference, rtol=1e-4, atol=1e-5, msg=name)
        assert int(chain.failed) == 0, name  # no barrier waited for an arrival that never came
    assert int(chain.count) == 2 * 4  # two layers of four products, one program
    chained.run_persistent(chain, 1, True, spin_limit=4, counted=2)
    assert int(chain.failed) == 1
    script = ("import sys, json; sys.path.insert(0, 'benchmarks'); import persistent_chain as c; "
              "print(json.dumps([c.persistent_ptx(True), c.persistent_ptx(False)]))")
    printed = compiled_for_the_gpu(script)
    for early, ptx in zip((True, False), json.loads(printed.splitlines()[-1])):
        release = ptx.index("gpu.release.add")  # a product's arrival, then (the loop rotated) the next one's wait
        between = ptx[release:ptx.index("gpu.acquire", release)]
        assert ("ld.global.v4" in between) == early  # the next product's rows, 16 bytes a load (x's are .cg, later)


@pytest.mark.parametrize("fold_attention", [True, False], ids=["folded", "three-launches"])
def test_the_per_kernel_profile_names_each_launch_of_the_step_as_the_decoder_plans_it(fold_attention, monkeypatch):
    """benchmarks/fused_kernels.py names a step's kernels by their place in it: a layer's names must be as many as the
    decoder launches a layer, the attention folded or not, and each product is charged its own weights' bytes."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_kernels

    _, _, decoder = fused_and_eager("model.num_hidden_layers=3", options=FusedOptions(pdl=False,
                                                                                      fold_attention=fold_attention))
    names = fused_kernels.layer_kernels(decoder)
    assert len(names) * len(decoder.layers) + 1 == decoder.kernels_per_step() and len(set(names)) == len(names)
    layer, fp32 = decoder.layers[0], 4
    assert fused_kernels.weight_bytes(decoder)[fused_kernels.O] == 3 * fp32 * layer.o.n * layer.o.k


def test_the_per_kernel_profile_charges_each_kernel_only_the_time_it_adds_to_the_steps_path(monkeypatch):
    """Under PDL a kernel starts inside the one before: benchmarks/fused_kernels.py charges each kernel how far its end
    lies past the latest end before it (an idle gap before it included), so that the shares sum to the span, and says
    how long it ran beside the kernel before. Charging whole durations would count the overlap twice; charging from
    its own start would lose the gap."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_kernels

    # a kernel alone; one starting 2 µs inside it; one ending inside that one; one after a 1 µs gap
    ranges = [(0.0, 10.0), (8.0, 15.0), (12.0, 14.0), (16.0, 20.0)]
    shares, head_starts = fused_kernels.path_times(ranges)
    assert shares == [10.0, 5.0, 0.0, 5.0] and sum(shares) == ranges[-1][1] - ranges[0][0]
    assert head_starts == [0.0, 2.0, 2.0, 0.0]
    assert fused_kernels.path_times([(0.0, 4.0), (4.0, 9.0)]) == ([4.0, 5.0], [0.0, 0.0])  # no PDL: whole durations


def test_a_profiled_variant_plans_the_step_its_set_names_and_a_bad_one_is_refused_in_one_line(fused_prefetch):
    """benchmarks/fused_kernels.py --variant attention:1 profiles the folded attention where the rule would unfold it
    (its constants set in fused_decode, as fused_prefetch.py's pairs set them); attention:2 adds the switch that
    unfolds it; a set or index that does not exist is one line naming what would be valid."""
    import fused_kernels  # on the path by the fixture

    assert fused_kernels.variant_overrides("attention:1") == [] and _folded_at("qwen3-0.6b", 1, 768)
    assert fused_kernels.variant_overrides("attention:2") == ["fused.fold_attention=false"]
    fused_kernels.variant_overrides("attention:0")
    assert not _folded_at("qwen3-0.6b", 1, 768)  # the rule's constants back: 3.7 MB of K/V, under its bound
    for bad in ("attention:9", "attention", "nosuch:0"):
        with pytest.raises(SystemExit, match=f"^--variant {bad}: give SET:I, a set of .*attention.*chunks"):
            fused_kernels.variant_overrides(bad)


def test_the_tma_first_set_copies_before_the_wait_and_streams_qkv_and_o_only_where_its_names_say(monkeypatch):
    """benchmarks/fused_prefetch.py --set tma_first on Llama-3.2-1B (2048 wide): each variant copies the first tile
    before the PDL wait, asks L2 for the first tiles, streams QKV and O through TMA too, or lets the large products
    launch the next kernel at their wait, as its name says, and changes nothing else of the rules' plan."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)  # the GPU's plan (prefetch needs inline PTX)
    import fused_prefetch

    big = {"gate_up", "down", "lm_head"}
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    for name, extra, constants in fused_prefetch.SETS["tma_first"]:
        products = variant_products(monkeypatch, llama, constants,
                                    options=FusedOptions(prefetch="fused.prefetch=true" in extra))
        streamed = big | ({"qkv", "o"} if "QKV and O" in name else set())
        assert {kind: p.stages for kind, p in products.items() if p.descriptor} == dict.fromkeys(streamed, 4), name
        assert fused_decode.TMA_FIRST_BEFORE_WAIT == bool(re.search(r"first tile\b", name)), name
        assert all((p.prefetch_bytes > 0) == ("asked of L2" in name) for p in products.values()), name
        launches = {kind: fused_decode.launch_point(p) for kind, p in products.items()}
        assert launches == {kind: fused_decode.AT_WAIT if "at their wait" in name and kind in big
                            else fused_decode.AFTER_LOOP for kind in products}, name


COPIES_FIRST_COMPILE = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import mangle_type
from harness.kernels.tma_before_wait import GluonASTSource, _matvec_copies_first, descriptor, launch_arguments
# gate/up (normed, SwiGLU), down (split 8 ways, added atomically), lm_head (normed logits, the position bumped), QKV
# (layer 0's: the embedding's row; split 4 ways, normed partial sums) and O (split 8 ways, letting the next kernel
# launch at its wait), each on 4 stages; gate/up summing each tile as it reads it; and, on 4 warps (the rule's),
# Qwen3-0.6B's gate/up in 32-column blocks and its down split 8 ways in 32-column blocks (3 tiles a split)
for x, out, n, k, splits, input, output, norm, bump, launch, each, bn, warps in (
        ("*fp32", "*bf16", 8192, 2048, 1, 0, 1, True, False, 1, False, 64, 8),
        ("*bf16", "*fp32", 2048, 8192, 8, 0, 3, False, False, 1, False, 64, 8),
        ("*fp32", "*fp32", 1024, 2048, 1, 0, 2, True, True, 1, False, 64, 8),
        ("*bf16", "*fp32", 3072, 2048, 4, 1, 0, True, False, 1, False, 64, 8),
        ("*bf16", "*fp32", 2048, 2048, 8, 0, 3, False, True, 0, False, 64, 8),
        ("*fp32", "*bf16", 8192, 2048, 1, 0, 1, True, False, 1, True, 64, 8),
        ("*fp32", "*bf16", 6144, 1024, 1, 0, 1, True, False, 1, False, 32, 4),
        ("*bf16", "*fp32", 1024, 3072, 8, 0, 3, False, False, 1, False, 32, 4)):
    packed = descriptor(torch.zeros(bn * 16 * 8, 128, dtype=torch.bfloat16), bn, 128)
    sizes, consts = launch_arguments(bn, 128, n, k, splits, 4, n // 2 if output == 1 else n, input=input, norm=norm,
                                     bump=bump, output=output, launch=launch, pdl=True, sum_each_tile=each)
    types = dict(X=x, Ids="*i64", ResOut="*fp32", Gain="*bf16", Wdesc=mangle_type(packed), Out=out,
                 SquaresOut="*fp32", Bump="*i64", **dict.fromkeys(sizes, "i32"), eps="fp32",
                 **dict.fromkeys(consts, "constexpr"))
    sig = {name: types[name] for name in _matvec_copies_first.arg_names}
    ptx = triton.compile(GluonASTSource(_matvec_copies_first, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=warps)).asm["ptx"]
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    print(ptx.count("cp.async.bulk.tensor", 0, wait), ptx.count("cp.async.bulk.tensor", wait, launch),
          ptx.count("ld.global", 0, wait), -1 < wait < launch, ptx.count("cp.async.bulk.tensor", launch),
          ptx.count("atom.global") + ptx.count("red.global") > 0, consts["SPLIT_TILES"], sizes["k_per_split"])
"""


def test_the_large_products_start_every_stage_copying_before_the_pdl_wait_and_read_their_input_after_it():
    """harness/kernels/tma_before_wait.py compiled for the H200 (Triton's ahead-of-time compiler, no GPU): each
    program's four stages are copied before `griddepcontrol.wait`, the stages copied again in the loop after it, no
    load of the input (which the kernel before writes; at layer 0 the input id naming the embedding's row) before it;
    the next kernel let launch after the loop, or at the wait where the launch point says so (O's: every copy in the
    loop then comes after the launch); down's and O's splits add their sums atomically, whole tiles each (8 of 64,
    QKV's 4 of 16, Qwen3-0.6B's down 3 of 24); the rule's builds on 4 warps in 32-column blocks copy the same. A
    copy left after the wait, as Triton's pipeliner places `_matvec_tma`'s, would fail. What it computes is checked
    on the GPU (tests/test_gpu.py)."""
    printed = compiled_for_the_gpu(COPIES_FIRST_COMPILE, timeout=900).split()
    assert printed == (["4", "1", "0", "True", "0", "False", "16", "2048"]
                       + ["4", "1", "0", "True", "0", "True", "8", "1024"]
                       + ["4", "1", "0", "True", "0", "False", "16", "2048"]
                       + ["4", "1", "0", "True", "0", "False", "4", "512"]
                       + ["4", "0", "0", "True", "1", "True", "2", "256"]
                       + ["4", "1", "0", "True", "0", "False", "16", "2048"]
                       + ["4", "1", "0", "True", "0", "False", "8", "1024"]
                       + ["4", "1", "0", "True", "0", "True", "3", "384"])


def test_the_copies_first_rule_takes_one_packed_row_of_the_large_products_on_a_gpu_and_its_set_says_which(
        monkeypatch):
    """TMA_COPIES_BEFORE_WAIT plans Llama-3.2-1B's gate/up, down and lm_head (and no other product) as the Gluon
    kernel at one row with packed weights, on a GPU's plan only: at two rows (the kernel computes one), with
    row-major weights (its tiles are packed ones), or in Triton's interpreter (which runs no Gluon) they stay
    `_matvec_tma`'s; QKV and O take it only where a variant names them (this set plans as it ran, before QKV's
    copies came first), and every kind where the rule is widened to them; O lets such a gate/up launch at O's PDL
    wait, and another at O's rule (after its loop). Each
    variant of `--set copies_first` sets the rule, the stages and where O lets gate/up launch as its name says; the
    sets measured before the rule plan as they ran (`_matvec_tma` on 4 stages)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_prefetch

    big = {"gate_up", "down", "lm_head"}
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    for name, _, constants in fused_prefetch.SETS["copies_first"]:
        products = variant_products(monkeypatch, llama, constants)
        first = "before the PDL wait" in name
        assert {kind for kind, p in products.items() if p.copies_first} == (big if first else set()), name
        assert {p.stages for kind, p in products.items() if kind in big} == {3 if "3 stages" in name else 4}, name
        assert fused_decode.TMA_COPIES_BEFORE_WAIT == first and first != ("rules before" in name), name
        assert all(isinstance(p.descriptor, tma_before_wait.TensorDescriptor) == p.copies_first
                   for p in products.values()), name
        o_launches = re.search(r"O launching gate/up at its (wait|start)", name)
        layer = fused_decode.FusedDecoder._o_launch(fused_decode.Layer(None, products["qkv"], None, None, products["o"],
                                                                       None, products["gate_up"], products["down"]))
        assert fused_decode.launch_point(layer.o) == {None: fused_decode.AFTER_LOOP, "wait": fused_decode.AT_WAIT,
                                                      "start": fused_decode.AT_START}[o_launches and o_launches[1]], name
    for name, _, constants in fused_prefetch.SETS["tma_first"][:1] + fused_prefetch.SETS["large_tiles"][:1]:
        products = variant_products(monkeypatch, llama, constants)
        assert not any(p.copies_first for p in products.values()) and products["down"].stages == 4, name
    copies_first = dict(TMA_COPIES_BEFORE_WAIT=True)
    every_kind = variant_products(monkeypatch, llama, dict(copies_first, TMA_LARGE_KINDS=fused_decode.PRODUCT_KINDS))
    assert {kind for kind, p in every_kind.items() if p.copies_first} == set(fused_decode.PRODUCT_KINDS)
    assert not any(p.copies_first for p in variant_products(monkeypatch, llama, copies_first, rows=2).values())
    row_major = variant_products(monkeypatch, llama, copies_first, options=FusedOptions(packed=False))
    assert not any(p.copies_first for p in row_major.values()) and row_major["gate_up"].descriptor is not None
    monkeypatch.setattr(fused_decode, "TMA_COPIES_BEFORE_WAIT", True)
    monkeypatch.setattr(fused_decode, "TMA_LARGE_FROM_HIDDEN", 64)  # the tiny model's width, planned interpreted
    _, _, decoder = fused_and_eager()
    assert decoder.layers[0].down.descriptor is not None and not decoder.layers[0].down.copies_first


def test_the_qkv_o_first_set_copies_the_kinds_it_names_before_their_wait_all_their_split_s_tiles(monkeypatch):
    """benchmarks/fused_prefetch.py --set qkv_o_first on Llama-3.2-1B at one row: QKV and O run as the Gluon kernel
    where a variant names them (TMA_COPIES_FIRST_SMALL_KINDS), each program's stages its split's tiles (QKV 4 of 16
    in 4 splits, 2 in 8; O 2 in 8), or fewer where the variant caps them; the large products keep the 3 stages of
    the rules before, or the stages the variant names; O lets gate/up launch at its wait as the rule says; each tile
    is summed as it is read where the name says. The rule plans as the variant measured as it (QKV's and the large
    products' copies on 2 stages); at two rows QKV and O stay `_matvec`'s tiles through registers (no descriptor)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_prefetch

    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    for name, _, constants in fused_prefetch.SETS["qkv_o_first"]:
        products = variant_products(monkeypatch, llama, constants)
        named = {kind for kind in ("qkv", "o") if re.search(rf"\b{'QKV' if kind == 'qkv' else 'O'}\b.*before", name)}
        assert {kind for kind, p in products.items() if p.copies_first} == named | {"gate_up", "down", "lm_head"}, name
        capped = int(re.search(r"wait, (\d) stages?", name)[1]) if re.search(r"wait, \d stage", name) else 4
        split_tiles = dict(qkv=2 if "2 programs an SM" in name else 4, o=2)
        assert {kind: p.stages for kind, p in products.items() if kind in named} == {
            kind: min(capped, split_tiles[kind]) for kind in named}, name
        large = re.search(r"large products on (\d) stage", name)
        assert {products[kind].stages for kind in ("gate_up", "down", "lm_head")} == {int(large[1]) if large else 3}, \
            name
        assert products["qkv"].splits == (8 if "2 programs an SM" in name else 4), name
        assert all(products[kind].descriptor is None for kind in {"qkv", "o"} - named), name
        assert fused_decode.TMA_COPIES_FIRST_SUM_EACH_TILE == ("summed as it is read" in name), name
        layer = fused_decode.FusedDecoder._o_launch(fused_decode.Layer(None, products["qkv"], None, None, products["o"],
                                                                       None, products["gate_up"], products["down"]))
        assert fused_decode.launch_point(layer.o) == fused_decode.AT_WAIT, name
    rule = variant_products(monkeypatch, llama, {})  # the rule: QKV's and the large products' copies on 2 stages
    assert {kind: p.stages for kind, p in rule.items() if p.copies_first} == dict(qkv=2, gate_up=2, down=2, lm_head=2)
    assert rule["o"].descriptor is None
    measured = {name: constants for name, _, constants in fused_prefetch.SETS["qkv_o_first"]}[
        "QKV copied before the PDL wait, 2 stages, the large products on 2 stages too"]
    rule_then = variant_products(monkeypatch, llama, fused_prefetch.BEFORE_REACH)  # (on 8 warps; 4 since)
    assert {k: str(p) for k, p in variant_products(monkeypatch, llama, measured).items()} == {
        k: str(p) for k, p in rule_then.items()}
    both = fused_prefetch.SETS["qkv_o_first"][3][2]
    two_rows = variant_products(monkeypatch, llama, both, rows=2)
    assert not any(p.copies_first for p in two_rows.values()) and two_rows["qkv"].descriptor is None


def test_the_copies_first_reach_set_takes_the_rule_to_the_widths_and_warps_its_names_say(monkeypatch):
    """benchmarks/fused_prefetch.py --set copies_first_reach: "from 1024 wide" plans Qwen3-0.6B's large products (the
    rules' slices) and QKV as the Gluon kernel, or only those the name keeps, gate/up in the blocks, QKV in the
    splits and each product on the stages it names; "at every width" plans every product of Qwen3-8B so (O too,
    which the rules before left to `_matvec_tma`), on the warps and stages it names; "on 4 warps" changes Llama-3.2-1B's
    copies-first products' warps and nothing else (Llama-3.2-1B, 2048 wide, takes a "from 1024" variant's kinds); O
    lets gate/up launch after its loop where the name says. A variant that does not reach a model (a narrower one on
    Qwen3-8B) plans it as the rules before did, but for the kinds whose blocks or stages it sets by kind, which any
    tiles take. The rule since plans each model as the variant measured fastest on it, and Qwen3-0.6B at 8 rows as
    before."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_prefetch

    models = {name: compose_single_run(["mode=fused", f"model={name}"]).model
              for name in ("qwen3-0.6b", "llama-3.2-1b", "qwen3-8b")}
    variants = fused_prefetch.SETS["copies_first_reach"]
    rules = {model: variant_products(monkeypatch, cfg, variants[0][2]) for model, cfg in models.items()}  # (before)
    assert not any(p.copies_first for p in rules["qwen3-0.6b"].values())
    assert not any(p.copies_first for p in rules["qwen3-8b"].values())
    large = {"gate_up", "down", "lm_head"}
    for name, _, constants in variants[1:-1]:
        planned = {model: variant_products(monkeypatch, cfg, constants) for model, cfg in models.items()}
        narrow, llama, wide = planned["qwen3-0.6b"], planned["llama-3.2-1b"], planned["qwen3-8b"]
        first = {kind for kind, p in narrow.items() if p.copies_first}
        if name.startswith("from 1024"):
            assert first == ({"qkv"} if "QKV alone" in name else large if "large products alone" in name
                             else large | {"qkv"}), name
            if "QKV alone" in name:
                assert {kind: str(narrow[kind]) for kind in large} == {kind: str(rules["qwen3-0.6b"][kind])
                                                                       for kind in large}, name
            assert narrow["gate_up"].bn == (32 if "32-column" in name else 64 if "gate_up" in first else 16), name
            assert narrow["qkv"].splits == (8 if "2 programs an SM" in name else 4), name  # (qkv_one_an_sm)
            every = "every split's tiles" in name
            assert {kind: p.stages for kind, p in narrow.items() if kind in first and kind != "qkv"} == {
                kind: (3 if "3 stages" in name else 2 if kind == "lm_head" or not every
                       else narrow[kind].k_tiles // narrow[kind].splits)
                for kind in first - {"qkv"}}, name
        else:
            assert {k: str(p) for k, p in narrow.items()} == {k: str(p) for k, p in rules["qwen3-0.6b"].items()}, name
        if name.startswith("at every width"):
            assert all(p.copies_first for p in wide.values()), name
            assert {p.warps for p in wide.values()} == {4 if "4 warps" in name else 8}, name
            assert {p.stages for kind, p in wide.items() if kind != "qkv" or "3 stages" in name} == {
                3 if "3 stages" in name else 2}, name
            assert wide["qkv"].splits == (4 if "2 programs an SM" in name else 2), name
        else:
            by_kind = set(constants.get("TMA_STAGES_OF", {})) | ({"gate_up"} if "32-column" in name else set())
            kept = set(wide) - by_kind  # (any width's tiles take the blocks and stages set by kind)
            assert {k: str(wide[k]) for k in kept} == {k: str(rules["qwen3-8b"][k]) for k in kept}, name
        copies_first = {kind for kind, p in llama.items() if p.copies_first}
        assert copies_first == (first if name.startswith("from 1024") else  # (the kinds it keeps: 2048 wide too)
                                large | {"qkv"} | ({"o"} if name.startswith("at every width") else set())), name
        assert {llama[kind].warps for kind in copies_first} == {4 if "4 warps" in name else 8}, name
        layer = fused_decode.FusedDecoder._o_launch(fused_decode.Layer(None, llama["qkv"], None, None, llama["o"],
                                                                       None, llama["gate_up"], llama["down"]))
        at_wait = "gate_up" in copies_first and "after its loop" not in name  # (O's wait for such a gate/up alone)
        assert fused_decode.launch_point(layer.o) == (fused_decode.AT_WAIT if at_wait else fused_decode.AFTER_LOOP), \
            name
    # the rule since plans each model as the variant measured fastest on it, and as the rules' defaults do; Qwen3-0.6B
    # at 8 rows as before it (one row only)
    by_name = {name: constants for name, _, constants in variants}
    fastest = {"qwen3-0.6b": "from 1024 wide, gate/up in 32-column blocks, on 4 warps",
               "qwen3-8b": "at every width, on 4 warps", "llama-3.2-1b": "the copies-first kernel on 4 warps"}
    for model, name in fastest.items():
        rule = {k: str(p) for k, p in variant_products(monkeypatch, models[model], variants[-1][2]).items()}
        assert rule == {k: str(p) for k, p in variant_products(monkeypatch, models[model], by_name[name]).items()}
        assert rule == {k: str(p) for k, p in variant_products(monkeypatch, models[model], {}).items()}
    eight_rows = [{k: str(p) for k, p in variant_products(monkeypatch, models["qwen3-0.6b"], constants, 8).items()}
                  for constants in (variants[0][2], {})]
    assert eight_rows[0] == eight_rows[1]


def test_the_large_tiles_set_reshapes_only_the_large_products_and_splits_k_as_its_names_say(monkeypatch):
    """benchmarks/fused_prefetch.py --set large_tiles on Llama-3.2-1B: the tile shapes and stages a variant names go
    to gate/up, down and lm_head alone (QKV and O, under three times as wide as deep, keep 64 x 128), and the split
    variants change the splits of the products that split, not their tiles."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)
    import fused_prefetch

    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    planned = {}
    for name, _, constants in fused_prefetch.SETS["large_tiles"]:
        planned[name] = variant_products(monkeypatch, llama, constants)
    rules, *variants = planned.values()
    for name, products in zip(list(planned)[1:], variants):
        shape = re.match(r"64 x (\d+) tiles, (\d+) stages", name)
        for kind in ("gate_up", "down", "lm_head"):
            bk, stages = (int(shape[1]), int(shape[2])) if shape else (128, 4)
            assert (products[kind].bn, products[kind].bk, products[kind].stages) == (64, bk, stages), (name, kind)
        assert [(p.bn, p.bk) for p in (products["qkv"], products["o"])] == [(64, 128)] * 2, name
    one, four = planned["K split for 1 program an SM"], planned["K split for 4 programs an SM, up to 16 ways"]
    # (the rules split QKV for one program an SM at bs=1 in this model since the set measured it: four ways)
    assert one["qkv"].splits == rules["qkv"].splits == 4 < four["qkv"].splits and four["down"].splits == 16
    assert one["gate_up"].splits == rules["gate_up"].splits == four["gate_up"].splits == 1  # never split


def test_qkv_splits_for_one_program_an_sm_at_bs1_only_where_a_tma_rule_reaches(monkeypatch):
    """The rules split QKV's K for one program an SM (four tiles a program) in Llama-3.2-1B and Qwen3-1.7B at bs=1, as
    paired on an H200 and an H100, and in Qwen3-0.6B and Qwen3-4B at bs=1 where the copies-first rule takes them
    (before it, for two); for two (two tiles) at bs=8; O keeps its splits; the `qkv_splits` set's variants plan the
    rules before and the rule at every batch size. fused.tma=false (the plan before the large products' rule and
    this one) splits it for two."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setattr(fused_decode, "interpreted", lambda: False)
    import fused_prefetch

    def splits(model, rows, constants=None, tma=True):
        products = variant_products(monkeypatch, compose_single_run(["mode=fused", f"model={model}"]).model,
                                    constants or {}, rows, FusedOptions(tma=tma))
        return products["qkv"].grid, products["o"].grid

    assert splits("llama-3.2-1b", 1) == ((48, 4), (32, 8)) and splits("llama-3.2-1b", 8) == ((48, 8), (32, 8))
    assert splits("qwen3-1.7b", 1) == ((64, 4), (32, 8)) and splits("qwen3-1.7b", 8) == ((64, 8), (32, 8))
    # where the copies-first rule reaches them at one row (1024 and 2560 wide), as measured with it; before, 2 an SM
    assert splits("qwen3-0.6b", 1)[0] == (64, 4) and splits("qwen3-4b", 1)[0] == (96, 2)
    before_reach = fused_prefetch.BEFORE_REACH
    assert splits("qwen3-0.6b", 1, before_reach)[0] == (64, 8) and splits("qwen3-4b", 1, before_reach)[0] == (96, 4)
    assert splits("qwen3-0.6b", 8)[0] == (64, 8) and splits("qwen3-4b", 8)[0] == (96, 4)
    assert splits("llama-3.2-1b", 1, dict(fused_prefetch.BEFORE_REACH, TMA_FROM_HIDDEN=2048))[0] == (48, 8)  # where
    # neither the large rule nor the copies-first rule's width holds
    assert splits("llama-3.2-1b", 1, tma=False)[0] == (48, 8)
    before, every = (variant[2] for variant in fused_prefetch.SETS["qkv_splits"][1:])
    assert splits("llama-3.2-1b", 1, before)[0] == (48, 8) and splits("llama-3.2-1b", 8, every)[0] == (48, 4)
