"""mode=fused: its kernels (in Triton's interpreter here) against eager and fp32, the job verified, the faults that a
fused kernel can hide failing the run, and what the config refuses before anything is built."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from unittest import mock

import pytest
import torch
import triton
import triton.language as tl

from harness import models
from harness.cli.precheck import compose_single_run
from harness.config.fused import FUSED_SWITCHES, FusedConfig
from harness.errors import ConfigError
from harness.kernels.fused import copies_first, pdl
from harness.kernels.fused import decoder as fused_decoder
from harness.kernels.fused import plan as fused_plan
from harness.kernels.fused import products as fused_products
from harness.kernels.fused.attention import attention_chunks, attention_folded, one_chunk_max_slots
from harness.kernels.fused.decoder import FusedDecoder, Layer
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import (AFTER_LOOP, AT_END, AT_WAIT, HOPPER_SMS, PRODUCT_KINDS, PlanChoice, Product,
                                        blocks_and_splits, launch_point, pack, pair_blocks, plan, plan_swiglu,
                                        prefetch_bytes, slice_values, split_count)
from harness.kernels.triton_decode import BLOCK_N, splits_for
from harness.measure.job import measure, seeded_prompt
from harness.modes.base import Stepper
from tests.support import FAST, REPO, compiled_for_the_gpu, run_config

FUSED = (*FAST, "device=cpu", "dtype=fp32", "bs=2", "mode=fused")
LLAMA = ("model.model_type=llama", "+model.extra.rope_scaling={rope_type: llama3, factor: 8.0, high_freq_factor: 4.0, "
         "low_freq_factor: 1.0, original_max_position_embeddings: 16}")  # tiny's sizes, Llama-3's layer and RoPE
LARGE = {"gate_up", "down", "lm_head"}  # the large products' kinds (Knobs.tma_large_kinds)
# the attention's grid for the cache's capacity, not the longest prefix: no prefix short enough for one chunk
CAPACITY_GRID = dataclasses.replace(KNOBS, one_chunk_max_slots=0, one_chunk_max_slots_narrow=0)


def tiny_model_and_prompt(*overrides: str):
    """A fused run's config, its tiny fp32 model and a seeded prompt of two rows."""
    cfg = run_config(*FUSED, *overrides)
    model = models.get_model(cfg.model, "fp32", cfg.attn, torch.device("cpu"), 0).model
    return cfg, model, seeded_prompt(2, cfg.context_len, model.config.vocab_size, 0, torch.device("cpu"))


def fused_and_eager(*overrides: str, options=FusedConfig(pdl=False), knobs=KNOBS):
    """A tiny fp32 model's eager stepper and a fused decoder (planned with `knobs`) over a second prefilled cache of
    the same prompt."""
    cfg, model, prompt = tiny_model_and_prompt(*overrides)
    eager, run = Stepper(model, prompt, cfg.cache_len), Stepper(model, prompt, cfg.cache_len)
    return eager, run, FusedDecoder(model, run.cache, run.static_ids, options, knobs)


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


def gpu_products(monkeypatch, model_cfg, knobs=KNOBS, rows: int = 1, options=None) -> dict[str, Product]:
    """`model_cfg`'s step products at `rows` batch rows as a GPU's rules plan them with `knobs` (fused.* at
    `options`, the defaults where None): benchmarks/fused_occupancy.py's step_products, which its table plans with."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy

    return fused_occupancy.step_products(model_cfg, rows, options or FusedConfig(), knobs)


def o_launch(products: dict[str, Product]) -> int:
    """Where a step's O product lets the next kernel launch, as the decoder sets it beside its layer's gate/up."""
    layer = FusedDecoder._o_launch(Layer(None, products["qkv"], None, None, products["o"], None, products["gate_up"],
                                         products["down"]))
    return launch_point(layer.o)


@pytest.mark.parametrize("family", [(), LLAMA], ids=["qwen3", "llama"])
@pytest.mark.parametrize("options", [FusedConfig(pdl=False), FusedConfig(pdl=False, split_k=False, packed=False),
                                     FusedConfig(pdl=False, fold_attention=False)],
                         ids=["split-packed", "plain", "attention-unfolded"])
def test_the_fused_step_computes_eager_decode_logits_and_cache(family, options):
    eager, run, decoder = fused_and_eager(*family, options=options)
    assert eager.model.config.model_type == ("llama" if family else "qwen3")
    assert decoder.layers[0].down.splits > 1 if options.split_k else decoder.layers[0].down.splits == 1
    start = eager.context_len
    decode_like_eager(eager, run, decoder, 4)
    assert_same_cache(run, eager, start + 4, length=start + 4)  # the new tokens' K/V, appended where eager's are


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "row-major"])
def test_products_whose_tiles_stream_through_tma_compute_eager_logits(packed, monkeypatch):
    """Every kind of product through `_matvec_tma` (in the interpreter a descriptor reads the same boxes the copy
    engine would), over splits of several tiles each, packed tiles or row-major rows whose last block passes the
    weight's edge: the same logits and cache as eager's, step after step."""
    # tiny's hidden size 64: the rule applies; 4 tiles of K, 2 a split
    knobs = dataclasses.replace(KNOBS, tma_from_hidden=64, interpreted_k=16, max_splits=2)
    launched = []
    monkeypatch.setattr(fused_products, "_matvec_tma", _Recording(fused_products._matvec_tma, launched))
    eager, run, decoder = fused_and_eager("model.vocab_size=1000", options=FusedConfig(pdl=False, packed=packed),
                                          knobs=knobs)
    products = decoder.products()
    assert all(p.descriptor is not None and p.stages == knobs.tma_stages for p in products.values())  # few programs
    assert products["qkv"].k // products["qkv"].bk // products["qkv"].splits >= 2
    assert products["lm_head"].n % products["lm_head"].bn  # its last block passes the edge (zeros: packed or TMA's)
    assert products["gate_up"].bn == knobs.interpreted_columns
    start = eager.context_len
    decode_like_eager(eager, run, decoder, 3)
    assert_same_cache(run, eager, start + 3, length=start + 3)
    assert len(launched) == 3 * (4 * len(decoder.layers) + 1)  # every product of every step


def test_tma_keeps_two_tiles_in_flight_where_that_brings_a_product_into_one_wave_and_three_elsewhere(monkeypatch):
    """An 8B model's products as the rule plans them on a Hopper GPU (132 SMs) from two rows: three stages for
    Qwen3-8B's QKV and gate/up (384 programs: one wave at three an SM), two for its O and down (512) and for
    Llama-3.1-8B's gate/up (448), which two bring into one wave, and three again for lm_head (thousands: several waves
    either way); Qwen3-4B (2560 wide) streams too; fused.tma off, or a model narrower than tma_from_hidden (2048
    wide), streams nothing. At one row the copies-first rule takes the 8B model's products (QKV and O too)."""
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan: 64 x 128 tiles, tensor cores
    options, wide = FusedConfig(), KNOBS.tma_from_hidden
    weight = lambda n, k: torch.empty(n, k, dtype=torch.bfloat16, device="meta")  # noqa: E731 (shapes only)

    def planned(n, k, kind, hidden=wide, options=options, rows=2):  # (at one row the copies-first rule reaches them)
        return plan(weight(n, k), options, KNOBS, kind in ("qkv", "o", "down"), rows, hidden, kind=kind)

    gate_up = plan_swiglu(weight(12288, 4096), weight(12288, 4096), options, KNOBS, 2, wide)
    assert (gate_up.grid, gate_up.stages) == ((384, 1), 3)
    assert [(p.grid[0] * p.grid[1], p.stages) for p in (planned(6144, 4096, "qkv"), planned(4096, 4096, "o"),
                                                       planned(4096, 12288, "down"), planned(151936, 4096, "lm_head"))
            ] == [(384, 3), (512, 2), (512, 2), (2374, 3)]
    llama_gate_up = plan_swiglu(weight(14336, 4096), weight(14336, 4096), options, KNOBS, 2, wide)
    assert (llama_gate_up.grid[0], llama_gate_up.stages) == (448, 2)
    assert planned(4096, 4096, "o", options=FusedConfig(tma=False)).descriptor is None
    assert planned(4096, 4096, "o", hidden=wide // 2).descriptor is None
    # Qwen3-4B (2560 wide: every product tiles) streams; Qwen3-1.7B and Llama-3.2-1B (2048) keep the registers for
    # QKV from two rows (at one, QKV copies its tiles first: copies_first.py's kernel, copies_first_small_kinds)
    qwen3_4b = plan_swiglu(weight(9728, 2560), weight(9728, 2560), options, KNOBS, 2, 2560)
    assert (qwen3_4b.grid, qwen3_4b.stages, qwen3_4b.descriptor is not None) == ((304, 1), 3, True)
    assert plan(weight(4096, 2048), options, KNOBS, True, 2, 2048, kind="qkv").descriptor is None
    assert planned(4096, 2048, "qkv", hidden=2048, rows=1).copies_first
    assert all(planned(*shape, rows=1).copies_first for shape in ((6144, 4096, "qkv"), (4096, 4096, "o")))
    fp32 = plan(torch.empty(4096, 4096, device="meta"), options, KNOBS, True, 1, wide, kind="o")
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


def test_the_attention_query_tile_padding_never_reaches_the_output():
    """The folded attention's query tile has 16 rows for a group of fewer heads: the padding rows (masked: zero
    queries) are computed and never stored; the logits are eager's."""
    eager, run, decoder = fused_and_eager(*LLAMA)
    assert decoder.heads // decoder.kv_heads < 16  # there is padding
    decode_like_eager(eager, run, decoder, 2)


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


def test_a_bs1_fused_job_past_one_chunk_runs_the_attention_as_three_launches_and_verifies():
    """The rule in a job: a bs=1 run whose longest prefix passes one chunk a KV head (384 slots for the tiny model's
    heads of 16; its K/V ask L2 for none of its MLP) launches seven kernels a layer, computes what fp32 does, and its
    plan tag says why."""
    result = measure(run_config(*FUSED, "bs=1", "context_len=390", "cache_len=448"))
    m, plan_tag = result.metrics, result.mode_tags["fused_plan"]
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert m["kernel_launches_per_step"] == 7 * 2 + 1 and m["attention_chunks_per_kv_head"] > 1
    assert ("; attention: three launches (bs=1 past one chunk a KV head, under 4.0 MiB of K/V or 7% of the MLP's "
            "weights asked ahead)") in plan_tag  # and none asked by its merge: a CPU has no bulk prefetch
    assert result.mode_tags["fused"].startswith("pdl=off split_k=on packed=on prefetch=off fold_attention=on")


def test_a_gate_up_sliced_on_eight_warps_lets_the_next_kernel_launch_after_its_stores(monkeypatch):
    """launch_point's rule (a gate/up sliced on eight warps lets the next kernel launch only after its stores, so that
    the next kernel's programs take none of its slots while its own run; a gate/up sliced on four warps or tiled, and
    the other products, after their weight loop), the point a step sets over it, the point passed to the kernel, and
    each of a step's products knowing its kind."""
    gate, up = torch.randn(64, 2048, dtype=torch.bfloat16), torch.randn(64, 2048, dtype=torch.bfloat16)

    def gate_up(warps: int, slices: bool = True, kind: str = "gate_up"):
        choice = PlanChoice(2, warps=warps, slices=slices)
        product = plan_swiglu(gate, up, FusedConfig(pdl=False), KNOBS, 1, 2048, choice=choice)
        return dataclasses.replace(product, kind=kind)

    assert launch_point(gate_up(8)) == AT_END
    assert launch_point(gate_up(4)) == launch_point(gate_up(8, slices=False)) == launch_point(
        gate_up(8, kind="down")) == AFTER_LOOP
    launched = {}
    monkeypatch.setattr(fused_products, "_matvec", mock.MagicMock(**{"__getitem__.return_value": (
        lambda *args, **kwargs: launched.update(kwargs))}))
    fused_products.launch_product(gate_up(8), torch.zeros(1, 2048), torch.zeros(1, 64), 1,
                                  output=fused_products.SWIGLU)
    assert launched["LAUNCH"] == AT_END and launched["num_warps"] == 8
    fused_products.launch_product(dataclasses.replace(gate_up(8), launch=AT_WAIT), torch.zeros(1, 2048),
                                  torch.zeros(1, 64), 1, output=fused_products.SWIGLU)
    assert launched["LAUNCH"] == AT_WAIT
    _, _, decoder = fused_and_eager()
    assert {kind: product.kind for kind, product in decoder.products().items()} == {
        kind: kind for kind in PRODUCT_KINDS}


@pytest.mark.parametrize("steps_after_prompt, one_chunk", [(60, True), (200, False)],
                         ids=["one-chunk", "chunks-and-merge"])
def test_a_fused_run_logs_its_attention_chunks_a_kv_head(steps_after_prompt, one_chunk):
    """The attention's grid as the run planned it, from the longest prefix it decodes to: 100 slots of context and
    60 steps after them (161 slots), one chunk a KV head; 200 steps after them (301 slots), the grid for about 264
    programs, several chunks and their merge."""
    from harness.modes.fused import FusedStepper

    cfg, model, prompt = tiny_model_and_prompt("context_len=100", "cache_len=320")
    stepper = FusedStepper(model, prompt, cfg.cache_len, FusedConfig(pdl=False), steps_after_prompt=steps_after_prompt)
    chunks = stepper.metrics["attention_chunks_per_kv_head"]
    assert chunks == stepper.decoder.attn_acc.shape[2] == attention_chunks(
        KNOBS, 2, model.config.num_key_value_heads, 100 + steps_after_prompt + 1, KNOBS.attention_programs,
        model.config.head_dim)
    assert (chunks == 1) == one_chunk


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
    from harness.kernels.fused.greedy import GreedyFeed

    block = KNOBS.greedy_block
    vocab = 151936  # Qwen3's: 50 programs of 3 loads, the last program short
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    logits[0, [5, block + 5]] = 9.0  # equal largest in two loads of one program
    logits[1, [3 * block + 7, 9 * block + 1]] = 9.0  # in two programs
    logits[2, [11, 12]] = 9.0  # in one load
    logits[3, vocab - 1] = 9.0  # the last logit
    ids, tokens = torch.full((4, 1), -1, dtype=torch.long), torch.full((4,), -1, dtype=torch.long)
    greedy = GreedyFeed(logits, ids, pdl=False)
    assert (greedy.programs, greedy.span) == (50, 3 * block)
    greedy(tokens)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 3 * block + 7, 11, vocab - 1]
    assert ids[:, 0].tolist() == tokens.tolist()  # fed: the next step's input
    assert greedy.count.tolist() == [0] * 4  # each row's count back to 0 for the next step
    logits[1, 2 * block + 3], logits[3] = float("nan"), float("-inf")
    greedy(tokens)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 2 * block + 3, 11, 0]


def test_a_fused_graph_of_several_steps_sizes_its_attention_for_whole_replays():
    """The attention's chunks are sized for the longest prefix a timed step reaches: with graph_steps=256 the
    decode is a replay of 256 steps from the window's first slot, past one chunk's slots, where its tokens alone are
    not."""
    from harness.modes.fused import FusedMode

    cfg, model, prompt = tiny_model_and_prompt("graph_steps=256", "cache_len=null")
    replays = FusedMode().prepare(model, prompt, cfg)  # 8 + 2 + 256 + 1 slots
    assert one_chunk_max_slots(KNOBS, cfg.bs, model.config.head_dim) < 8 + 2 + 256 + 1
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


def test_a_model_1024_wide_slices_128_values_a_thread_and_a_wider_one_64(monkeypatch):
    """The slice rule: at one row, in a model 1024 wide (Qwen3-0.6B) each thread holds 128 of a slice's values, twice
    the rows a program of 64 would take; in one 2048 wide (Llama-3.2-1B) 64, its gate/up still sliced on eight warps
    (as tiles it was faster at one workload and slower at others: docs/fused-knobs.md). (fp32 weights here: 16-bit
    ones of a model 2048 wide stream through TMA as tiles, the large products' rule, test_fused_tune.)"""
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan
    wide, narrow = torch.zeros(8192, 2048), torch.zeros(3072, 1024)
    sliced = plan_swiglu(narrow, narrow, FusedConfig(), KNOBS, 1, 1024)
    assert sliced.choice.slices and (sliced.warps, sliced.bk) == (4, 1024) and sliced.bn == 128 * 4 * 32 // 1024
    down = plan(torch.zeros(1024, 3072), FusedConfig(), KNOBS, True, 1, 1024, kind="down")
    assert (down.bn, down.bk, down.splits) == (128 * 4 * 32 // 2048, 2048, 2)
    gate_up = plan_swiglu(wide, wide, FusedConfig(), KNOBS, 1, 2048)
    assert gate_up.choice.slices and (gate_up.warps, gate_up.bk, gate_up.bn) == (8, 2048, 64 * 8 * 32 // 2048)
    assert [slice_values(KNOBS, h) for h in (0, 1024, 2048)] == [64, 128, 64]  # 0: the model's size not given


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


@triton.jit
def _parts_of_each_program(Out, bytes1, bytes2, share):
    """What _weights_to_l2 asks L2 for in each program, written out: (first, length) in each of the two weights."""
    program = tl.program_id(0)
    start = program * share
    first, length = pdl._range_part(start, start + share, 0, bytes1)
    tl.store(Out + program * 4 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, first, length))
    first, length = pdl._range_part(start, start + share, bytes1, bytes1 + bytes2)
    tl.store(Out + program * 4 + 2 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, first, length))


@pytest.mark.parametrize("budget_from_down, asker", [(0.5, "folded"), (4.0, "folded"), (4.0, "merge")])
def test_the_attention_asks_l2_for_the_mlp_weights_once_each_within_the_budget(monkeypatch, budget_from_down, asker):
    """fused.weights_ahead: the programs' shares of gate/up's then down's weights cover the budget's bytes once each
    (none twice, none past a weight's end), each a whole number of the bulk prefetch's 16 bytes, in the folded
    attention's grid or in the three launches' merge's (one program a head); a context whose K/V alone passes the
    budget, or falls short of the floor, asks for none. (The prefetch itself is inline PTX: the sm_90 compile test
    below.)"""
    cfg, model, prompt = tiny_model_and_prompt("context_len=40", "cache_len=64")
    run = Stepper(model, prompt, cfg.cache_len)
    for module in (fused_plan, fused_decoder):  # the plan as a GPU's, computed here
        monkeypatch.setattr(module, "interpreted", lambda: False)
    options = FusedConfig(pdl=False, fold_attention=asker == "folded")

    def planned(options=options, **knobs) -> FusedDecoder:
        return FusedDecoder(model, run.cache, run.static_ids, options, dataclasses.replace(KNOBS, **knobs),
                            longest_prefix=48)

    decoder = planned()
    assert decoder.folded == (asker == "folded")
    layer = decoder.layers[0]
    gate_up_bytes, down_bytes = (w.numel() * w.element_size() for w in (layer.gate_up.weight, layer.down.weight))
    budget = gate_up_bytes + int(down_bytes * budget_from_down) // 16 * 16
    kv_bytes = 2 * decoder.rows * decoder.kv_heads * 48 * decoder.head_dim * 4  # K and V at the longest prefix, fp32
    shorter = planned(weights_ahead_from_kv_bytes=kv_bytes + 16)  # a shorter chain than the floor
    assert shorter.weights_ahead(shorter.layers[0]) is None
    decoder = planned(weights_ahead_from_kv_bytes=kv_bytes, weights_ahead_bytes=budget)
    layer = decoder.layers[0]
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
    off = planned(dataclasses.replace(options, weights_ahead=False), weights_ahead_from_kv_bytes=kv_bytes,
                  weights_ahead_bytes=budget)
    assert off.weights_ahead(off.layers[0]) is None
    past = planned(weights_ahead_from_kv_bytes=kv_bytes, weights_ahead_bytes=kv_bytes - 16)  # its own reads pass it
    assert past.weights_ahead(past.layers[0]) is None
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
from harness.kernels.fused.attention import _attention, _merge_ahead, _rope_append, _split_kv
from harness.kernels.fused.products import _matvec, _matvec_tma


def aligned_attrs(kernel, sig, aligned):
    # the argument indices Triton's JIT marks as multiples of 16 (`aligned`: the names), in the kernel's own order
    return {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in sig if name in aligned}


ptrs = dict(X="*bf16", ResOut="*fp32", Ids="*i64", Gain="*bf16", W="*bf16", Out="*fp32", SquaresOut="*fp32", Bump="*i64")
ints = dict.fromkeys(["x_row", "rows", "k_total", "n_total", "out_cols", "k_per_split", "k_tiles", "prefetch_bytes",
                     "prefetch_ahead"], "i32")
names = ["INPUT", "NORM", "OUTPUT", "SPLITS", "BUMP", "ROWS", "BN", "BK", "PACKED", "DOT", "PDL", "PREFETCH", "ONE_TILE",
         "LAUNCH"]
products = [  # qkv of layer 0 (embedding rows, split), gate/up (SwiGLU, bf16 out), down (atomic adds), lm_head (bump)
    dict(INPUT=1, NORM=True, OUTPUT=0, SPLITS=8, BUMP=False, PACKED=True),
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=True, X="*fp32", Out="*bf16", BN=32,
         PREFETCH=True),  # its first weights asked of L2 before the wait
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=False),
    dict(INPUT=0, NORM=True, OUTPUT=2, SPLITS=1, BUMP=True, PACKED=True, X="*fp32"),
    dict(INPUT=0, NORM=True, OUTPUT=3, SPLITS=2, BUMP=False, PACKED=True, X="*fp32", W="*fp32", Gain="*fp32"),  # dtype=fp32
    # fused.slices at bs=1: gate/up's whole rows, and down's rows in splits of K added atomically, on CUDA cores
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=False, X="*fp32", Out="*bf16", ROWS=1, BN=4,
         BK=2048, DOT=False, ONE_TILE=True),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=4, BUMP=False, PACKED=False, ROWS=1, BN=4, BK=2048, DOT=False,
         ONE_TILE=True),
    # the next kernel let launch at the wait (AT_WAIT: 0, O's before a gate/up that copies first), a slice and tiles
    # in a loop; or at the end (AT_END: 2)
    dict(INPUT=0, NORM=True, OUTPUT=1, SPLITS=1, BUMP=False, PACKED=False, X="*fp32", Out="*bf16", ROWS=1, BN=4,
         BK=2048, DOT=False, ONE_TILE=True, LAUNCH=0),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=8, BUMP=False, PACKED=True, LAUNCH=0),
    dict(INPUT=0, NORM=False, OUTPUT=3, SPLITS=4, BUMP=False, PACKED=False, ROWS=1, BN=4, BK=2048, DOT=False,
         ONE_TILE=True, LAUNCH=2),
    dict(INPUT=0, NORM=True, OUTPUT=2, SPLITS=1, BUMP=True, PACKED=True, X="*fp32", LAUNCH=2),
]
for product in products:
    sig = {**ptrs, **ints, "eps": "fp32", **dict.fromkeys(names, "constexpr"), **{k: v for k, v in product.items() if isinstance(v, str)}}
    sig = {name: sig[name] for name in _matvec.arg_names}
    consts = {**dict(ROWS=16, BN=64, BK=128, DOT=True, PDL=True, PREFETCH=False, ONE_TILE=False, LAUNCH=1),
              **{k: v for k, v in product.items() if not isinstance(v, str)}}
    # as Triton's JIT specialises them on the GPU: pointers and the sizes that are multiples of 16 marked so
    aligned = [name for name, kind in sig.items() if kind.startswith("*") or name in (
        "x_row", "k_total", "n_total", "out_cols", "k_per_split", "prefetch_bytes", "prefetch_ahead")]
    ptx = triton.compile(ASTSource(_matvec, sig, consts, attrs=aligned_attrs(_matvec, sig, aligned)),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    # PDL's wait and early launch in every product, and no TF32 (an fp32 run's products are exact)
    print("matvec", "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx and "tf32" not in ptx)
    # the bulk prefetch before the wait where asked (by one thread), and the next kernel launched after the wait and
    # the weights' first loads, after the loop's loads and before the stores; or where asked at the wait, before any
    # load that follows it, or after the stores
    launch, prefetch, wait = (ptx.find(op) for op in ("griddepcontrol.launch_dependents", "cp.async.bulk.prefetch.L2",
                                                       "griddepcontrol.wait"))
    print("order", (prefetch != -1) == consts["PREFETCH"] and prefetch < wait and wait < launch
          and ptx.count("griddepcontrol.launch_dependents") == 1
          and (launch < ptx.find("ld.global", wait)) == (consts["LAUNCH"] == 0)
          and ptx.find("ld.global") < launch
          and any(op in ptx[launch:] for op in ("st.global", "atom.global", "red.global")) == (consts["LAUNCH"] != 2)
          and (not consts["PREFETCH"] or "setp.eq.u32 first_thread, tid, 0" in ptx))
sig = dict(Parts="*fp32", Squares="*fp32", Pos="*i64", Cos="*fp32", Sin="*fp32", QNorm="*bf16", KNorm="*bf16",
           Keys="*bf16", Values="*bf16", Acc="*fp32", M="*fp32", L="*fp32", Count="*i32", Out="*bf16",
           **dict.fromkeys(["rows", "n_total", "hidden", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot",
                            "o_row"], "i32"), eps="fp32", scale="fp32", Ahead1="*bf16", ahead1_bytes="i32",
           Ahead2="*bf16", ahead2_bytes="i32", ahead_share="i32",
           **dict.fromkeys(["HEADS", "KV_HEADS", "GROUP_PAD", "D", "QKV_SPLITS", "SPLITS", "BLOCK_N", "QK_NORM",
                            "ROPE_SHIFT", "APPEND", "IEEE", "MERGE_BLOCK", "PDL", "AHEAD"], "constexpr"))
sig = {name: sig[name] for name in _attention.arg_names}
for ahead in (False, True):
    consts = dict(HEADS=16, KV_HEADS=8, GROUP_PAD=16, D=128, QKV_SPLITS=8, SPLITS=32, BLOCK_N=64, QK_NORM=True,
                  ROPE_SHIFT=0, APPEND=True, IEEE=False, MERGE_BLOCK=16, PDL=True, AHEAD=ahead)
    ptx = triton.compile(ASTSource(_attention, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    # the position from L2 and its RoPE rows after the wait, and no K/V read before it (here one 2-byte load a value:
    # the strides are not marked aligned)
    wait = ptx.find("griddepcontrol.wait")
    print("reads", not (-1 < ptx.find("ld.global.cg.b64") < wait) and ptx.count("ld.global", 0, wait) < 3
          and ptx.count("ld.global.b16", 0, wait) < 64
          # the queries' partial sums read after the wait ahead of the chunk's first K/V block (136 4-byte loads
          # here; RoPE's rows may come first: 2 such loads under Triton 3.9, 20 under 3.6)
          and ptx.count("ld.global.b32", wait, ptx.find("ld.global.b16", wait)) >= 64
          # the O product let launch once, at the kernel's start
          and ptx.count("griddepcontrol.launch_dependents") == 1
          and ptx.find("griddepcontrol.launch_dependents") < wait)
    # the chunk's partials written by all threads (a barrier), then counted by one atomic released and acquired at
    # the GPU's scope; the merge reads the other programs' partials from L2, past this SM's L1
    count = ptx.find("atom.global.gpu.acq_rel.add")
    asked = ptx.find("cp.async.bulk.prefetch.L2", ptx.rfind("mma"))  # the MLP's weights, once the chunk's K/V are read
    print("attention", "griddepcontrol.wait" in ptx and count > -1 and "ld.global.cg" in ptx[count:]
          and ptx.rfind("st.global", 0, count) < ptx.rfind("bar.sync", 0, count) and "mma" in ptx
          # the MLP's weights in two parts, where a chunk is read (before its count) and in the programs past the
          # chunks
          and ptx.count("cp.async.bulk.prefetch.L2") == 4 * ahead and (not ahead or -1 < asked < count))
sig = dict(Parts="*fp32", Squares="*fp32", Pos="*i64", Cos="*fp32", Sin="*fp32", QNorm="*bf16", KNorm="*bf16", Q="*bf16",
           Keys="*bf16", Values="*bf16", rows="i32", n_total="i32", hidden="i32", eps="fp32",
           **dict.fromkeys(["k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"], "i32"),
           **dict.fromkeys(["HEADS", "KV_HEADS", "D", "SPLITS", "QK_NORM", "ROPE_SHIFT", "APPEND", "PDL"], "constexpr"))
consts = dict(HEADS=16, KV_HEADS=8, D=128, SPLITS=8, QK_NORM=True, ROPE_SHIFT=0, APPEND=True, PDL=True)
ptx = triton.compile(ASTSource(_rope_append, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("rope_append", "griddepcontrol.wait" in ptx)
# the three launches: the split-KV programs ask L2 for nothing; the merge asks for the MLP's weights right after its
# wait, before its loads, where AHEAD (or for nothing)
sig = dict(Q="*bf16", K="*bf16", V="*bf16", Pos="*i64", Acc="*fp32", M="*fp32", L="*fp32", scale="fp32",
           **dict.fromkeys(["q_row", "q_head", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"], "i32"),
           **dict.fromkeys(["GROUP", "GROUP_PAD", "D", "BLOCK_N", "SPLITS", "IEEE", "PDL"], "constexpr"))
consts = dict(GROUP=2, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=32, IEEE=False, PDL=True)
ptx = triton.compile(ASTSource(_split_kv, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("split_kv", "cp.async.bulk.prefetch.L2" not in ptx and "griddepcontrol.wait" in ptx)
ahead = dict(Ahead1="*bf16", ahead1_bytes="i32", Ahead2="*bf16", ahead2_bytes="i32", ahead_share="i32")
for asks in (True, False):
    sig = dict(Acc="*fp32", M="*fp32", L="*fp32", Out="*bf16", o_row="i32", o_head="i32", **ahead,
               **dict.fromkeys(["HEADS", "D", "SPLITS", "AHEAD", "PDL"], "constexpr"))
    consts = dict(HEADS=16, D=128, SPLITS=32, AHEAD=asks, PDL=True)
    ptx = triton.compile(ASTSource(_merge_ahead, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    asked, wait = ptx.find("cp.async.bulk.prefetch.L2"), ptx.find("griddepcontrol.wait")
    print("merge", ptx.count("cp.async.bulk.prefetch.L2") == 2 * asks and -1 < wait
          and (not asks or wait < asked < ptx.find("ld.global", wait)))
# fused.tma: the weight tiles copied by the tensor memory accelerator into shared memory after the PDL wait (with the
# input the kernel before wrote), read there by Hopper's wgmma (`_matvec`'s pass through registers and ldmatrix);
# the first tiles asked of L2 before the wait where PREFETCH; packed (gate/up: SwiGLU) and row-major (down: adds)
for product in (dict(NORM=True, OUTPUT=1, SPLITS=1, PACKED=True, PREFETCH=True, Out="*bf16"),
                dict(NORM=False, OUTPUT=3, SPLITS=8, PACKED=False, PREFETCH=False, Out="*fp32")):
    sig = {**ptrs, "X": "*fp32", "Out": product.pop("Out"), "Wdesc": "tensordesc<bf16[64, 128]>",
           **{k: v for k, v in ints.items() if k != "prefetch_ahead"}, "eps": "fp32",
           **dict.fromkeys(["INPUT", "NORM", "OUTPUT", "SPLITS", "BUMP", "ROWS", "BN", "BK", "PACKED", "DOT", "PDL",
                            "STAGES", "PREFETCH", "LAUNCH"], "constexpr")}
    sig = {name: sig[name] for name in _matvec_tma.arg_names}
    consts = dict(INPUT=0, BUMP=False, ROWS=16, BN=64, BK=128, DOT=True, PDL=True, STAGES=3, LAUNCH=1, **product)
    ptx = triton.compile(ASTSource(_matvec_tma, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=8)).asm["ptx"]
    wait, copy, launch = (ptx.find(op) for op in ("griddepcontrol.wait", "cp.async.bulk.tensor",
                                                  "griddepcontrol.launch_dependents"))
    print("tma", wait < copy < launch and "wgmma.mma_async" in ptx[copy:launch]
          and (-1 < ptx.find("cp.async.bulk.prefetch.L2") < wait) == product["PREFETCH"])
"""


def test_the_fused_kernels_compile_for_the_h200_with_programmatic_dependent_launch():
    """The interpreter checks the arithmetic on CUDA cores; Triton's compiler, run ahead of time for sm_90 (no GPU
    needed), checks that each kernel builds as a Hopper GPU runs it: bf16 tensor-core products, atomics, PDL's
    waits."""
    printed = compiled_for_the_gpu("import triton\n" + AOT_COMPILE, timeout=900).split()
    assert printed == (["matvec", "True", "order", "True"] * 11 + ["reads", "True", "attention", "True"] * 2
                       + ["rope_append", "True", "split_kv", "True"] + ["merge", "True"] * 2 + ["tma", "True"] * 2)


def test_a_variant_names_only_knobs_that_exist_and_reads_each_value_as_its_fields_type(monkeypatch, capsys):
    """benchmarks/fused_variants.py --variant (and fused_kernels.py's and fused_occupancy.py's --knobs: common.py's
    knobs_from): a knob that Knobs does not have would time a step under a label naming a change never made (a
    misspelt name, silently), so it ends the program with one line naming the valid knobs, as a value that is not its
    field's type does; each value is read as its field's type (a tuple as a+b), every other knob left at the rules';
    the first variant is the rules, and --study-window pairs one step a replay with one replay of 127 steps."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_variants

    overrides, variants = fused_variants.parse(["--variant", "one_chunk_max_slots=512,fold_min_ahead_share=0.1",
                                                "model=tiny", "--variant", "sliced_kinds=gate_up+down", "bs=1"])
    assert overrides == ["model=tiny", "bs=1"]
    assert [(name, extra) for name, extra, _ in variants] == [
        ("the rules", []), ("one_chunk_max_slots=512,fold_min_ahead_share=0.1", []), ("sliced_kinds=gate_up+down", [])]
    rules, chunks, sliced = (knobs for _, _, knobs in variants)
    assert rules == KNOBS
    assert chunks == dataclasses.replace(KNOBS, one_chunk_max_slots=512, fold_min_ahead_share=0.1)
    assert type(chunks.one_chunk_max_slots) is int and type(chunks.fold_min_ahead_share) is float
    assert sliced == dataclasses.replace(KNOBS, sliced_kinds=("gate_up", "down"))
    for bad, said in (("one_chunk_max_slot=512", "knob 'one_chunk_max_slot' is not one of Knobs' fields: "),
                      ("one_chunk_max_slots=many", "knob one_chunk_max_slots='many' is not a")):
        with pytest.raises(SystemExit) as exited:
            fused_variants.parse(["--variant", bad, "model=tiny"])
        message = capsys.readouterr().err
        assert exited.value.code == 2 and said in message and message.count("\n") == 1, message
        assert "one_chunk_max_slots" in message  # the valid knobs named, or the one whose value is wrong
    _, study = fused_variants.parse(["--study-window", "model=tiny"])
    assert [(extra, knobs) for _, extra, knobs in study] == [(["graph_steps=1"], KNOBS), (["graph_steps=127"], KNOBS)]


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
    # Llama-3.2-1B as the rules plan it where neither the large products' TMA rule nor the copies-first rule reaches
    # it: sliced
    sliced = dataclasses.replace(KNOBS, tma_large_from_hidden=1 << 30, copies_first_from_hidden=1 << 30)
    cfg = compose_single_run(["mode=fused", "model=llama-3.2-1b"])
    products = occupancy.step_products(cfg.model, 1, FusedConfig(), sliced)
    assert occupancy.launch_sizes("gate_up", products["gate_up"], 1) == dict(
        x_row=2048, rows=1, k_total=2048, n_total=16384, out_cols=8192, k_per_split=2048, k_tiles=1, prefetch_bytes=0,
        prefetch_ahead=0)
    assert [p.choice.slices for p in products.values()] == [False, False, True, True, True]
    assert products["gate_up"].grid == (2048, 1) and products["qkv"].grid == (48, 8)
    # compiled for sm_90 in a process of its own (this one's kernels run in Triton's interpreter)
    script = ("import dataclasses, json, sys; sys.path.insert(0, 'benchmarks'); import fused_occupancy as o; "
              "from harness.cli.precheck import compose_single_run; from harness.config.fused import FusedConfig; "
              "from harness.kernels.fused.knobs import KNOBS; "
              "k = dataclasses.replace(KNOBS, tma_large_from_hidden=1 << 30, copies_first_from_hidden=1 << 30); "
              "cfg = compose_single_run(['mode=fused', 'model=llama-3.2-1b']); "
              "p = o.step_products(cfg.model, 1, FusedConfig(), k); print(json.dumps(o.occupancy_rows("
              "{'down': p['down']}, 1)))")
    printed = compiled_for_the_gpu(script)
    (down,) = json.loads(printed.splitlines()[-1])
    assert down["kind"] == "down" and down["programs"] == 2048 and 32 <= down["registers"] <= 255
    assert down["wide_loads"] == 8  # a thread's 64 weights (4 rows x 2048 / 128 threads) as 16-byte loads, all before
    # the wait (unspecialised, the same kernel compiled none: a weight at a time)
    assert down["per_sm"] == occupancy.programs_an_sm(down["registers"], 4, down["shared"])
    assert down["waves"] == pytest.approx(2048 / (down["per_sm"] * 132))


def test_the_large_products_stream_through_tma_at_every_batch_and_the_occupancy_table_compiles_their_tma_kernel(
        monkeypatch):
    """In a model 2048 wide the rules stream the large products (gate/up, down, lm_head) through TMA from two rows
    too, on tma_large_stages, as tiles (not sliced), and leave QKV and O as tiles through registers;
    benchmarks/fused_occupancy.py compiles a product whose tiles stream through TMA as `_matvec_tma`, whose stages'
    tiles are its shared memory, and which asks for no weight before its wait."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_occupancy as occupancy

    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    eight = gpu_products(monkeypatch, llama, rows=8)
    assert {kind: p.stages for kind, p in eight.items() if p.descriptor is not None} == dict.fromkeys(
        LARGE, KNOBS.tma_large_stages)
    assert not any(p.choice.slices or p.copies_first for p in eight.values())
    # Qwen3-0.6B's gate/up as `_matvec_tma`: TMA from its width, neither sliced nor copied first
    streamed = dataclasses.replace(KNOBS, tma_from_hidden=1024, copies_first_from_hidden=1 << 30, sliced_kinds=())
    qwen3 = compose_single_run(["mode=fused", "model=qwen3-0.6b"]).model
    planned = gpu_products(monkeypatch, qwen3, streamed)["gate_up"]
    assert planned.descriptor is not None and not planned.copies_first and planned.stages == 3
    # compiled for sm_90 in a process of its own (this one's kernels run in Triton's interpreter)
    script = ("import dataclasses, json, sys; sys.path.insert(0, 'benchmarks'); import fused_occupancy as o; "
              "from harness.cli.precheck import compose_single_run; from harness.config.fused import FusedConfig; "
              "from harness.kernels.fused.knobs import KNOBS; "
              "k = dataclasses.replace(KNOBS, tma_from_hidden=1024, copies_first_from_hidden=1 << 30, "
              "sliced_kinds=()); cfg = compose_single_run(['mode=fused', 'model=qwen3-0.6b']); "
              "p = o.step_products(cfg.model, 1, FusedConfig(), k); print(json.dumps(o.occupancy_rows("
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

    _, _, decoder = fused_and_eager("model.num_hidden_layers=3", options=FusedConfig(pdl=False,
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



COPIES_FIRST_COMPILE = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import mangle_type
from harness.kernels.fused.copies_first import GluonASTSource, _matvec_copies_first, descriptor, launch_arguments
# gate/up (normed, SwiGLU), down (split 8 ways, added atomically), lm_head (normed logits, the position bumped), QKV
# (layer 0's: the embedding's row; split 4 ways, normed partial sums) and O (split 8 ways, letting the next kernel
# launch at its wait), each on 4 stages; and, on 4 warps (the rule's), Qwen3-0.6B's gate/up in 32-column blocks and
# its down split 8 ways in 32-column blocks (3 tiles a split)
for x, out, n, k, splits, input, output, norm, bump, launch, bn, warps in (
        ("*fp32", "*bf16", 8192, 2048, 1, 0, 1, True, False, 1, 64, 8),
        ("*bf16", "*fp32", 2048, 8192, 8, 0, 3, False, False, 1, 64, 8),
        ("*fp32", "*fp32", 1024, 2048, 1, 0, 2, True, True, 1, 64, 8),
        ("*bf16", "*fp32", 3072, 2048, 4, 1, 0, True, False, 1, 64, 8),
        ("*bf16", "*fp32", 2048, 2048, 8, 0, 3, False, True, 0, 64, 8),
        ("*fp32", "*bf16", 6144, 1024, 1, 0, 1, True, False, 1, 32, 4),
        ("*bf16", "*fp32", 1024, 3072, 8, 0, 3, False, False, 1, 32, 4)):
    packed = descriptor(torch.zeros(bn * 16 * 8, 128, dtype=torch.bfloat16), bn, 128)
    sizes, consts = launch_arguments(bn, 128, n, k, splits, 4, n // 2 if output == 1 else n, input=input, norm=norm,
                                     bump=bump, output=output, launch=launch, pdl=True)
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
    """harness/kernels/fused/copies_first.py compiled for sm_90 (Triton's ahead-of-time compiler, no GPU): each
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
                       + ["4", "1", "0", "True", "0", "False", "8", "1024"]
                       + ["4", "1", "0", "True", "0", "True", "3", "384"])


def test_the_copies_first_rule_takes_one_packed_row_of_the_large_products_and_qkv_on_a_gpu(monkeypatch):
    """The copies-first rule plans Llama-3.2-1B's gate/up, down and lm_head, and QKV (copies_first_small_kinds), and
    no other product, as the Gluon kernel (its own descriptor) at one row with packed weights, on a GPU's plan only:
    at two rows (the kernel computes one), with row-major weights (its tiles are packed ones), or in Triton's
    interpreter (which runs no Gluon) the large products stay `_matvec_tma`'s; every kind where the rule is widened to
    them (tma_large_kinds); O lets such a gate/up launch at O's PDL wait, and another at O's rule (after its loop)."""
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    rules = gpu_products(monkeypatch, llama)
    assert {kind for kind, p in rules.items() if p.copies_first} == LARGE | {"qkv"}
    assert all(isinstance(p.descriptor, copies_first.TensorDescriptor) == p.copies_first for p in rules.values())
    assert o_launch(rules) == AT_WAIT
    every_kind = gpu_products(monkeypatch, llama, dataclasses.replace(KNOBS, tma_large_kinds=PRODUCT_KINDS))
    assert {kind for kind, p in every_kind.items() if p.copies_first} == set(PRODUCT_KINDS)
    two_rows = gpu_products(monkeypatch, llama, rows=2)
    assert not any(p.copies_first for p in two_rows.values()) and o_launch(two_rows) == AFTER_LOOP
    row_major = gpu_products(monkeypatch, llama, options=FusedConfig(packed=False))
    assert not any(p.copies_first for p in row_major.values()) and row_major["gate_up"].descriptor is not None
    assert not any(isinstance(p.descriptor, copies_first.TensorDescriptor) for p in row_major.values())
    assert o_launch(row_major) == AFTER_LOOP
    # the tiny model's width, planned interpreted
    _, _, decoder = fused_and_eager(knobs=dataclasses.replace(KNOBS, tma_large_from_hidden=64))
    assert decoder.layers[0].down.descriptor is not None and not decoder.layers[0].down.copies_first


def test_qkv_copies_its_split_s_tiles_first_at_bs1_and_o_keeps_the_registers_in_a_2048_wide_model(monkeypatch):
    """The rules at one row in Llama-3.2-1B: QKV runs as the Gluon kernel (copies_first_small_kinds) on
    copies_first_small_stages, at most its split's tiles (QKV 4 of 16 in 4 splits; O, where a variant names it, 2 of
    16 in 8), the large products' copies on copies_first_stages, and O stays `_matvec`'s tiles through registers
    (the model is under copies_first_o_from_hidden), letting gate/up launch at its wait; at two rows QKV and O stay
    `_matvec`'s tiles through registers (no descriptor)."""
    llama = compose_single_run(["mode=fused", "model=llama-3.2-1b"]).model
    rule = gpu_products(monkeypatch, llama)
    assert {kind: p.stages for kind, p in rule.items() if p.copies_first} == dict(qkv=2, gate_up=2, down=2, lm_head=2)
    assert rule["qkv"].splits == 4 and rule["o"].descriptor is None and o_launch(rule) == AT_WAIT
    every_tile = gpu_products(monkeypatch, llama, dataclasses.replace(KNOBS, copies_first_small_kinds=("qkv", "o"),
                                                                      copies_first_small_stages=8))
    assert {kind: p.stages for kind, p in every_tile.items() if kind in ("qkv", "o")} == dict(qkv=4, o=2)
    assert every_tile["o"].copies_first and every_tile["o"].splits == 8
    two_rows = gpu_products(monkeypatch, llama, rows=2)
    assert not any(p.copies_first for p in two_rows.values())
    assert two_rows["qkv"].descriptor is None and two_rows["o"].descriptor is None


def test_the_copies_first_rule_reaches_each_width_as_its_knobs_say(monkeypatch):
    """The copies-first rule's width (copies_first_from_hidden) at one row: it plans Qwen3-0.6B's large products
    (which the slice rule would take) and QKV as the Gluon kernel, gate/up in 32-column blocks (gate/up cannot split:
    narrower blocks are its one way to more programs), QKV split for one program an SM; every product of Qwen3-8B
    (O too, from copies_first_o_from_hidden); Llama-3.2-1B's large products and QKV; each on copies_first_warps, the
    large ones on copies_first_stages; O lets such a gate/up launch at its wait. A width past a model plans it as the
    rules before it did (Qwen3-0.6B sliced, its QKV split for programs_per_sm), and Qwen3-0.6B at 8 rows is planned
    as before it."""
    models = {name: compose_single_run(["mode=fused", f"model={name}"]).model
              for name in ("qwen3-0.6b", "llama-3.2-1b", "qwen3-8b")}
    narrow, llama, wide = (gpu_products(monkeypatch, models[name]) for name in models)
    assert {kind for kind, p in narrow.items() if p.copies_first} == LARGE | {"qkv"}
    assert narrow["gate_up"].bn == 32 and narrow["qkv"].splits == 4
    assert {kind: narrow[kind].stages for kind in LARGE} == dict.fromkeys(LARGE, KNOBS.copies_first_stages)
    assert all(p.copies_first for p in wide.values()) and wide["qkv"].splits == 2
    assert {p.stages for kind, p in wide.items() if kind != "qkv"} == {2}
    assert {kind for kind, p in llama.items() if p.copies_first} == LARGE | {"qkv"}
    for products in (narrow, llama, wide):
        assert {p.warps for p in products.values() if p.copies_first} == {KNOBS.copies_first_warps}
        assert o_launch(products) == AT_WAIT
    before = dataclasses.replace(KNOBS, copies_first_from_hidden=2048)
    narrow_before = gpu_products(monkeypatch, models["qwen3-0.6b"], before)
    assert not any(p.copies_first for p in narrow_before.values())
    assert {kind for kind, p in narrow_before.items() if p.choice.slices} == LARGE
    assert narrow_before["qkv"].splits == 8 and o_launch(narrow_before) == AFTER_LOOP
    assert ({k: str(p) for k, p in gpu_products(monkeypatch, models["llama-3.2-1b"], before).items()}
            == {k: str(p) for k, p in llama.items()})  # 2048 wide: still reached
    eight_rows = [{k: str(p) for k, p in gpu_products(monkeypatch, models["qwen3-0.6b"], knobs, 8).items()}
                  for knobs in (before, KNOBS)]
    assert eight_rows[0] == eight_rows[1]


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
