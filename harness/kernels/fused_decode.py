"""mode=fused's kernels: a dense decoder layer's decode step in five Triton kernels, then one for the final norm
and lm_head.

Per layer, in launch order:
1. `_matvec` (QKV): the residual stream (fp32; at layer 0 the embedding rows of the input ids, which it writes as
   the stream's first value), times the input norm's gain, times q|k|v's packed weights; the 1/rms of the norm is a
   per-row scale, so the program sums the squares of the input it reads anyway and the consumer applies it. Out:
   fp32 partial sums (one per K split) and partial sums of squares.
2. `_attention`, one program per (row, KV head, chunk of the valid prefix): sums those, applies 1/rms, Qwen3's q/k
   RMSNorm and RoPE at the cache position to its group's queries; the chunk that holds the position appends the new
   K and V to the cache; attention over the chunk (attn=triton-decode's split-KV loop, harness/kernels/
   triton_decode.py); the last chunk of a KV head to finish merges them all. (`fused.fold_attention=false`, and at
   bs=1 past one chunk where attention_folded's rule says: the three launches it replaces, `_rope_append`,
   `_split_kv_ahead` and `_merge_ahead`: attn=triton-decode's split-KV program and merge, launched with PDL, the
   merge asking L2 for the MLP's weights as the folded attention does.)
3. `_matvec` (O): attention's output times o_proj, added to the residual stream in place.
4. `_matvec` (gate/up): the residual times the MLP norm's gain times gate|up packed in pairs of column blocks, so
   that each program finishes SiLU(gate)·up (and 1/rms) for its columns.
5. `_matvec` (down): added to the residual stream in place.
After the last layer one `_matvec` computes the final norm and the logits (fp32) and advances the cache position.

Why this shape: a decode step at small batch reads every weight once and does little with each, so what counts is
keeping HBM busy. Each kernel fuses the elementwise work around a matrix-vector product, computed on tensor cores
with the weight tile as the left operand (the batch rows, padded to 16, are the narrow side). Where a product's
column blocks are too few for the GPU its K dimension is split (the splits add atomically into the fp32 residual,
or leave partial sums that the consumer adds: no extra launch). Weights are packed at prepare time so that each
program reads its tiles as contiguous runs of 16-byte loads. With programmatic dependent launch each kernel is
scheduled while its predecessor drains, and loads its first weight tile before it waits for the predecessor's results.

At bs=1 (fused.slices) gate/up, down and lm_head take another shape: each program multiplies a few whole rows of the
weight by a split of K, loaded in one go before its PDL wait and summed on CUDA cores, so that all of its loads are in
flight at once (the register file holds them, not a loop), and a product launches thousands of programs.

`FusedOptions` turns each technique off for ablations (`fused.pdl`, `fused.split_k`, `fused.packed`, `fused.slices`).
On a machine without an NVIDIA GPU the kernels run in Triton's interpreter (fp32 products; tests).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from harness.kernels import tma_before_wait
from harness.kernels.triton_decode import (BLOCK_N as ATTN_BLOCK_N, chunk_of, chunk_softmax, TARGET_PROGRAMS,
                                           empty_softmax, kv_block, merge_head, merge_one_head, softmax_block,
                                           softmax_over, split_kv_chunk, splits_for)
from harness.kernels.triton_runtime import interpreted

# `_matvec`'s input: a buffer (any dtype), or the embedding rows of the input ids (written as the residual's value)
PLAIN, EMBEDDING = 0, 1
# its output: fp32 partial sums [splits, rows, n], SiLU(gate)·up of packed pairs, logits (norm applied), or a sum
# added to the fp32 residual stream in place (atomically where K is split)
PARTIALS, SWIGLU, LOGITS, ADD = 0, 1, 2, 3
SMS = 132  # an H200's (and H100's) streaming multiprocessors
# Programs a product aims at, per SM, splitting K where its column blocks are fewer: at bs=1 on the H200 a product
# with fewer keeps too few loads in flight for HBM (down_proj of Llama-3.2-1B, 64-column blocks: 3.8 TB/s with 4
# splits, 4.4 TB/s with 8, docs/benchmarks.md); with more, each program's loop is short (Qwen3-8B's QKV, 96 blocks,
# split 4 ways rather than 8: its step 1.4% faster, paired on one H200; "how many ways a product splits")
PROGRAMS_PER_SM = 2
MAX_SPLITS = 8
# Where even MAX_SPLITS leave SMs without a program, a product splits K up to this many ways (whole tiles a split)
# before its column blocks narrow: Qwen3-0.6B's O in 64-column blocks split 16 ways, not 32-column blocks split 8,
# took 2.1% off its step at context 1024 (paired, one H200)
WIDE_MAX_SPLITS = 16
INTERPRETED_BN, INTERPRETED_BK = 256, 32
# From this many batch rows, in a model this wide (hidden size), a product runs on FEWER_WARPS instead of tile_sizes'
# eight: at bs=32 Qwen3-8B's step took 6.0% less on four, where Qwen3-0.6B's took 7.4% more and Llama-3.2-1B's 3.2%
# more, paired on one H200 each (docs/benchmarks.md); at bs=1 eight save 4-7%
FEWER_WARPS_FROM_ROWS = 32
FEWER_WARPS_FROM_HIDDEN = 4096
FEWER_WARPS = 4
# Bytes of weights a product's programs ask L2 for before their PDL wait, all programs together: the first tiles of
# each program's slice, fetched while the kernel before drains. A fraction of the H200's 50 MB L2: on four warps 4
# and 8 MiB measured fastest, 16 and 32 MiB slower than none (benchmarks/fused_prefetch.py; docs/benchmarks.md).
L2_PREFETCH_BYTES = 8 << 20
# ... and then, each iteration of a product's loop asks L2 for the tile that many bytes ahead of the one it loads: a
# window of prefetches in flight per program, where registers hold only the next tile
ROLLING_PREFETCH = True
# A product's loop holds the next weight tile in registers; where PIPELINE_STAGES > 0 it hands the loads after the
# first tile to Triton's software pipeliner instead (that many stages through shared memory). Off: 3 stages took 2.3%
# off Llama-3.2-1B's step but added 9% to Qwen3-0.6B's and 4 stages 10% to Qwen3-8B's, paired on one H200
# (docs/benchmarks.md, "how deep a product's loop keeps its weight loads")
PIPELINE_STAGES = 0
# How many chunks the folded attention's last program merges a load, chosen when the step is planned from the chunks a
# KV head has at the longest prefix the run decodes to (merge_block): up to SERIAL_MERGE_MAX_CHUNKS, one a load (the
# merge's code is then smallest, and every program of the kernel, merging or not, pays for its registers); beyond,
# every chunk in one load (one round trip to L2), MAX_MERGE_BLOCK at most. Paired on one H200 (docs/benchmarks.md,
# "the merge sized by the context"), ms/step merging 1 / 4 / 16 / 64 chunks a load: Llama-3.2-1B at the study's
# workload (1-3 chunks) 0.914 / 0.922 / 0.930 / 0.973; Qwen3-0.6B at context 1024 (17-18) 1.073 / 1.036 / 0.984 / 0.929
SERIAL_MERGE_MAX_CHUNKS = 4
MAX_MERGE_BLOCK = 64
# Programs the attention's chunks of the valid prefix aim at (all rows and KV heads together): fewer, longer chunks
# compute each group's queries fewer times and merge fewer partials, more fill more SMs. attn=triton-decode's 264:
# 128 and 64 were within 0.7% of it, paired, on Qwen3-0.6B and Qwen3-8B at context 1024, 32 5% slower (one H200;
# docs/benchmarks.md, "the merge sized by the context"). Paired again on an H100 on 2026-12-06 under today's kernels,
# 128 took 1.041 times the folded step for Qwen3-0.6B at context 1024 and 64 1.013
ATTENTION_PROGRAMS = TARGET_PROGRAMS
# The same aim for the attention's three launches (not folded): their split-KV's chunks, which their merge kernel reads
# back. splits_for rounds up to a power of two, so 264 gave 32-64 chunks a KV head at bs=1 past 1024 slots (eight KV
# heads: 256-512 programs, many of one 64-slot block or none); 128 gives 16. Paired on one H200 (GPU-16875c31,
# 2026-12-06; docs/benchmarks.md, "three launches aim their chunks at 128 programs"), 128 against 264 took 0.933 and
# 0.935 times the step for Qwen3-0.6B at contexts 2048 and 4096, 0.986 and 0.969 for Llama-3.2-1B at 1024 and 2048,
# 0.999 for Qwen3-8B at 1024; 64 was slower than 128 at each (at 4096 slower than 264). The folded kernel keeps 264.
# Out to context 16384, on two H100s (GPU-4286e687, GPU-41f1258a, 2026-12-06), 128 was still the fastest for
# Qwen3-0.6B (256: 32 chunks, 4.2-5.2% slower at 2048 to 16384), Qwen3-8B at 16384 (256 1.0% slower), Qwen3-1.7B at
# 2048 and 4096, Qwen3-4B and Llama-3.1-8B at 2048 (0.6-3.1%); for Llama-3.2-1B at 16384 256 took 0.993 of its step,
# at 2048 1.013
UNFOLDED_ATTENTION_PROGRAMS = 128
# The warps and software-pipeline stages (K/V blocks in flight) of the attention's programs: the three launches'
# split-KV and the folded kernel. Triton's defaults, 4 and 3, were the fastest of 4 or 8 warps on 2 to 4 stages at
# every workload paired on one H100 (GPU-9fac1985, 2026-12-06; docs/benchmarks.md, "the attention's chunks and warps
# at long contexts"): 8 warps 1.1-8.7% slower, 4 stages 0.5-3.5% (Llama-3.2-1B's study workload within 0.05%),
# 2 stages 0.6-15%; on Qwen3-0.6B at bs=1 contexts 1024, 4096 and 16384 and at bs=8 context 16384 (2 stages not built
# there: out of memory beside the other variants), Llama-3.2-1B at bs=1 contexts 16384 and 32
SPLIT_KV_WARPS, SPLIT_KV_STAGES = 4, 3
FOLDED_ATTENTION_WARPS, FOLDED_ATTENTION_STAGES = 4, 3
# The folded attention's query tile has GROUP_PAD rows (16, the MMA's least) for a group of 2-8 heads: the padding
# rows masked (they load nothing), or repeating the last head's loads of the QKV partial sums. Masked took 1.5% off
# Qwen3-0.6B's step at context 1024 and 1.3% off Qwen3-8B's, paired on one H200 (docs/benchmarks.md)
QUERY_PADDING_MASKED = True
# The folded attention asks L2 for its chunk's K and V (contiguous slots of one KV head: one bulk prefetch each) before
# it computes its queries, so that the chunk's loads, which wait for the queries, find them there. Off: within
# -0.6% to +0.4% of none on three models, paired on two H200s (docs/benchmarks.md, "how many ways a product splits");
# asked earlier still, before the PDL wait while the layer's QKV product runs, it took 2.8-3.2% more on Qwen3-0.6B at
# bs=1 context 1024 and bs=8 context 16384 and 0.0-0.2% on Llama-3.2-1B and Qwen3-8B (paired, one H200): the
# prefetch takes HBM from the product it overlaps
KV_PREFETCH = False
# The folded attention's chunk that holds the new token's slot starts from the new K/V as it computed them and reads
# only the slots before it, so that none of its loads waits for its own store (the append, then a barrier). Off: it
# took 0.3-1.8% longer a step on four workloads (Qwen3-0.6B at context 1024 the most), paired on one H200
# (docs/benchmarks.md, "the new token's K/V from registers"): a softmax state started outside the loop and the new
# token's products on CUDA cores cost the program more than the barrier and one read from L2
NEW_KV_IN_REGISTERS = False
# POSITION_BEFORE_WAIT: the folded attention reads the cache position and RoPE's rows at it before its PDL wait, while
# the QKV product ahead of it drains, not after it, so that the chain of loads after the wait starts at the QKV partial
# sums. PAST_KV_BEFORE_WAIT: the chunk's first block of the slots before the position too (the new token's K/V then from
# registers, as NEW_KV_IN_REGISTERS), as the public study's attention loads its past K/V. Both off: paired on one H200
# (docs/benchmarks.md, "one chunk a KV head at a short context"), the position first moved the step by -0.3% to +0.5%
# on four workloads, the first block too made it 0.5-5.2% slower (Qwen3-0.6B at context 1024 the most: its K/V read
# while the QKV product still streams its weights).
# Neither is written by the kernel the attention waits for (the layer's QKV product): the position by the step
# before's last kernel (lm_head), the slots by the step before's attention, both done before that QKV product passed
# its own PDL wait and let the attention launch. The position is read from L2 (".cg"), past any line of it in L1.
POSITION_BEFORE_WAIT = False
PAST_KV_BEFORE_WAIT = False
# The chunk's first block of the slots before the new token's read right after the PDL wait, before the group's queries
# are computed from the QKV product's partial sums (the new token's K/V then from registers, as NEW_KV_IN_REGISTERS),
# so that the chunk's first K/V loads from HBM are in flight during the queries' loads and arithmetic rather than after
# them; after the wait, so that they do not take HBM from the QKV product as PAST_KV_BEFORE_WAIT's did
PAST_KV_BEFORE_QUERIES = False
# The last chunk's merge of the group's heads: each head's chunks in one load, every head's loads before any store (no
# loop, no store between heads to keep them apart), where all the chunks fit one load; else one head after another.
# Off: 2.3-5.9% slower on three models, paired on one H200, even where nothing merges (Llama-3.2-1B at context 32):
# the kernel's registers, which every program pays for
MERGE_HEADS_TOGETHER = False
# The attention's grid: chunks a KV head for the longest prefix the run decodes to, not for the cache's capacity (the
# same chunks while the prefix stays within it, and no programs launched only to exit; a longer prefix still computes
# right, in longer chunks). Llama-3.2-1B at the study's workload (capacity 16384, prefix 32-169: 4 chunks a KV head,
# not 64) took 1.6% less a step, paired on one H200; the others' grids are the same either way
CHUNKS_BY_PREFIX = True
# Where that longest prefix is at most this many slots, one chunk a (row, KV head), which merges nothing: the chunk's
# loop reads its few blocks one after another, where several chunks read them side by side and the last merges them
# (a store, an atomic count and a load from L2, in the chain of every layer). Paired on one H200 each
# (docs/benchmarks.md, "one chunk a KV head at a short context"), at context 32 (prefix up to about 170 slots):
# Llama-3.2-1B at the study's workload 2.7% less a step, at bs=8 3.1% less, Qwen3-0.6B 1.7% less, Qwen3-8B 2.3% less.
# Not beyond: one chunk took Llama-3.2-1B (head dim 64) 1.1% less at about 394 slots but 0.8% more at about 478, and
# Qwen3-0.6B (head dim 128) 11.4% more at about 394 (2.0% at bs=8); so neither more slots nor a limit on the bytes of
# keys a chunk reads (64 KB: 512 slots of Llama-3.2-1B's heads) is taken
ONE_CHUNK_MAX_SLOTS = 256
# Except at bs=1 with heads at most NARROW_HEAD_DIM wide, where one chunk reaches ONE_CHUNK_MAX_SLOTS_NARROW slots (48
# KB of keys a chunk at head dim 64, bf16): Llama-3.2-1B at the study's workload as one graph of 127 steps (its plan
# sized for 286 slots: 8 chunks in three launches under the rule above) took 1.7% less a step with one chunk (0.988
# against 1.005 ms, verified jobs in one call on one H100, GPU-ede9b7a7, 2026-12-07), and 3.8% less timed over the
# study's own window (positions 32-159, benchmarks/fused_prefetch.py --set study_window), paired on that H100 and on
# another; with the 394 and 478 slots above, on an H200, the limit sits between
ONE_CHUNK_MAX_SLOTS_NARROW, NARROW_HEAD_DIM = 384, 64
# fused.slices: where a step decodes at most SLICE_MAX_ROWS rows, each product's program multiplies a few whole rows
# of the weight (row-major) by a split of K of at most SLICE_COLUMNS, loaded in one go before its PDL wait and
# summed on CUDA cores, instead of looping over 64 x 128 tiles on tensor cores: all of a program's weight bytes are
# in flight at once, held by the register file rather than a loop (benchmarks/matvec_slices.py). A thread holds
# SLICE_VALUES_A_THREAD of the slice's values; the rows a program takes follow from that and the warps.
# Which kinds of product the rules slice, and on how many warps: the majority of fused.tune's choices on one H200
# (GPU-ef817e74, 2026-12-03): Qwen3-0.6B and Llama-3.1-8B kept the slices for gate/up, down and lm_head and took the
# tiles back for QKV and O (1.0-1.8% faster; Llama-3.2-1B kept all sliced but gate/up); an unsplit slice of K >=
# SLICE_MORE_WARPS_FROM columns (gate/up, lm_head) took eight warps over four (Llama-3.1-8B's gate/up 6.3% off its
# step, Llama-3.2-1B's 1.3%). Those rules, paired against the tiles on another H200 (GPU-df1d07d8): Qwen3-0.6B at
# context 1024 -6.2%, Llama-3.2-1B at the study's workload -0.7%, Llama-3.1-8B -0.9%, Qwen3-8B +7.3%; so the rules
# slice only models up to SLICE_MAX_HIDDEN wide (fused.tune still tries the slices in any: tuned from the tiles,
# neither 8B model took one, GPU-c4d8dfd1; docs/benchmarks.md, "fused.slices")
SLICE_MAX_HIDDEN = 2048
# fused.weights_ahead: the folded attention's programs ask L2 for the layer's gate/up weights, then down's, this many
# bytes at most in all (a share each, one bulk prefetch), where the attention itself reads no more K/V than that at the
# longest prefix: at a short context its chunks and their merge are a chain of round trips that leaves HBM idle, and
# the MLP's products then find their first weights in L2. Paired on one H200 each (docs/benchmarks.md, "weights asked
# of L2 while the attention runs"): asked once a chunk's K/V are read, 6 MiB took 1.7-2.0% off Qwen3-0.6B's step at
# context 1024 (24 MiB added 1.1%) and changed Llama-3.2-1B's at the study's workload and Qwen3-8B's by under 0.3%;
# asked at the kernel's PDL wait, before the chunks' own reads, 12-40 MiB added 6.7-9.0% to Qwen3-0.6B's. Where the
# attention reads less K/V than WEIGHTS_AHEAD_FROM_KV_BYTES its chain is too short to hide the requests: at context 32
# (0.7 MB) Qwen3-0.6B's step took 1.8% longer, Llama-3.2-1B's 0.3% (bs=1; at bs=8, 5.6 MB, -0.4% and +0.1%)
WEIGHTS_AHEAD_BYTES = 6 << 20
WEIGHTS_AHEAD_FROM_KV_BYTES = 1 << 20
# At bs=1 past one chunk a KV head (one_chunk_max_slots) the folded attention gives back its three launches, except
# where it reads at least FOLD_MIN_KV_BYTES of K/V a layer and asks L2 for at least FOLD_MIN_AHEAD_SHARE of the layer's
# MLP weights (fused.weights_ahead's budget and K/V window, as a GPU's plan would, whether or not the switch is on):
# past one chunk the fold pays only as the host of that request over a chain long enough to hide it. The three
# launches' merge asks L2 for the same weights (UNFOLDED_AHEAD_IN) where the window allows.
# Paired on three H100s, 2026-12-06 (docs/benchmarks.md, "where the folded attention stops paying"), three launches
# asking for nothing took 0.944 and 0.927 times the folded step for Qwen3-0.6B at contexts 2048 and 4096 (K/V past
# the budget), 0.967 / 0.988 / 0.946 for Llama-3.2-1B at 512 / 1024 / 2048 (6 MiB is 6.2% of its MLP) and 0.988 for
# Qwen3-8B at 1024 (2.1%), but 1.045 for Qwen3-0.6B at 1024 (4.8 MB of K/V, 33% of its MLP asked ahead), 1.018 for
# Qwen3-1.7B at 1024 (8.3%) and 1.019-1.022 for Llama-3.2-1B at context 32 (one chunk). The share sits between
# Llama-3.2-1B's and Qwen3-1.7B's, two models that differ in more than it (head size, heads a group). With the merge
# asking ahead, on two more H100s (GPU-e7a93e1c, GPU-330a99cd), three launches took 0.955 times the folded step for
# Qwen3-0.6B at context 512 (2.7 MB of K/V, a third of its MLP asked: the fold's one miss before), 0.958 at 768
# (3.7 MB), 0.979 for Llama-3.2-1B at 1024 (2.4 MB) and 0.978 for Qwen3-4B at 1024 (4.2%), but 1.014 for
# Qwen3-0.6B at 1024 and 1.007 for Qwen3-1.7B at 1024 (4.8 MB): FOLD_MIN_KV_BYTES sits between
# 3.7 and 4.8 MB, a fit to these pairs, not a law. Profiled, the bound was the three launches' grid doubling past
# about 1024 slots (16 to 32 chunks a KV head at 264 programs; UNFOLDED_ATTENTION_PROGRAMS). At 128 programs, on an
# H200, the fold is still 1.3% faster for Qwen3-0.6B at 1024 and three launches 0.14% faster for Qwen3-1.7B there
# (within what two builds of one plan differ), and the fold 3.2% slower for Qwen3-0.6B at 768, so the bound holds.
# More rows keep the fold (9% faster for Qwen3-0.6B at bs=8 context 16384 on an H200)
FOLD_MIN_AHEAD_SHARE = 0.07
FOLD_MIN_KV_BYTES = 4 << 20
# Where the attention's three launches ask L2 for the MLP's weights (fused.weights_ahead, in the same budget and K/V
# window as the folded attention): "merge", each merge program right after its PDL wait, when no chunk's K/V is still
# being read; "split", each split-KV program once its chunk is read; "" none. Paired on an H100 (GPU-e7a93e1c) against
# three launches that ask for none, the merge's requests took 0.973 times the step for Qwen3-0.6B at context 512,
# 0.992 for Llama-3.2-1B at 1024 and 0.972 / 0.987 for Qwen3-0.6B / Qwen3-1.7B at 1024, and the split-KV's 0.998 /
# 0.999 / 0.995 / 0.995 (Llama-3.2-1B at 512: 0.998 the merge's, 0.995 the split-KV's)
UNFOLDED_AHEAD_IN = "merge"
SLICE_MAX_ROWS = 1
SLICE_COLUMNS = 2048
SLICE_VALUES_A_THREAD = 64
SLICE_WARPS = 4
SLICED_KINDS = ("gate_up", "down", "lm_head")
SLICE_MORE_WARPS_FROM = 2048
# In a model at most SLICE_NARROW_HIDDEN wide a thread holds SLICE_VALUES_A_THREAD_NARROW of a slice's values: paired on
# four H200s (docs/benchmarks.md, "128 values a thread"), Qwen3-0.6B's step took 0.9%, 1.1% and 1.0% less with 128 than
# with 64 at context 1024 and 1.5% and 1.2% less at context 32, where Llama-3.2-1B's (2048 wide) took 6.2% and 5.5% more
SLICE_NARROW_HIDDEN = 1024
SLICE_VALUES_A_THREAD_NARROW = 128
# Where each kind of product (PRODUCT_KINDS) lets the next kernel launch (PDL's launch_dependents): AFTER_LOOP, once
# its weight loop has read every weight, before it stores; AT_WAIT, at its own PDL wait, where its programs have all
# started and its predecessor is done, so that the next kernel's programs take free slots and issue their weight
# loads while this product's are in flight; AT_END, after its stores, so that the next kernel's programs take no slot
# while this one's run. Never before its own wait: a kernel that let the next launch at its start let a chain of
# kernels launch, each waiting beside the one it waits for (43% slower, docs/benchmarks.md, "early launch"). What is
# computed is the same at each: the next kernel's PDL wait holds it until this one has finished.
# The rule (launch_point), where LAUNCH_AT names no point for the kind: a gate/up sliced on eight warps (a model
# 2048 wide at bs=1) after its stores, every other product after its loop. Paired on one H200 each
# (docs/benchmarks.md, "where a kernel lets the next launch"): gate/up after its stores took 1.4% off Llama-3.2-1B's
# step at the study's workload (twice, two GPUs), 0.9% at context 1024, 0.4-0.6% off Qwen3-1.7B's, and moved
# Qwen3-0.6B's (four warps) by +0.0 to +0.2% and Qwen3-8B's (tiles) by +0.0%; down or lm_head after their stores
# 0.2-0.3% on Llama-3.2-1B; every product at its wait 5.5-32% slower on three models.
# AT_START, first of all, before its weight loads: the public study's projections (every one whole rows of the
# weight in registers, read before the wait) let the next kernel launch so, and their chain of waiting kernels then
# holds the next products' weights in registers while this one runs. Only for the benchmarks' variants
# (benchmarks/fused_prefetch.py, `--set study`): with tiles it was the 43% slower early launch above.
AT_WAIT, AFTER_LOOP, AT_END, AT_START = 0, 1, 2, 3
LAUNCH_AT: dict[str, int] = {}
# The folded attention lets the O product launch at its start (the default), or where False after its own PDL wait
ATTENTION_LAUNCH_AT_START = True
# Four designs that take launches out of a layer were built, verified and paired, each slower than the five kernels
# above, and taken out of the code (docs/benchmarks.md, "the designs taken out", names each one's section and the
# commit that still holds it): the attention folded into O, the attention in QKV's tail, QKV, attention and O as one
# persistent kernel (grid barriers, or each program waiting for what it reads), and the MLP in one kernel
# fused.tma: in a model TMA_FROM_HIDDEN wide or wider, the products that run as tiles with 16-bit weights (every kind of
# an 8B model's in bf16, at any batch) stream their weight tiles through the Hopper's tensor memory accelerator into
# shared memory, where the tensor cores read them (`_matvec_tma`, Triton's pipeliner keeping `tma_stages` tiles in
# flight a program), instead of loading them into registers and storing them to shared memory again for the MMA. Nsight
# Compute on one H200 (docs/benchmarks.md, "what the hardware counters say") found Qwen3-8B's gate/up tiles through
# registers holding the SM's L1/TEX pipe 89% busy, its warps stalled most on shared memory, at 74% of the DRAM's peak;
# through TMA, 76% and 84%. Paired on H200s, three stages for every product took 5.8-6.9% off Qwen3-8B's step at bs=1
# but added 1.3% to Llama-3.1-8B's, whose gate/up (448 programs) no longer fit one wave at three programs an SM (a
# program of three stages holds 61-70 KB of shared memory). Two stages where that brings a product's programs into one
# wave (four an SM or more at two), three elsewhere (lm_head's thousands of programs run several waves either way): 7.8%
# off Qwen3-8B's step and 9.7% off Llama-3.1-8B's (lm_head on two stages as well: 0.5% and 0.3% slower). In the small
# models (Qwen3-0.6B, Llama-3.2-1B: their tiles are the small QKV and O products, a tile or two a program, nothing for
# the pipeliner to overlap) three stages added 7.9% and 1.3%. Between them, paired on one H200 (GPU-11c5cb2d,
# 2026-12-05; docs/benchmarks.md, "a model between the rules' widths"): Qwen3-4B (2560 wide, every product tiles) took
# 15.4% off its step at bs=1 and 15.1% at bs=8 through TMA; Qwen3-1.7B (2048, its QKV and O tiles) moved by +0.05%.
# So the rule starts past 2048.
# TMA_KINDS (every kind: PRODUCT_KINDS, below) and TMA_STAGES_OF (a kind's own stages) are for the benchmarks'
# variants.
TMA_FROM_HIDDEN = 2560
# From TMA_LARGE_FROM_HIDDEN wide, a model's large products (TMA_LARGE_KINDS, sliced by the other rules at bs=1) stream
# their tiles through TMA too, on TMA_LARGE_STAGES: paired on one H200 (GPU-3354d55b, 2026-12-05; docs/benchmarks.md,
# "the small models' large products as tiles through TMA"), Llama-3.2-1B's step at the study's workload took 6.3% less
# with gate/up, down and lm_head so (4.3% of it gate/up's: 256 programs of 16 tiles each, where its slices ran four
# waves of 2048), three stages 5.9%; through registers the same tiles were 1.2% slower than the slices. Qwen3-0.6B
# (1024 wide: gate/up 96 programs, down two tiles a program, nothing for the pipeliner to overlap) took 5.3% more.
# Paired on a second H200 (GPU-4e4bab28, 2026-12-05): Llama-3.2-1B 5.7% faster at the study's workload (three stages
# within 0.2% of four, five to eight 13-22% slower), Qwen3-1.7B (2048 wide, gate/up 192 programs) 2.2% faster at bs=1;
# and at bs 8 and 32, where these products ran as tiles through registers, Llama-3.2-1B 7.3% and 3.0% faster. So it
# holds at every batch (TMA_LARGE_MAX_ROWS, for the benchmarks' variants)
TMA_LARGE_KINDS = ("gate_up", "down", "lm_head")
TMA_LARGE_FROM_HIDDEN = 2048
TMA_LARGE_STAGES = 4
TMA_LARGE_MAX_ROWS = 1 << 30
TMA_STAGES, TMA_PROGRAMS_PER_SM = 3, 3  # ... and the programs of that many stages an SM holds
TMA_STAGES_WIDE, TMA_WIDE_PROGRAMS_PER_SM = 2, 4
TMA_STAGES_OF: dict[str, int] = {}
# In a model between TMA_LARGE_FROM_HIDDEN and TMA_FROM_HIDDEN wide, with fused.tma, QKV (tiles through registers)
# split for one program an SM, not PROGRAMS_PER_SM, at this many batch rows at most (qkv_one_an_sm): four tiles a
# program, where two a program gave it more programs than SMs hold at once. Paired on one H200 (GPU-5928ca20,
# 2026-12-05; docs/benchmarks.md, "what a TMA program copies before its wait"): Qwen3-1.7B's step at bs=1 1.6% faster
# (256 programs, not 512), 1.0% on an H100; Llama-3.2-1B's at the study's workload within 0.1% either way on the two
# (192, not 384). O and down split as before
QKV_ONE_AN_SM_MAX_ROWS = 1
# Whether a program streaming through TMA copies its split's first tile before its PDL wait, as `_matvec` loads its
# first tile into registers there (the weights do not depend on the kernel before). Off: paired on one H200
# (GPU-1473ee24, 2026-12-05; `--set tma_first`), Llama-3.2-1B's step at the study's workload took 6.7% longer and
# Qwen3-8B's 11.8%. Triton waits for a copy outside the loop at once, so each program waits for that tile, then for the
# kernel before, and only then starts the pipeliner's copies
TMA_FIRST_BEFORE_WAIT = False
# Whether the large products' rule (TMA_LARGE_KINDS) runs, at one row of weights packed tile-major, as
# harness/kernels/tma_before_wait.py's Gluon kernel on TMA_COPIES_FIRST_STAGES: every program starts all its stages'
# copies before its PDL wait, and reads the input only after it (Triton's pipeliner issues `_matvec_tma`'s copies
# after the wait: profiled with PDL, gate/up then started 0.36 us before O ended). Paired on one H100 (GPU-fc0d0088,
# 2026-12-06; docs/benchmarks.md, "the large products' copies before their PDL wait"; `--set copies_first`), against
# `_matvec_tma` on 4 stages: on 3 stages, Llama-3.2-1B's step at the study's workload 2.3-2.5% faster and Qwen3-1.7B's
# at bs=1 2.2%; on 4, 0.8% and 0.6% (why 3 beat 4 was not profiled). O letting such a gate/up launch at O's wait
# (O_AT_WAIT_BEFORE_COPIES_FIRST, not after O's loop) took another 0.5% and 0.8% off (Llama-3.2-1B 3.1% faster in all,
# Qwen3-1.7B 3.0%); at O's start, 0.2% faster than at its wait on Llama-3.2-1B and 0.2% slower on Qwen3-1.7B.
# Two stages, not three, with QKV's copies first as well (TMA_COPIES_FIRST_SMALL_KINDS, below): paired on another H100
# (GPU-4cc38ddd, 2026-12-06; docs/benchmarks.md, "QKV's copies before its PDL wait, on two stages"; `--set
# qkv_o_first`), the large products on 2 stages alone took 2.1% off Llama-3.2-1B's step at the study's workload and
# 1.9% off Qwen3-1.7B's at bs=1; on 1 (QKV and O first on 2), 1.4% and 2.7% slower than the rules before (why two
# stages beat three was not profiled)
TMA_COPIES_BEFORE_WAIT = True
TMA_COPIES_FIRST_STAGES = 2
O_AT_WAIT_BEFORE_COPIES_FIRST = True
# The kinds of product, among QKV and O (tiles through registers by the other rules, each program's first tile loaded
# before its PDL wait), that run as the Gluon kernel too, in the models and at the rows where the large products do
# (gluon_runs), each program copying its split's tiles on TMA_COPIES_FIRST_SMALL_STAGES at most (Llama-3.2-1B's QKV
# has 4 a program, O 2). Paired on that H100: QKV on 2 stages with the large products on 2 took 2.8% off both steps
# (Llama-3.2-1B 0.9616 ms against 0.9897 under the rules before; Qwen3-1.7B 2.8%), and 1.6% at contexts 2048 and 1024;
# QKV on all 4 of its tiles (the large products on 3) 0.6% and 1.2% slower than through registers; O first as well,
# with the large products on 2, 0.9% and 0.6% slower than QKV alone
TMA_COPIES_FIRST_SMALL_KINDS: tuple[str, ...] = ("qkv",)
TMA_COPIES_FIRST_SMALL_STAGES = 2
# Whether the Gluon kernel sums each tile's products over its columns as it reads the tile (SUM_EACH_TILE), holding
# a thread's share of the block's sums, not BK times as many to the end: compiled for sm_90 by Triton 3.6, gate/up and
# lm_head then take 64 registers a thread (not 92) and down 46 (not 71), so four of their programs fit an SM where two
# did (benchmarks/fused_occupancy.py). Off: paired on that H100 it made both steps 11-13% slower (not profiled: each
# tile then adds a sum across 16 threads, which the rule does once a split)
TMA_COPIES_FIRST_SUM_EACH_TILE = False
# At one row, in a model COPIES_FIRST_FROM_HIDDEN wide or wider (and under COPIES_FIRST_BELOW_HIDDEN), with packed
# 16-bit weights and fused.tma, the large products (TMA_LARGE_KINDS) and TMA_COPIES_FIRST_SMALL_KINDS run as the
# Gluon kernel whatever the other rules would plan (copies_first_reaches): in a 1024-wide model, where the rules slice
# the large products; from COPIES_FIRST_O_FROM_HIDDEN wide O too, where it and every other product streamed through
# `_matvec_tma`, copied after the wait. There gate/up takes 32-column blocks where 64-column ones are fewer than the
# SMs (Qwen3-0.6B's 96: 192 programs), and the kernel runs on TMA_COPIES_FIRST_WARPS warps, not the tile's eight.
# Paired on one H100 (GPU-2a0299d8, 2026-12-06; docs/benchmarks.md, "the copies-first rule at every width"; `--set
# copies_first_reach`), against the rules before: Qwen3-0.6B at bs=1 context 1024 took 0.926 times the step (its
# large products and QKV so, gate/up in 32-column blocks, 4 warps; 0.966 in 64-column blocks on 8 warps, 0.954 in
# 32), Qwen3-8B at bs=1 0.968 (every product so, on 4 warps; on 8, 1.013); 4 warps alone 1.000 on Llama-3.2-1B at
# the study's workload and 0.995 on Qwen3-1.7B at bs=1. At 8 rows, the large products of Qwen3-0.6B through
# `_matvec_tma` (the 2048-wide rule, TMA_LARGE_FROM_HIDDEN, at 1024) took 1.053 times the step: one row only
COPIES_FIRST_FROM_HIDDEN, COPIES_FIRST_BELOW_HIDDEN = 1024, 1 << 30
COPIES_FIRST_O_FROM_HIDDEN = TMA_FROM_HIDDEN
TMA_COPIES_FIRST_WARPS = 4  # (0: the tile's)
# gate/up's columns a tile where it runs as tiles (0: tile_sizes'), for the benchmarks' variants: gate/up never splits
# (SiLU needs whole sums), so narrower tiles are its one way to more programs (Qwen3-0.6B's 6144 columns: 96 programs of
# 64, 192 of 32). Through registers, 32 measured slower (13.2 against 11.1 µs a call, 2026-12-02: blocks_and_splits)
GATE_UP_TILE_COLUMNS = 0


@dataclass(frozen=True)
class FusedOptions:
    pdl: bool = True  # programmatic dependent launch on every kernel (a Hopper GPU; off on a CPU)
    split_k: bool = True  # split K where a product has too few column blocks to fill the GPU
    packed: bool = True  # weights in tile-major order (each program's tiles contiguous); off: row-major
    prefetch: bool = False  # each program asks L2 for its weights ahead (packed, a Hopper GPU; fused.prefetch)
    # RoPE, the K/V append and the chunks' merge inside the attention kernel: one launch a layer; off, three
    fold_attention: bool = True
    tune: bool = False  # each kind of product's plan timed in the step at prepare (fused_tune.py; on a GPU)
    # at SLICE_MAX_ROWS rows, SLICED_KINDS as whole rows of the weight times a split of K, on CUDA cores
    # (slice_layout; default_choice says where)
    slices: bool = True
    # the folded attention, whose own reads leave HBM idle at a short context, asks L2 for the layer's MLP weights
    # (WEIGHTS_AHEAD_BYTES at most) while it runs, so that gate/up and down find them there (a Hopper GPU)
    weights_ahead: bool = True
    tma: bool = True  # the tiles' weights through the tensor memory accelerator, TMA_FROM_HIDDEN wide and up (Hopper)


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _pdl_wait_launch(PDL: tl.constexpr, WAIT: tl.constexpr, LAUNCH: tl.constexpr):
    """PDL's wait where WAIT, then the next kernel let launch where LAUNCH."""
    if WAIT:
        _pdl_wait(PDL)
    if LAUNCH:
        _pdl_start(PDL)


@triton.jit
def _prefetch_to_l2(W, first, nbytes):
    """Ask L2 for `nbytes` contiguous bytes of W from element `first` on: one Hopper bulk prefetch
    (cp.async.bulk.prefetch.L2, a copy engine's request: no registers, not waited for), issued by the program's
    thread 0 alone (a request from each of 128 threads, with the rolling prefetch, measured 21% slower than none;
    docs/benchmarks.md)."""
    at = (W + first).to(tl.pointer_type(tl.int8)) + tl.zeros([32], tl.int64)  # every thread holds the same address
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred first_thread;\n\t.reg .u32 tid;\n\tmov.u32 tid, %tid.x;\n\t"
        "setp.eq.u32 first_thread, tid, 0;\n\t@first_thread cp.async.bulk.prefetch.L2.global [$1], $2;\n\t"
        "mov.u32 $0, 0;\n\t}", "=r,l,r", [at, tl.full([32], nbytes, tl.int32)], dtype=tl.int32, is_pure=False,
        pack=1)


@triton.jit
def _range_part(start, stop, lo, hi):
    """[start, stop) within [lo, hi): its first byte counted from lo, and its length (none where <= 0)."""
    first = tl.maximum(start, lo)
    return first - lo, tl.minimum(stop, hi) - first


@triton.jit
def _weights_to_l2(Ahead1, bytes1, Ahead2, bytes2, share, program):
    """This program's share of the bytes [0, bytes1) of Ahead1 then [0, bytes2) of Ahead2 (16-byte multiples, taken
    as one run), asked of L2: `share` bytes from program * share on, split where the run passes into Ahead2."""
    start = program * share
    first, length = _range_part(start, start + share, 0, bytes1)
    if length > 0:
        _prefetch_to_l2(Ahead1.to(tl.pointer_type(tl.int8)), first, length)
    first, length = _range_part(start, start + share, bytes1, bytes1 + bytes2)
    if length > 0:
        _prefetch_to_l2(Ahead2.to(tl.pointer_type(tl.int8)), first, length)


@triton.jit
def _prefetch_tile_ahead(W, pid_n, k_ahead, k_end, k_tiles, rolling, BN: tl.constexpr, BK: tl.constexpr):
    """The rolling prefetch: W's packed tile at columns k_ahead into L2, if the program's split reaches it."""
    if rolling and k_ahead < k_end:
        tile_bytes = BN * BK * (W.dtype.element_ty.primitive_bitwidth // 8)
        _prefetch_to_l2(W, (pid_n * k_tiles + k_ahead // BK) * BN * BK, tile_bytes)


@triton.jit
def _weight_tile(W, pid_n, k0, k_end, n_total, k_total, k_tiles, BN: tl.constexpr, BK: tl.constexpr,
                 PACKED: tl.constexpr):
    """W's [BN, BK] tile at columns k0 (nothing read at or past k_end: the end of the program's split)."""
    n_local, k_local = tl.arange(0, BN), tl.arange(0, BK)
    before_end = (k0 + k_local < k_end)[None, :]
    if PACKED:  # tile (pid_n, k0 // BK) is BN x BK contiguous values, padded with zeros at pack time
        tile = pid_n * k_tiles + k0 // BK
        return tl.load(W + tile * BN * BK + n_local[:, None] * BK + k_local[None, :],
                       mask=(n_local < BN)[:, None] & before_end, other=0.0)
    n, k = pid_n * BN + n_local, k0 + k_local
    return tl.load(W + n[:, None] * k_total + k[None, :], mask=(n < n_total)[:, None] & before_end, other=0.0)


@triton.jit
def _input_tile(X, x_row, ResOut, Ids, Gain, rows, k0, k_end, k_total, pid_n, INPUT: tl.constexpr,
                NORM: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr):
    """The product's input rows [ROWS, BK] at columns k0.. (none at or past k_end, the split's end: a slice's BK may
    pass it), in fp32, and their squares' sum (before the gain)."""
    r, k = tl.arange(0, ROWS), k0 + tl.arange(0, BK)
    inside = (r < rows)[:, None] & (k < k_end)[None, :]
    if INPUT == 1:  # EMBEDDING: the rows of the embedding table that the input ids name, the residual's first value
        ids = tl.load(Ids + r, mask=r < rows, other=0)
        x = tl.load(X + ids[:, None] * k_total + k[None, :], mask=inside, other=0.0).to(tl.float32)
        if pid_n == 0:
            tl.store(ResOut + r[:, None] * k_total + k[None, :], x, mask=inside)
    else:
        x = tl.load(X + r[:, None] * x_row + k[None, :], mask=inside, other=0.0).to(tl.float32)
    squares = tl.sum(x * x, 1)
    if NORM:
        x = x * tl.load(Gain + k, mask=k < k_end, other=0.0).to(tl.float32)[None, :]
    return x, squares


@triton.jit
def _matvec(X, x_row, ResOut, Ids, Gain, W, Out, SquaresOut, Bump, rows, k_total, n_total, out_cols, k_per_split,
            k_tiles, eps, prefetch_bytes, prefetch_ahead, INPUT: tl.constexpr, NORM: tl.constexpr, OUTPUT: tl.constexpr,
            SPLITS: tl.constexpr, BUMP: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            PACKED: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr = False,
            STAGES: tl.constexpr = 0, ONE_TILE: tl.constexpr = False, LAUNCH: tl.constexpr = 1):
    """out = norm?(input) @ W.T for one block of BN output columns and one K split (program ids 0 and 1)."""
    _pdl_wait_launch(PDL, False, LAUNCH == 3)  # AT_START: before any load
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, k_total)
    if PREFETCH:  # the packed tiles of this program's split are contiguous from its first one
        _prefetch_to_l2(W, (pid_n * k_tiles + k_start // BK) * BN * BK, prefetch_bytes)
    w = _weight_tile(W, pid_n, k_start, k_end, n_total, k_total, k_tiles, BN, BK, PACKED)  # weights: before the wait
    _pdl_wait_launch(PDL, True, LAUNCH == 0)  # where the next kernel may launch (0-3): launch_point
    acc, squares = _weight_loop(w, X, x_row, ResOut, Ids, Gain, W, rows, k_start, k_end, k_total, n_total, k_tiles,
                                pid_n, prefetch_ahead, INPUT, NORM, ROWS, BN, BK, PACKED, DOT, PREFETCH, STAGES,
                                ONE_TILE)
    _product_out(acc, squares, Out, SquaresOut, Bump, rows, n_total, out_cols, k_total, eps, pid_n, pid_k, NORM,
                 OUTPUT, SPLITS, BUMP, ROWS, BN, DOT, PDL, LAUNCH)


@triton.jit
def _product_out(acc, squares, Out, SquaresOut, Bump, rows, n_total, out_cols, k_total, eps, pid_n, pid_k,
                 NORM: tl.constexpr, OUTPUT: tl.constexpr, SPLITS: tl.constexpr, BUMP: tl.constexpr,
                 ROWS: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr, LAUNCH: tl.constexpr):
    """A product's sums after its weight loop: stored as OUTPUT says, the layer's cache position bumped where BUMP,
    and the next kernel let launch after the loop (LAUNCH 1) or after the stores (2)."""
    if DOT:
        acc = tl.trans(acc)
    _pdl_wait_launch(PDL, False, LAUNCH == 1)
    _store(acc, squares, Out, SquaresOut, rows, n_total, out_cols, k_total, eps, pid_n, pid_k, NORM, OUTPUT, SPLITS,
           ROWS, BN)
    if BUMP:  # the cache position this kernel's layer keeps, one step on (nothing in this kernel reads it)
        if pid_n + pid_k == 0:
            tl.store(Bump, tl.load(Bump) + 1)
    _pdl_wait_launch(PDL, False, LAUNCH == 2)


@triton.jit
def _matvec_tma(X, x_row, ResOut, Ids, Gain, W, Wdesc, Out, SquaresOut, Bump, rows, k_total, n_total, out_cols,
                k_per_split, k_tiles, eps, prefetch_bytes, INPUT: tl.constexpr, NORM: tl.constexpr,
                OUTPUT: tl.constexpr, SPLITS: tl.constexpr, BUMP: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, PACKED: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
                PREFETCH: tl.constexpr = False, LAUNCH: tl.constexpr = 1, FIRST: tl.constexpr = False):
    """`_matvec` with the weight tiles read through the descriptor Wdesc (TMA_KINDS): on a Hopper GPU the tensor
    memory accelerator copies each [BN, BK] tile into shared memory, STAGES tiles in flight (Triton's pipeliner), and
    the tensor cores read it there, where `_matvec`'s tiles pass through registers and are stored to shared memory
    again for the MMA. The pipeliner's first copies come after the PDL wait (they are issued with the input's, which
    the kernel before writes); PREFETCH asks L2 for the first tiles before it, and FIRST copies the split's first tile
    before it (TMA_FIRST_BEFORE_WAIT), the pipeliner taking the rest."""
    _pdl_wait_launch(PDL, False, LAUNCH == 3)  # AT_START: before any load
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, k_total)
    if PREFETCH:  # the packed tiles of this program's split are contiguous from its first one
        _prefetch_to_l2(W, (pid_n * k_tiles + k_start // BK) * BN * BK, prefetch_bytes)
    if FIRST:  # the weights do not depend on the kernel before: only the input waits for it
        w = _descriptor_tile(Wdesc, pid_n, k_start, k_tiles, BN, BK, PACKED)
    _pdl_wait_launch(PDL, True, LAUNCH == 0)
    acc = tl.zeros([BN, ROWS] if DOT else [ROWS, BN], tl.float32)
    squares = tl.zeros([ROWS], tl.float32)
    k_first = k_start
    if FIRST:
        x, squares = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k_start, k_end, k_total, pid_n, INPUT, NORM, ROWS,
                                 BK)
        acc, k_first = _multiply_add(acc, w, x, DOT), k_start + BK
    for k0 in tl.range(k_first, k_end, BK, num_stages=STAGES):
        w = _descriptor_tile(Wdesc, pid_n, k0, k_tiles, BN, BK, PACKED)
        x, sq = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k0, k_end, k_total, pid_n, INPUT, NORM, ROWS, BK)
        acc, squares = _multiply_add(acc, w, x, DOT), squares + sq
    _product_out(acc, squares, Out, SquaresOut, Bump, rows, n_total, out_cols, k_total, eps, pid_n, pid_k, NORM,
                 OUTPUT, SPLITS, BUMP, ROWS, BN, DOT, PDL, LAUNCH)


@triton.jit
def _descriptor_tile(Wdesc, pid_n, k0, k_tiles, BN: tl.constexpr, BK: tl.constexpr, PACKED: tl.constexpr):
    """W's [BN, BK] tile at columns k0 through its TMA descriptor."""
    if PACKED:  # tile (pid_n, k0 // BK): BN rows of the [tiles * BN, BK] view, zeros past the edges
        return Wdesc.load([(pid_n * k_tiles + k0 // BK) * BN, 0])
    return Wdesc.load([pid_n * BN, k0])  # row-major [n, k]: the copy engine fills what passes the edges with zeros


@triton.jit
def _weight_loop(w, X, x_row, ResOut, Ids, Gain, W, rows, k_start, k_end, k_total, n_total, k_tiles, pid_n,
                 prefetch_ahead, INPUT: tl.constexpr, NORM: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, PACKED: tl.constexpr, DOT: tl.constexpr, PREFETCH: tl.constexpr,
                 STAGES: tl.constexpr, ONE_TILE: tl.constexpr = False):
    """The product over the split's K, from its first tile `w`, loaded before the PDL wait: the sums [BN, ROWS]
    (tensor cores: the weight tile is the MMA's left operand, its columns fill the MMA's M, which a handful of batch
    rows could not) or [ROWS, BN], and the input's squares [ROWS]. ONE_TILE: the split is that one tile (no loop,
    and no registers held for a next tile)."""
    acc = tl.zeros([BN, ROWS] if DOT else [ROWS, BN], tl.float32)
    squares = tl.zeros([ROWS], tl.float32)
    if ONE_TILE:
        x, squares = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k_start, k_end, k_total, pid_n, INPUT, NORM,
                                 ROWS, BK)
        acc = _multiply_add(acc, w, x, DOT)
    elif STAGES > 0:  # the first tile from registers, then Triton's pipeliner: STAGES tiles in flight through smem
        x, squares = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k_start, k_end, k_total, pid_n, INPUT, NORM,
                                 ROWS, BK)
        acc = _multiply_add(acc, w, x, DOT)
        for k0 in tl.range(k_start + BK, k_end, BK, num_stages=STAGES):
            w = _weight_tile(W, pid_n, k0, k_end, n_total, k_total, k_tiles, BN, BK, PACKED)
            x, sq = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k0, k_end, k_total, pid_n, INPUT, NORM, ROWS,
                                BK)
            acc, squares = _multiply_add(acc, w, x, DOT), squares + sq
    else:  # the next tile is loaded before this one is used
        for k0 in range(k_start, k_end, BK):
            if PREFETCH:
                _prefetch_tile_ahead(W, pid_n, k0 + prefetch_ahead, k_end, k_tiles, prefetch_ahead > 0, BN, BK)
            w_next = _weight_tile(W, pid_n, k0 + BK, k_end, n_total, k_total, k_tiles, BN, BK, PACKED)
            x, sq = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k0, k_end, k_total, pid_n, INPUT, NORM, ROWS,
                                BK)
            acc, squares = _multiply_add(acc, w, x, DOT), squares + sq
            w = w_next
    return acc, squares


@triton.jit
def _multiply_add(acc, w, x, DOT: tl.constexpr):
    """acc + the tile's product: W @ x.T on tensor cores ([BN, ROWS]), or x @ W.T summed on CUDA cores."""
    if DOT:
        if w.dtype == tl.float32:  # an fp32 run: exact products, not TF32's
            acc += tl.dot(w, tl.trans(x), input_precision="ieee")
        else:
            acc += tl.dot(w, tl.trans(x.to(w.dtype)))
    else:
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], 2)
    return acc


@triton.jit
def _store(acc, squares, Out, SquaresOut, rows, n_total, out_cols, k_total, eps, pid_n, pid_k, NORM: tl.constexpr,
           OUTPUT: tl.constexpr, SPLITS: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr):
    r, n = tl.arange(0, ROWS), pid_n * BN + tl.arange(0, BN)
    inside = (r < rows)[:, None] & (n < n_total)[None, :]
    at = Out + r[:, None] * n_total + n[None, :]
    if OUTPUT == 0:  # PARTIALS [SPLITS, rows, n], and the squares' partial sums for the consumer's norm
        tl.store(at + pid_k * rows * n_total, acc, mask=inside)
        if NORM:
            if pid_n == 0:
                tl.store(SquaresOut + pid_k * rows + r, squares, mask=r < rows)
    elif OUTPUT == 3:  # ADD to the residual stream in place: each element is this program's alone, or each split's
        if SPLITS == 1:
            tl.store(at, tl.load(at, mask=inside, other=0.0) + acc, mask=inside)
        else:
            tl.atomic_add(at, acc, mask=inside, sem="relaxed")
    else:  # the whole K in this program: the norm's 1/rms is known here
        if NORM:
            acc = acc * tl.rsqrt(squares / k_total + eps)[:, None]
        if OUTPUT == 1:  # SWIGLU: the tile's first half of columns is gate, the second up, for the same outputs
            act = _swiglu(acc, ROWS, BN)
            j = pid_n * (BN // 2) + tl.arange(0, BN // 2)
            tl.store(Out + r[:, None] * out_cols + j[None, :], act.to(Out.dtype.element_ty),
                     mask=(r < rows)[:, None] & (j < out_cols)[None, :])
        else:  # LOGITS
            tl.store(at, acc, mask=inside)


@triton.jit
def _swiglu(acc, ROWS: tl.constexpr, BN: tl.constexpr):
    """SiLU(gate)·up [ROWS, BN / 2] of a block of paired columns [ROWS, BN] (pair_blocks: gate's half, then up's)."""
    gate, up = tl.split(tl.permute(tl.reshape(acc, (ROWS, 2, BN // 2)), (0, 2, 1)))
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _rope_append(Parts, Squares, Pos, Cos, Sin, QNorm, KNorm, Q, Keys, Values, rows, n_total, hidden, eps,
                 k_row, k_head, k_slot, v_row, v_head, v_slot,
                 HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                 QK_NORM: tl.constexpr, ROPE_SHIFT: tl.constexpr, APPEND: tl.constexpr, PDL: tl.constexpr):
    """One (row, head): q of a query head into Q [rows, HEADS, D]; k and v of a KV head into the cache at the
    position. Sums QKV's split-K partials and applies the layer norm's 1/rms first."""
    row, head = tl.program_id(0), tl.program_id(1)
    _pdl_start(PDL)
    _pdl_wait(PDL)
    pos = tl.load(Pos)
    inv_rms = _inv_rms(Squares, rows, row, hidden, eps, SPLITS)
    cos, sin = _rope_row(Cos, Sin, pos + ROPE_SHIFT, D)  # ROPE_SHIFT: a test's fault
    if head < HEADS:
        q = _rotated_heads(Parts, rows, n_total, row, head * D + tl.zeros([1, 1], tl.int32), inv_rms, QNorm, cos,
                           sin, eps, SPLITS, QK_NORM, D)
        tl.store(Q + (row * HEADS + head) * D + tl.arange(0, D)[None, :], q.to(Q.dtype.element_ty))
    else:
        _append(Parts, rows, n_total, row, head - HEADS, inv_rms, KNorm, cos, sin, pos, eps, Keys, Values, k_row,
                k_head, k_slot, v_row, v_head, v_slot, HEADS, KV_HEADS, D, SPLITS, QK_NORM, APPEND)


@triton.jit
def _head_norm(x1, x2, Gain, half, eps, D: tl.constexpr):
    """Qwen3's RMSNorm over each head's dimensions (the last axis: [D / 2] halves, or [heads, D / 2])."""
    r = tl.rsqrt((tl.sum(x1 * x1, -1, keep_dims=True) + tl.sum(x2 * x2, -1, keep_dims=True)) / D + eps)
    return x1 * r * tl.load(Gain + half).to(tl.float32), x2 * r * tl.load(Gain + D // 2 + half).to(tl.float32)


@triton.jit
def _summed(Parts, rows, n_total, row, col, offsets, SPLITS: tl.constexpr, mask=None):
    """The QKV product's split partial sums at columns col + offsets, added up (0 where `mask`, if given, is off)."""
    total = _part(Parts + row * n_total + col + offsets, mask)
    for s in tl.static_range(1, SPLITS):
        total += _part(Parts + (s * rows + row) * n_total + col + offsets, mask)
    return total


@triton.jit
def _part(at, mask):
    if mask is None:
        return tl.load(at)
    else:
        return tl.load(at, mask=mask, other=0.0)


@triton.jit
def _inv_rms(Squares, rows, row, hidden, eps, SPLITS: tl.constexpr):
    """1/rms of a row of the layer's input, from the QKV product's split partial sums of its squares."""
    squares = tl.load(Squares + row)
    for s in tl.static_range(1, SPLITS):
        squares += tl.load(Squares + s * rows + row)
    return tl.rsqrt(squares / hidden + eps)


@triton.jit
def _rope_row(Cos, Sin, at, D: tl.constexpr):
    """RoPE's cos and sin at position `at`, each [1, D / 2] fp32."""
    half = tl.arange(0, D // 2)[None, :]
    return tl.load(Cos + at * (D // 2) + half), tl.load(Sin + at * (D // 2) + half)


@triton.jit
def _rotated_heads(Parts, rows, n_total, row, cols, inv_rms, Gain, cos, sin, eps, SPLITS: tl.constexpr,
                   QK_NORM: tl.constexpr, D: tl.constexpr, real=None):
    """The heads whose first QKV columns are `cols` [H, 1]: summed partials times 1/rms, Qwen3's head norm, RoPE by
    the position's rows `cos` and `sin` (_rope_row), as [H, D] fp32."""
    half = tl.arange(0, D // 2)[None, :]
    x1 = _summed(Parts, rows, n_total, row, cols, half, SPLITS, real) * inv_rms
    x2 = _summed(Parts, rows, n_total, row, cols + D // 2, half, SPLITS, real) * inv_rms
    if QK_NORM:
        x1, x2 = _head_norm(x1, x2, Gain, half, eps, D)
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin  # transformers' rotate_half convention
    return tl.reshape(tl.permute(tl.join(y1, y2), (0, 2, 1)), (y1.shape[0], D))  # [H, 2, D / 2]: halves in order


@triton.jit
def _append(Parts, rows, n_total, row, kv_head, inv_rms, KNorm, cos, sin, pos, eps, Keys, Values, k_row, k_head,
            k_slot, v_row, v_head, v_slot, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr,
            SPLITS: tl.constexpr, QK_NORM: tl.constexpr, APPEND: tl.constexpr):
    """The new token's K (normed, rotated) and V of one KV head, written to the cache at slot `pos`; returned too,
    each [1, D] in fp32."""
    col = (HEADS + kv_head) * D + tl.zeros([1, 1], tl.int32)
    k = _rotated_heads(Parts, rows, n_total, row, col, inv_rms, KNorm, cos, sin, eps, SPLITS, QK_NORM, D)
    d = tl.arange(0, D)[None, :]
    v = _summed(Parts, rows, n_total, row, col + KV_HEADS * D, d, SPLITS) * inv_rms
    if APPEND:  # APPEND off: a test's fault (the new token's K/V never reach the cache)
        tl.store(Keys + row * k_row + kv_head * k_head + pos * k_slot + d, k.to(Keys.dtype.element_ty))
        tl.store(Values + row * v_row + kv_head * v_head + pos * v_slot + d, v.to(Values.dtype.element_ty))
    return k, v


@triton.jit
def _attention(Parts, Squares, Pos, Cos, Sin, QNorm, KNorm, Keys, Values, Acc, M, L, Count, Out, rows, n_total,
               hidden, eps, scale, k_row, k_head, k_slot, v_row, v_head, v_slot, o_row, Ahead1, ahead1_bytes, Ahead2,
               ahead2_bytes, ahead_share, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr,
               D: tl.constexpr, QKV_SPLITS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
               QK_NORM: tl.constexpr, ROPE_SHIFT: tl.constexpr, APPEND: tl.constexpr, IEEE: tl.constexpr,
               MERGE_BLOCK: tl.constexpr, PDL: tl.constexpr, MASK_PAD: tl.constexpr = True, KV_PREFETCH: tl.constexpr =
               False, TOGETHER: tl.constexpr = False, AHEAD: tl.constexpr = False, NEW_KV_IN_REGISTERS: tl.constexpr =
               False, POSITION_BEFORE_WAIT: tl.constexpr = False, PAST_KV_BEFORE_WAIT: tl.constexpr = False,
               LAUNCH_AT_START: tl.constexpr = True, PAST_KV_BEFORE_QUERIES: tl.constexpr = False):
    """One (row, KV head, chunk of the valid prefix [0, pos]): the group's queries from QKV's partials (1/rms, head
    norm, RoPE), the new K/V appended by the chunk that holds slot pos, attention over the chunk (_chunk), and the
    merge of the chunks by the last to finish; one launch where there were three (RoPE + append, split-KV, merge).
    AHEAD: each program asks L2 for its share of the MLP's weights (Ahead1's, then Ahead2's; fused.weights_ahead)
    once its chunk's K/V are read (at once, past the valid prefix's chunks). POSITION_BEFORE_WAIT, PAST_KV_BEFORE_WAIT:
    what it reads before its PDL wait (the module's constants say why it is safe); PAST_KV_BEFORE_QUERIES: after it."""
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    program = (row * KV_HEADS + kv_head) * SPLITS + split
    _pdl_wait_launch(PDL, False, LAUNCH_AT_START)  # (ATTENTION_LAUNCH_AT_START)
    _pdl_wait_launch(PDL, not (POSITION_BEFORE_WAIT or PAST_KV_BEFORE_WAIT), False)
    pos = tl.load(Pos, cache_modifier=".cg")  # from L2: no line of an earlier step's position in this SM's L1
    cos, sin = _rope_row(Cos, Sin, pos + ROPE_SHIFT, D)  # ROPE_SHIFT: a test's fault
    start, end, chunks = chunk_of(pos.to(tl.int32) + 1, split, SPLITS, BLOCK_N)
    first_k, first_v = _first_block(Keys, Values, row, kv_head, start, tl.minimum(end, pos.to(tl.int32)), k_row, k_head,
                                    k_slot, v_row, v_head, v_slot, pos, D, BLOCK_N,
                                    PAST_KV_BEFORE_WAIT or PAST_KV_BEFORE_QUERIES)
    _pdl_wait_launch(PDL, POSITION_BEFORE_WAIT or PAST_KV_BEFORE_WAIT, not LAUNCH_AT_START)
    if split < chunks:  # the programs past the valid prefix's chunks have nothing to read
        if KV_PREFETCH:
            _chunk_to_l2(Keys, Values, row, kv_head, start, end, k_row, k_head, k_slot, v_row, v_head, v_slot)
        acc, m_i, l_i = _chunk(Parts, Squares, cos, sin, QNorm, KNorm, Keys, Values, pos, rows, n_total, hidden, eps,
                               scale, k_row, k_head, k_slot, v_row, v_head, v_slot, row, kv_head, start, end,
                               split == chunks - 1, first_k, first_v, HEADS, KV_HEADS, GROUP_PAD, D, QKV_SPLITS,
                               BLOCK_N, QK_NORM, APPEND, IEEE, MASK_PAD, NEW_KV_IN_REGISTERS,
                               PAST_KV_BEFORE_WAIT or PAST_KV_BEFORE_QUERIES)
        if AHEAD:  # asked at the wait instead, the requests held up the chunks' own reads (docs/benchmarks.md)
            _weights_to_l2(Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share, program)
        _finish(acc, m_i, l_i, Acc, M, L, Count, Out, o_row, row, kv_head, split, chunks, HEADS, KV_HEADS, GROUP_PAD,
                D, SPLITS, MERGE_BLOCK, TOGETHER)
    elif AHEAD:
        _weights_to_l2(Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share, program)


@triton.jit
def _first_block(Keys, Values, row, kv_head, start, before, k_row, k_head, k_slot, v_row, v_head, v_slot, pos,
                 D: tl.constexpr, BLOCK_N: tl.constexpr, READ: tl.constexpr):
    """Where READ, the K and V of the chunk's first block of slots before the new token's (`before` on: none; none
    at all where the chunk is past the prefix); else `pos` twice, which the chunk does not use."""
    if READ:
        return kv_block(Keys, Values, row, kv_head, start + tl.arange(0, BLOCK_N), before, k_row, k_head, k_slot,
                        v_row, v_head, v_slot, D)
    else:
        return pos, pos


@triton.jit
def _chunk_to_l2(Keys, Values, row, kv_head, start, end, k_row, k_head, k_slot, v_row, v_head, v_slot):
    """The chunk's K and V asked of L2: its slots are contiguous (k_slot, v_slot == D), one request each, not waited
    for."""
    _prefetch_to_l2(Keys, row * k_row + kv_head * k_head + start * k_slot,
                    (end - start) * k_slot * (Keys.dtype.element_ty.primitive_bitwidth // 8))
    _prefetch_to_l2(Values, row * v_row + kv_head * v_head + start * v_slot,
                    (end - start) * v_slot * (Values.dtype.element_ty.primitive_bitwidth // 8))


@triton.jit
def _chunk(Parts, Squares, cos, sin, QNorm, KNorm, Keys, Values, pos, rows, n_total, hidden, eps, scale, k_row, k_head,
           k_slot, v_row, v_head, v_slot, row, kv_head, start, end, holds_pos, first_k, first_v, HEADS: tl.constexpr,
           KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, QKV_SPLITS: tl.constexpr,
           BLOCK_N: tl.constexpr, QK_NORM: tl.constexpr, APPEND: tl.constexpr, IEEE: tl.constexpr,
           MASK_PAD: tl.constexpr, NEW_KV_IN_REGISTERS: tl.constexpr, FIRST_BLOCK: tl.constexpr):
    """The group's queries and its partial softmax over the chunk [start, end), the new K/V appended where the chunk
    holds slot pos (`holds_pos`). NEW_KV_IN_REGISTERS or FIRST_BLOCK (the chunk's first block of slots before pos
    read already: first_k, first_v): the chunk starts from the new K/V as computed and reads only the slots before
    pos; else it appends, waits at a barrier and reads every slot, the new one from its own store."""
    inv_rms = _inv_rms(Squares, rows, row, hidden, eps, QKV_SPLITS)
    q = _group_queries(Parts, rows, n_total, row, kv_head, inv_rms, QNorm, cos, sin, eps, HEADS, KV_HEADS,
                       GROUP_PAD, D, QKV_SPLITS, QK_NORM, MASK_PAD).to(Keys.dtype.element_ty)
    if NEW_KV_IN_REGISTERS or FIRST_BLOCK:
        acc, m_i, l_i = _with_new_token(q, Parts, rows, n_total, row, kv_head, inv_rms, KNorm, cos, sin, pos, eps,
                                        scale, Keys, Values, k_row, k_head, k_slot, v_row, v_head, v_slot, start, end,
                                        holds_pos, first_k, first_v, HEADS, KV_HEADS, GROUP_PAD, D, QKV_SPLITS,
                                        QK_NORM, APPEND, BLOCK_N, IEEE, FIRST_BLOCK)
    else:
        if holds_pos:  # the new K/V first, seen by all the program's threads before the chunk's loads
            _append(Parts, rows, n_total, row, kv_head, inv_rms, KNorm, cos, sin, pos, eps, Keys, Values, k_row,
                    k_head, k_slot, v_row, v_head, v_slot, HEADS, KV_HEADS, D, QKV_SPLITS, QK_NORM, APPEND)
            tl.debug_barrier()
        acc, m_i, l_i = chunk_softmax(q, Keys, Values, row, kv_head, start, end, scale, k_row, k_head, k_slot, v_row,
                                      v_head, v_slot, GROUP_PAD, D, BLOCK_N, IEEE)
    return acc, m_i, l_i


@triton.jit
def _with_new_token(q, Parts, rows, n_total, row, kv_head, inv_rms, KNorm, cos, sin, pos, eps, scale, Keys, Values,
                    k_row, k_head, k_slot, v_row, v_head, v_slot, start, end, holds_pos, first_k, first_v,
                    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                    QKV_SPLITS: tl.constexpr, QK_NORM: tl.constexpr, APPEND: tl.constexpr, BLOCK_N: tl.constexpr,
                    IEEE: tl.constexpr, FIRST_BLOCK: tl.constexpr):
    """A chunk's partial softmax over slots [start, end) that reads only the slots before pos from the cache: the
    chunk that holds slot pos (`holds_pos`) appends the new token's K/V and starts from them as computed, rounded to
    the cache's dtype (what a read of the cache would give), so that none of its loads waits for its own store.
    FIRST_BLOCK: the chunk's first block of those slots is first_k, first_v, read already."""
    m_i, l_i, acc = empty_softmax(GROUP_PAD, D)
    if holds_pos:
        k, v = _append(Parts, rows, n_total, row, kv_head, inv_rms, KNorm, cos, sin, pos, eps, Keys, Values,
                       k_row, k_head, k_slot, v_row, v_head, v_slot, HEADS, KV_HEADS, D, QKV_SPLITS, QK_NORM, APPEND)
        m_i = tl.sum(q.to(tl.float32) * k.to(Keys.dtype.element_ty).to(tl.float32), 1) * scale
        l_i = m_i * 0.0 + 1.0  # exp(m_i - m_i): the new token's weight
        acc = acc + v.to(Values.dtype.element_ty).to(tl.float32)
    before = tl.minimum(end, pos.to(tl.int32))  # the slots the cache held before this step
    if FIRST_BLOCK:  # where the chunk does not hold pos, its first block has a slot; where it does, m_i is finite
        inside = start + tl.arange(0, BLOCK_N) < before
        m_i, l_i, acc = softmax_block(q, first_k, first_v, inside, scale, m_i, l_i, acc, IEEE)
        start = start + BLOCK_N
    return softmax_over(q, Keys, Values, row, kv_head, start, before, scale, k_row, k_head, k_slot, v_row, v_head,
                        v_slot, m_i, l_i, acc, D, BLOCK_N, IEEE)


@triton.jit
def _group_queries(Parts, rows, n_total, row, kv_head, inv_rms, QNorm, cos, sin, eps, HEADS: tl.constexpr,
                   KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, QKV_SPLITS: tl.constexpr,
                   QK_NORM: tl.constexpr, MASK_PAD: tl.constexpr):
    """The KV head's group of queries [GROUP_PAD, D], normed and rotated, padded to the MMA's 16 rows."""
    group, g = HEADS // KV_HEADS, tl.arange(0, GROUP_PAD)
    if MASK_PAD:  # the MMA's padding rows load nothing (zero queries, never stored)
        heads, real = kv_head * group + g, (g < group)[:, None]
    else:  # they repeat the last head's loads
        heads, real = kv_head * group + tl.minimum(g, group - 1), None
    return _rotated_heads(Parts, rows, n_total, row, heads[:, None] * D, inv_rms, QNorm, cos, sin, eps,
                          QKV_SPLITS, QK_NORM, D, real)


@triton.jit
def _finish(acc, m_i, l_i, Acc, M, L, Count, Out, o_row, row, kv_head, split, chunks, HEADS: tl.constexpr,
            KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
            MERGE_BLOCK: tl.constexpr, TOGETHER: tl.constexpr = False):
    """A chunk's partial softmax to the output: normalised where it is the only chunk; else stored, counted, and
    the last chunk of the KV head to be counted merges them all (then zeroes the count for the next layer)."""
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    heads, real = kv_head * (HEADS // KV_HEADS) + g, g < HEADS // KV_HEADS
    out_at = Out + row * o_row + heads[:, None] * D + d[None, :]
    if chunks == 1:
        _store_group(acc, l_i, Out, o_row, row, kv_head, HEADS, KV_HEADS, GROUP_PAD, D)
    else:
        at = (row * HEADS + heads) * SPLITS + split
        tl.store(Acc + at[:, None] * D + d[None, :], acc, mask=real[:, None])
        tl.store(M + at, m_i, mask=real)
        tl.store(L + at, l_i, mask=real)
        tl.debug_barrier()  # every thread's partials written before the count (released at the GPU's scope) says so
        counted = tl.atomic_add(Count + row * KV_HEADS + kv_head, 1, sem="acq_rel", scope="gpu")
        if counted == chunks - 1:  # the last: the chunks from L2 (".cg": other SMs wrote them)
            if TOGETHER:  # SPLITS chunks fit one load: every head's at once
                _merge_group(Acc, M, L, out_at, row, kv_head, chunks, HEADS, KV_HEADS, GROUP_PAD, D, SPLITS)
            else:  # one head after another, MERGE_BLOCK chunks a load
                for h in tl.static_range(HEADS // KV_HEADS):
                    head = kv_head * (HEADS // KV_HEADS) + h
                    out = merge_head(Acc, M, L, (row * HEADS + head) * SPLITS, chunks, D, MERGE_BLOCK, ".cg")
                    tl.store(Out + row * o_row + head * D + d, out.to(Out.dtype.element_ty))
            tl.store(Count + row * KV_HEADS + kv_head, 0)


@triton.jit
def _store_group(acc, l_i, Out, o_row, row, kv_head, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                 GROUP_PAD: tl.constexpr, D: tl.constexpr):
    """The KV head's group of heads' output from their one chunk's softmax (the padding rows not stored)."""
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    heads, real = kv_head * (HEADS // KV_HEADS) + g, g < HEADS // KV_HEADS
    tl.store(Out + row * o_row + heads[:, None] * D + d[None, :], (acc / l_i[:, None]).to(Out.dtype.element_ty),
             mask=real[:, None])


@triton.jit
def _merge_group(Acc, M, L, out_at, row, kv_head, chunks, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                 GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """The group's heads from their first `chunks` chunks (SPLITS at most), straight-line code: each head's chunks in
    one load from L2, and one store of all heads after every load, so that the heads' loads can be in flight
    together (merge_head's loop and a store after each head keep them one after another)."""
    c, d, g = tl.arange(0, SPLITS), tl.arange(0, D), tl.arange(0, GROUP_PAD)
    live, outs = c < chunks, tl.zeros([GROUP_PAD, D], tl.float32)
    for h in tl.static_range(HEADS // KV_HEADS):
        base = (row * HEADS + kv_head * (HEADS // KV_HEADS) + h) * SPLITS
        m = tl.load(M + base + c, mask=live, other=float("-inf"), cache_modifier=".cg")
        weight = tl.where(live, tl.exp(m - tl.max(m, 0)), 0.0)
        total = tl.sum(weight * tl.load(L + base + c, mask=live, other=0.0, cache_modifier=".cg"), 0)
        acc = tl.load(Acc + (base + c)[:, None] * D + d[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg")
        outs = tl.where((g == h)[:, None], (tl.sum(weight[:, None] * acc, 0) / total)[None, :], outs)
    tl.store(out_at, outs.to(out_at.dtype.element_ty), mask=(g < HEADS // KV_HEADS)[:, None])


@triton.jit
def _split_kv_ahead(Q, K, V, Pos, Acc, M, L, scale, q_row, q_head, k_row, k_head, k_slot, v_row, v_head, v_slot,
                    Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share, GROUP: tl.constexpr,
                    GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                    IEEE: tl.constexpr, AHEAD: tl.constexpr, PDL: tl.constexpr):
    """attn=triton-decode's split-KV program, then (AHEAD) its share of the MLP's weights asked of L2."""
    _pdl_start(PDL)  # the merge let launch before this program's wait
    _pdl_wait(PDL)
    split_kv_chunk(Q, K, V, Pos, Acc, M, L, scale, q_row, q_head, k_row, k_head, k_slot, v_row, v_head, v_slot, GROUP,
                   GROUP_PAD, D, BLOCK_N, SPLITS, IEEE)
    if AHEAD:
        program = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * SPLITS + tl.program_id(2)
        _weights_to_l2(Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share, program)


@triton.jit
def _merge_ahead(Acc, M, L, Out, o_row, o_head, Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share,
                 HEADS: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, AHEAD: tl.constexpr, PDL: tl.constexpr):
    """attn=triton-decode's merge of one (row, head), (AHEAD) its share of the MLP's weights asked of L2 first: the
    split-KV kernel's reads are over at its wait, and the merge's own are a few partials."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    if AHEAD:
        _weights_to_l2(Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share,
                       tl.program_id(0) * HEADS + tl.program_id(1))
    merge_one_head(Acc, M, L, Out, o_row, o_head, HEADS, D, SPLITS)


@dataclass(frozen=True)
class Product:
    """One matrix-vector product's launch plan and its weights as the kernel reads them."""

    weight: torch.Tensor
    n: int  # output columns (gate/up: both halves)
    k: int
    bn: int
    bk: int
    splits: int
    dot: bool
    packed: bool
    warps: int = 4
    prefetch_bytes: int = 0  # bytes each program asks L2 for before its PDL wait (0: no prefetch)
    choice: PlanChoice | None = None  # what planned it
    kind: str = ""  # which of a step's products (PRODUCT_KINDS) it is, where its plan was given one
    descriptor: object = None  # the weight's TMA descriptor where its tiles stream through it (TMA_KINDS), else None
    stages: int = 0  # the tiles in flight a program where they do
    copies_first: bool = False  # its TMA copies start before its PDL wait (tma_before_wait.py: one row, packed)
    launch: int = -1  # where its programs let the next kernel launch, where the rules set it for the step (-1: its
    # kind's point: launch_point)

    def __str__(self) -> str:
        shape = f"{self.bn}x{self.bk} " + ("row slices" if self.choice and self.choice.slices else "tiles")
        return (f"{shape}, {self.splits} split{'s' * (self.splits > 1)}, {self.warps} warps, "
                f"{'packed' if self.packed else 'row-major'}" + ", L2 prefetch" * (self.prefetch_bytes > 0)
                + f", TMA {self.stages} stages" * (self.descriptor is not None)
                + ", copied before the wait" * self.copies_first)

    @property
    def prefetch_ahead(self) -> int:
        """Columns of K between the tile a loop iteration loads and the one it asks L2 for: the tiles that the
        first prefetch covered (at least one), or 0 where there is no prefetch or no rolling one."""
        if not (self.prefetch_bytes and ROLLING_PREFETCH):
            return 0
        return max(1, self.prefetch_bytes // (self.bn * self.bk * self.weight.element_size())) * self.bk

    @property
    def grid(self) -> tuple[int, int]:
        return triton.cdiv(self.n, self.bn), self.splits

    @property
    def one_tile(self) -> bool:
        """Whether each K split is a single tile (BK covers it)."""
        return self.bk >= triton.cdiv(self.k, self.splits)

    @property
    def k_tiles(self) -> int:
        return triton.cdiv(self.k, self.bk)


def launch_product(product: Product, x: torch.Tensor, out: torch.Tensor, rows: int, *, residual=None, ids=None,
                   gain=None, squares=None, bump=None, eps: float = 1e-6, input: int = PLAIN, output: int = PARTIALS,
                   pdl: bool = False) -> None:
    """One `_matvec` launch as `product` plans it: x [rows, k] (input=EMBEDDING: the rows of the table x that `ids`
    name) times its weight into `out`, the norm's gain where given, into the fp32 `residual` where output=ADD, the
    cache position `bump` advanced where given. A pointer the launch does not read may be left out (`out` stands
    in). The step and the benchmarks launch products through this one call."""
    if product.copies_first:  # one row
        tma_before_wait.launch(product.descriptor, product.grid, x, out, ids=ids, residual=residual, gain=gain,
                               squares=squares, bump=bump, n=product.n, k=product.k, splits=product.splits,
                               stages=product.stages, warps=product.warps, eps=eps, input=input, output=output,
                               launch_at=launch_point(product), pdl=pdl,
                               sum_each_tile=TMA_COPIES_FIRST_SUM_EACH_TILE)
        return
    residual, ids, gain_given = out if residual is None else residual, out if ids is None else ids, gain is not None
    gain, squares = out if gain is None else gain, out if squares is None else squares
    bump_at = out if bump is None else bump
    shared = product_constants(product, rows, input, output, gain_given, bump is not None, pdl)
    sizes = tuple(product_sizes(product, rows, out.shape[-1], eps).values())
    if product.descriptor is not None:
        _matvec_tma[product.grid](x, x.stride(0), residual, ids, gain, product.weight, product.descriptor, out,
                                  squares, bump_at, *sizes, STAGES=product.stages, FIRST=TMA_FIRST_BEFORE_WAIT,
                                  **shared)
        return
    _matvec[product.grid](x, x.stride(0), residual, ids, gain, product.weight, out, squares, bump_at, *sizes,
                          product.prefetch_ahead, STAGES=PIPELINE_STAGES, ONE_TILE=product.one_tile, **shared)


def product_constants(product: Product, rows: int, input: int, output: int, norm: bool, bump: bool,
                      pdl: bool) -> dict:
    """The compile-time constants and launch options of `product`'s kernel at `rows` batch rows (launch_product's;
    benchmarks/fused_occupancy.py compiles the same)."""
    padded = triton.next_power_of_2(rows)
    return dict(INPUT=input, NORM=norm, OUTPUT=output, SPLITS=product.splits, BUMP=bump,
                ROWS=max(16, padded) if product.dot else padded, BN=product.bn, BK=product.bk,
                PACKED=product.packed, DOT=product.dot, PREFETCH=product.prefetch_bytes > 0,
                LAUNCH=launch_point(product), num_warps=product.warps, **pdl_launch(pdl))


def product_sizes(product: Product, rows: int, out_cols: int, eps: float) -> dict:
    """The scalars `_matvec` and `_matvec_tma` take after their pointers, by name, in their order (launch_product's;
    benchmarks/fused_occupancy.py compiles for the same): `out_cols` is the output buffer's row length."""
    return dict(rows=rows, k_total=product.k, n_total=product.n, out_cols=out_cols,
                k_per_split=triton.cdiv(product.k, product.splits), k_tiles=product.k_tiles, eps=eps,
                prefetch_bytes=product.prefetch_bytes)


def launch_point(product: Product) -> int:
    """Where `product`'s programs let the next kernel launch (AT_WAIT, AFTER_LOOP, AT_END or AT_START): LAUNCH_AT's
    point for its kind, else the point the step set for it, else the rule's: after its stores for a gate/up sliced on
    eight warps, after its loop for the rest."""
    if product.kind in LAUNCH_AT:
        return LAUNCH_AT[product.kind]
    if product.launch >= 0:  # set for the step (FusedDecoder._o_launch)
        return product.launch
    sliced = product.choice is not None and product.choice.slices
    return AT_END if product.kind == "gate_up" and sliced and product.warps >= 8 else AFTER_LOOP


def pdl_launch(pdl: bool) -> dict:
    """A kernel launch's options: PDL's wait and early launch in the kernel, and the launch that lets it overlap."""
    return dict(PDL=True, launch_pdl=True) if pdl else dict(PDL=False)


def merge_block(valid_slots: int, splits: int) -> int:
    """Chunks the folded attention merges a load where a KV head's valid prefix is `valid_slots` long, cut as
    triton_decode.chunk_of cuts it: one at a time for a few chunks, else all of them in one load."""
    chunk = triton.cdiv(triton.cdiv(valid_slots, splits), ATTN_BLOCK_N) * ATTN_BLOCK_N
    chunks = triton.cdiv(valid_slots, chunk)
    if chunks <= SERIAL_MERGE_MAX_CHUNKS:
        return 1
    return min(MAX_MERGE_BLOCK, triton.next_power_of_2(chunks))


def one_chunk_max_slots(rows: int, head_dim: int) -> int:
    """The longest prefix whose attention takes one chunk a (row, KV head): ONE_CHUNK_MAX_SLOTS, or at one row of
    narrow heads ONE_CHUNK_MAX_SLOTS_NARROW."""
    return ONE_CHUNK_MAX_SLOTS_NARROW if rows == 1 and head_dim <= NARROW_HEAD_DIM else ONE_CHUNK_MAX_SLOTS


def attention_chunks(rows: int, kv_heads: int, longest_prefix: int, programs: int, head_dim: int) -> int:
    """Chunks a (row, KV head) of the attention's grid for a run whose longest prefix is `longest_prefix` slots: one
    up to one_chunk_max_slots, else as many as bring the programs to about `programs` (splits_for)."""
    if longest_prefix <= one_chunk_max_slots(rows, head_dim):
        return 1
    return splits_for(rows, kv_heads, longest_prefix, programs)


def kv_within_ahead_window(kv_bytes: int) -> bool:
    """Whether the attention's K/V at the longest prefix leave room for fused.weights_ahead's requests: at least
    WEIGHTS_AHEAD_FROM_KV_BYTES (a chain long enough to hide them), at most WEIGHTS_AHEAD_BYTES."""
    return WEIGHTS_AHEAD_FROM_KV_BYTES <= kv_bytes <= WEIGHTS_AHEAD_BYTES


def attention_folded(options: FusedOptions, rows: int, longest_prefix: int, kv_bytes: int, mlp_bytes: int,
                     head_dim: int) -> bool:
    """Whether a layer's attention is one kernel (folded) or three launches: as fused.fold_attention says, except at
    bs=1 past one chunk a KV head, where it folds only if it reads at least FOLD_MIN_KV_BYTES of K/V (`kv_bytes` a
    layer) and the weights it would ask L2 for ahead of the MLP (of `mlp_bytes`) are at least FOLD_MIN_AHEAD_SHARE of
    them."""
    if not options.fold_attention:
        return False
    if rows > 1 or longest_prefix <= one_chunk_max_slots(rows, head_dim):
        return True
    asked = min(mlp_bytes, WEIGHTS_AHEAD_BYTES) if kv_within_ahead_window(kv_bytes) else 0
    return kv_bytes >= FOLD_MIN_KV_BYTES and asked >= FOLD_MIN_AHEAD_SHARE * mlp_bytes


def group_pad(heads: int, kv_heads: int) -> int:
    """The query tile's rows for a KV head's group of heads: the MMA's least (16), or the group to a power of two."""
    return max(16, triton.next_power_of_2(heads // kv_heads))


def tile_sizes(n: int, k: int) -> tuple[int, int, int]:
    """(BN, BK, warps). On a GPU, tensor cores with the weight tile as the MMA's left operand, 64 x 128: the fastest
    tile at bs 1, 2, 8 and 32 on the H200 (2.4-4.4 TB/s on Llama-3.2-1B's products, where 8 x 512 on CUDA cores
    reached 2.0-3.4 at bs=1 and far less above), on eight warps: alone four were as fast, but in the step eight took
    Llama-3.2-1B's bs=1 step from 1.009 to 0.943 ms (64 x 256 tiles: 1.080; docs/benchmarks.md), though on
    Qwen3-8B at bs=32 four were 6% faster (from FEWER_WARPS_FROM_ROWS batch rows in a wide model, `warps_for` takes
    fewer). In Triton's interpreter (CUDA-core products in fp32), whose cost is per program and per operation, wide
    column blocks and narrow K tiles, so that a tiny model's products still run split and over several tiles (the
    paths the tests check)."""
    if interpreted():
        return min(INTERPRETED_BN, triton.next_power_of_2(n)), min(INTERPRETED_BK, triton.next_power_of_2(k)), 1
    return 64, min(128, triton.next_power_of_2(k)), 8


def warps_for(warps: int, rows: int, hidden: int) -> int:
    """A product's warps at `rows` batch rows in a model of `hidden` size: tile_sizes' own, or FEWER_WARPS from
    FEWER_WARPS_FROM_ROWS rows where the model is FEWER_WARPS_FROM_HIDDEN wide, on a GPU."""
    fewer = rows >= FEWER_WARPS_FROM_ROWS and hidden >= FEWER_WARPS_FROM_HIDDEN and not interpreted()
    return min(warps, FEWER_WARPS) if fewer else warps


def split_count(n: int, k: int, bn: int, bk: int, allowed: bool, most: int | None = None,
                per_sm: int | None = None) -> int:
    """K splits where the column blocks alone are too few: a power of two that brings the programs to at least
    `per_sm` (PROGRAMS_PER_SM) per SM and leaves whole tiles per split, `most` (MAX_SPLITS) at most."""
    blocks, splits, most, per_sm = triton.cdiv(n, bn), 1, most or MAX_SPLITS, per_sm or PROGRAMS_PER_SM
    while allowed and splits < most and blocks * splits < per_sm * SMS and k % (2 * splits * bk) == 0:
        splits *= 2
    return splits


def pack(weight: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """[n, k] row-major -> tile-major: tile (i, j) of bn x bk values contiguous, zeros where it passes the edges."""
    n, k = weight.shape
    padded = weight.new_zeros(triton.cdiv(n, bn) * bn, triton.cdiv(k, bk) * bk)
    padded[:n, :k] = weight
    return padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk).transpose(1, 2).contiguous()


def pair_blocks(gate: torch.Tensor, up: torch.Tensor, half: int) -> torch.Tensor:
    """gate and up [i, k] as one [2 * i', k] weight whose each block of 2 * half rows is `half` rows of gate then the
    same rows of up (i padded to whole halves with zeros): one program computes both for the same outputs."""
    i, k = gate.shape
    padded = triton.cdiv(i, half) * half
    both = gate.new_zeros(2, padded, k)
    both[0, :i], both[1, :i] = gate, up
    return both.view(2, padded // half, half, k).transpose(0, 1).reshape(2 * padded, k)


def blocks_and_splits(n: int, k: int, bk: int, split_k: bool, per_sm: int | None = None) -> tuple[int, int]:
    """(BN, K splits): 64 columns a block, split where the blocks are too few (split_count); and where even the splits
    leave SMs without a program (a 1024-wide model's O and down projections), narrower blocks, down to the MMA's 16.
    (Not gate/up, which cannot split: Qwen3-0.6B's in 32-column blocks, 192 programs, took 13.2 µs against 11.1 in
    64-column blocks, 96 programs, on the H200; docs/benchmarks.md. Split over K, the last split of a block adding
    the others' sums before SiLU, it was 1-8% slower, paired, and was taken out.)"""
    bn = tile_sizes(n, k)[0]
    splits = split_count(n, k, bn, bk, split_k, per_sm=per_sm)
    if not interpreted() and triton.cdiv(n, bn) * splits < SMS:  # more splits first, where K has the tiles
        splits = split_count(n, k, bn, bk, split_k, WIDE_MAX_SPLITS, per_sm)
    while not interpreted() and bn > 16 and triton.cdiv(n, bn) * splits < SMS:
        bn //= 2
        splits = split_count(n, k, bn, bk, split_k, per_sm=per_sm)
    return bn, splits


def slice_layout(n: int, k: int, splittable: bool, warps: int, hidden: int = 0) -> tuple[int, int, int]:
    """(rows a program, BK, K splits) of fused.slices: K split in two until a split is SLICE_COLUMNS or fewer (where
    `splittable`), BK the split's length to the next power of two (the loads past it masked), and as many rows as
    keep slice_values(hidden) of the slice in each of `warps` warps' threads (two at least: gate/up's halves)."""
    splits = 1
    while splittable and triton.cdiv(k, splits) > SLICE_COLUMNS:
        splits *= 2
    bk = triton.next_power_of_2(triton.cdiv(k, splits))
    return max(2, slice_values(hidden) * warps * 32 // bk), bk, splits


def slice_values(hidden: int) -> int:
    """A slice's values a thread in a model of `hidden` size (0: not given): SLICE_VALUES_A_THREAD_NARROW where it is
    SLICE_NARROW_HIDDEN wide at most, else SLICE_VALUES_A_THREAD."""
    return SLICE_VALUES_A_THREAD_NARROW if 0 < hidden <= SLICE_NARROW_HIDDEN else SLICE_VALUES_A_THREAD


def prefetch_bytes(n: int, k: int, bn: int, bk: int, splits: int, element_bytes: int,
                   asked: FusedOptions | PlanChoice) -> int:
    """Bytes each program of a product asks L2 for before its PDL wait: its share of L2_PREFETCH_BYTES, at most its
    slice of the weights, in the bulk prefetch's 16-byte units. 0 where it does not apply: not asked (`asked`: the
    run's options, or the product's own plan choice), row-major weights (a program's tiles are not one run), or
    Triton's interpreter (no inline PTX)."""
    if not (asked.prefetch and asked.packed) or interpreted():
        return 0
    programs = triton.cdiv(n, bn) * splits
    slice_bytes = triton.cdiv(triton.cdiv(k, bk), splits) * bn * bk * element_bytes
    return min(slice_bytes, L2_PREFETCH_BYTES // programs) // 16 * 16


@dataclass(frozen=True)
class PlanChoice:
    """What a product's plan leaves open, one choice per kind of product (every layer's QKV alike): the programs an
    SM its K splits aim at, packed or row-major weights, warps a program, the L2 prefetch before the PDL wait. The
    rules above give each its default; fused.tune=true times the others in the step on the GPU at hand
    (harness/kernels/fused_tune.py)."""

    per_sm: int
    packed: bool = True
    warps: int = 8
    prefetch: bool = False  # its programs ask L2 for their first weights before the PDL wait (packed, Hopper)
    slices: bool = False  # whole-K row slices on CUDA cores (slice_layout; row-major: packed and prefetch unused)

    def __str__(self) -> str:
        if self.slices:
            return f"slices {self.warps}w"
        return (f"{self.per_sm}/SM {'packed' if self.packed else 'row-major'} {self.warps}w"
                + " prefetch" * self.prefetch)


def default_choice(n: int, k: int, options: FusedOptions, rows: int, hidden: int, kind: str = "",
                   element_size: int = 2) -> PlanChoice:
    """The rules' plan for an n x k product of `kind` (PRODUCT_KINDS) with weights of `element_size` bytes at `rows`
    batch rows of a model of `hidden` size: fused.slices for SLICED_KINDS where the rows are few enough and the model
    SLICE_MAX_HIDDEN wide at most, on a GPU (in Triton's interpreter, whose cost is per program, tiles), unless the
    large products' rule streams the kind through TMA or the copies-first rule takes it (copies_first_reaches)."""
    slices = (kind in SLICED_KINDS and hidden <= SLICE_MAX_HIDDEN and slices_apply(options, rows)
              and not large_through_tma(kind, hidden, options, element_size, rows)
              and not copies_first_reaches(kind, hidden, options, element_size, rows, options.packed))
    warps = rule_warps(kind, n, k, options, rows, hidden, slices)
    if slices:
        return PlanChoice(PROGRAMS_PER_SM, options.packed, warps, slices=True)
    per_sm = 1 if kind == "qkv" and qkv_one_an_sm(hidden, options, element_size, rows) else PROGRAMS_PER_SM
    return PlanChoice(per_sm, options.packed, warps, options.prefetch)


def qkv_one_an_sm(hidden: int, options: FusedOptions, element_size: int, rows: int) -> bool:
    """Whether the rules split QKV's K for one program an SM, not PROGRAMS_PER_SM: at QKV_ONE_AN_SM_MAX_ROWS rows at
    most, where the large products' rule (large_rule_model) or the copies-first rule's width (copies_first_width)
    streams the rest of the step, as each was measured: fused.tma=false plans the step before both."""
    return rows <= QKV_ONE_AN_SM_MAX_ROWS and (large_rule_model(hidden, options, element_size)
                                               or copies_first_width(hidden, options, element_size, rows))


def rule_warps(kind: str, n: int, k: int, options: FusedOptions, rows: int, hidden: int, slices: bool) -> int:
    """The warps the rules give a program of an n x k product of `kind`, as fused.slices or as tiles: a slice whose K
    slice_layout does not split (gate/up and lm_head never; QKV, O and down where fused.split_k is off or K is
    SLICE_COLUMNS at most) and is SLICE_MORE_WARPS_FROM columns or more on eight, other slices on SLICE_WARPS;
    tiles on tile_sizes' warps, fewer from many rows in a wide model (warps_for)."""
    if slices:
        splits = slice_layout(n, k, options.split_k and kind in SPLITTABLE_KINDS, SLICE_WARPS, hidden)[2]
        return 8 if splits == 1 and k >= SLICE_MORE_WARPS_FROM else SLICE_WARPS
    return warps_for(tile_sizes(n, k)[2], rows, hidden)


def slices_apply(options: FusedOptions, rows: int) -> bool:
    """Whether the rules plan fused.slices: asked, at SLICE_MAX_ROWS rows or fewer, on a GPU."""
    return options.slices and rows <= SLICE_MAX_ROWS and not interpreted()


def plan(weight: torch.Tensor, options: FusedOptions, splittable: bool, rows: int = 1, hidden: int = 0,
         choice: PlanChoice | None = None, kind: str = "") -> Product:
    """How to run x @ weight.T for `rows` batch rows of a model of `hidden` size (as `choice` says, else by the
    rules), and the weight as the kernel reads it."""
    n, k = weight.shape
    choice = choice or default_choice(n, k, options, rows, hidden, kind, weight.element_size())
    if choice.slices:
        bn, bk, splits = slice_layout(n, k, options.split_k and splittable, choice.warps, hidden)
        return Product(weight.contiguous(), n, k, bn, bk, splits, False, False, choice.warps, 0, choice, kind)
    bk = tile_sizes(n, k)[1]
    bn, splits = blocks_and_splits(n, k, bk, options.split_k and splittable, choice.per_sm)
    return streamed(Product(pack(weight, bn, bk) if choice.packed else weight.contiguous(), n, k, bn, bk, splits,
                            not interpreted(), choice.packed, choice.warps,  # (the interpreter: bf16 tl.dot wrong)
                            prefetch_bytes(n, k, bn, bk, splits, weight.element_size(), choice), choice, kind),
                    options, hidden, rows)


def streamed(product: Product, options: FusedOptions, hidden: int, rows: int) -> Product:
    """`product` with a TMA descriptor of its weight where fused.tma applies (16-bit tiles of TMA_KINDS in a model of
    `hidden` size TMA_FROM_HIDDEN wide or wider, or by the large products' rule at `rows` batch rows): [bn, bk] boxes
    of the packed weight viewed as [tiles * bn, bk], or of the row-major weight; run as tma_before_wait.py's kernel
    where gluon_runs says it may, for the large products and TMA_COPIES_FIRST_SMALL_KINDS in the models they cover, and
    for the kinds the copies-first rule's width takes (copies_first_reaches)."""
    element_size = product.weight.element_size()
    large = large_through_tma(product.kind, hidden, options, element_size, rows)
    small = product.kind in TMA_COPIES_FIRST_SMALL_KINDS and large_rule_model(hidden, options, element_size)
    reached = copies_first_reaches(product.kind, hidden, options, element_size, rows, product.packed)
    wide = (options.tma and hidden >= TMA_FROM_HIDDEN and product.kind in TMA_KINDS
            and tma_element_size(element_size))
    if (large or small or reached) and gluon_runs(product.kind, rows, product.packed):
        split_tiles = triton.cdiv(product.k_tiles, product.splits)
        stages = (TMA_COPIES_FIRST_STAGES if product.kind in TMA_LARGE_KINDS
                  else min(split_tiles, TMA_COPIES_FIRST_SMALL_STAGES))
        return replace(product, descriptor=tma_before_wait.descriptor(product.weight, product.bn, product.bk),
                       stages=TMA_STAGES_OF.get(product.kind, stages), copies_first=True,
                       warps=TMA_COPIES_FIRST_WARPS or product.warps)
    if not (wide or large):
        return product
    stages = TMA_STAGES_OF.get(product.kind, TMA_LARGE_STAGES if large else tma_stages(product))
    boxed = product.weight.view(-1, product.bk) if product.packed else product.weight
    return replace(product, descriptor=TensorDescriptor.from_tensor(boxed, [product.bn, product.bk]), stages=stages)


def gluon_runs(kind: str, rows: int, packed: bool) -> bool:
    """Whether tma_before_wait.py's kernel may run a product of `kind`: TMA_COPIES_BEFORE_WAIT, one row, weights
    packed tile-major, on a GPU (Gluon does not run in Triton's interpreter), a kind whose input and output it takes."""
    return TMA_COPIES_BEFORE_WAIT and rows == 1 and packed and not interpreted() and kind in tma_before_wait.KINDS


def copies_first_width(hidden: int, options: FusedOptions, element_size: int, rows: int) -> bool:
    """Whether the copies-first rule's width takes a step (copies_first_reaches): one row, fused.tma, weights it
    streams, a model between COPIES_FIRST_FROM_HIDDEN and COPIES_FIRST_BELOW_HIDDEN wide."""
    return (rows == 1 and options.tma and tma_element_size(element_size)
            and COPIES_FIRST_FROM_HIDDEN <= hidden < COPIES_FIRST_BELOW_HIDDEN)


def copies_first_reaches(kind: str, hidden: int, options: FusedOptions, element_size: int, rows: int,
                         packed: bool) -> bool:
    """Whether the copies-first rule's width runs a product of `kind` as tma_before_wait.py's kernel: in a step it
    takes (copies_first_width), TMA_LARGE_KINDS, TMA_COPIES_FIRST_SMALL_KINDS and, from COPIES_FIRST_O_FROM_HIDDEN
    wide, O, where the kernel may run it (gluon_runs)."""
    kinds = TMA_LARGE_KINDS + TMA_COPIES_FIRST_SMALL_KINDS + (("o",) if hidden >= COPIES_FIRST_O_FROM_HIDDEN else ())
    return (kind in kinds and copies_first_width(hidden, options, element_size, rows)
            and gluon_runs(kind, rows, packed))


def tma_element_size(element_size: int) -> bool:
    """Whether fused.tma streams weights of `element_size` bytes: 16-bit ones, as measured on a GPU (any, in Triton's
    interpreter)."""
    return element_size == 2 or interpreted()


def large_through_tma(kind: str, hidden: int, options: FusedOptions, element_size: int, rows: int) -> bool:
    """Whether a product of `kind` with weights of `element_size` bytes at `rows` batch rows streams through TMA by the
    large products' rule alone (TMA_LARGE_KINDS, TMA_LARGE_MAX_ROWS rows at most, in a model large_rule_model takes),
    and so runs as tiles where the rules would slice it."""
    return (kind in TMA_LARGE_KINDS and kind in TMA_KINDS and rows <= TMA_LARGE_MAX_ROWS
            and large_rule_model(hidden, options, element_size))


def large_rule_model(hidden: int, options: FusedOptions, element_size: int) -> bool:
    """Whether a step is one the large products' rule applies to: fused.tma, weights it streams (tma_element_size),
    a model between TMA_LARGE_FROM_HIDDEN and TMA_FROM_HIDDEN wide."""
    return options.tma and tma_element_size(element_size) and TMA_LARGE_FROM_HIDDEN <= hidden < TMA_FROM_HIDDEN


def tma_stages(product: Product) -> int:
    """Tiles in flight a program of `product` through TMA: TMA_STAGES_WIDE where its programs pass one wave at
    TMA_PROGRAMS_PER_SM an SM (what a program of TMA_STAGES leaves room for) and fit one at TMA_WIDE_PROGRAMS_PER_SM,
    else TMA_STAGES (within one wave, or several waves either way)."""
    programs = product.grid[0] * product.grid[1]
    wide = TMA_PROGRAMS_PER_SM * SMS < programs <= TMA_WIDE_PROGRAMS_PER_SM * SMS
    return TMA_STAGES_WIDE if wide else TMA_STAGES


def plan_swiglu(gate: torch.Tensor, up: torch.Tensor, options: FusedOptions, rows: int = 1,
                hidden: int = 0, choice: PlanChoice | None = None) -> Product:
    """gate and up as one product whose every BN columns are half gate, half up (never split: SiLU needs whole sums),
    for `rows` batch rows of a model of `hidden` size."""
    both, k = 2 * gate.shape[0], gate.shape[1]
    choice = choice or default_choice(both, k, options, rows, hidden, "gate_up", gate.element_size())
    bn, bk, _ = slice_layout(both, k, False, choice.warps, hidden) if choice.slices else tile_sizes(both, k)
    if not choice.slices and GATE_UP_TILE_COLUMNS:
        bn = GATE_UP_TILE_COLUMNS
    elif (not choice.slices and triton.cdiv(both, bn) < SMS  # (the copies-first rule's 32-column blocks)
          and copies_first_reaches("gate_up", hidden, options, gate.element_size(), rows, choice.packed)):
        bn //= 2
    paired = pair_blocks(gate, up, bn // 2)
    n = paired.shape[0]
    if choice.slices:  # row-major rows, on CUDA cores
        return Product(paired, n, k, bn, bk, 1, False, False, choice.warps, 0, choice, "gate_up")
    return streamed(Product(pack(paired, bn, bk) if choice.packed else paired, n, k, bn, bk, 1, not interpreted(),
                            choice.packed, choice.warps, prefetch_bytes(n, k, bn, bk, 1, paired.element_size(), choice),
                            choice, "gate_up"), options, hidden, rows)


# Each kind of product's weight [n, k], from a decoder layer (lm_head's from the model); gate/up pairs two
# (plan_swiglu). The kinds a step launches, each planned alike in every layer
PRODUCT_WEIGHTS = {
    "qkv": lambda layer: torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                                    layer.self_attn.v_proj.weight]),
    "o": lambda layer: layer.self_attn.o_proj.weight,
    "down": lambda layer: layer.mlp.down_proj.weight,
    "lm_head": lambda model: model.lm_head.weight,
}
PRODUCT_KINDS = ("qkv", "o", "gate_up", "down", "lm_head")
TMA_KINDS: tuple[str, ...] = PRODUCT_KINDS  # the kinds fused.tma streams (a benchmark variant narrows it)
SPLITTABLE_KINDS = ("qkv", "o", "down")  # whose K may split (gate/up needs whole sums; lm_head has blocks enough)


@dataclass
class Layer:
    """One decoder layer's weights as the kernels read them."""

    attn_norm: torch.Tensor
    qkv: Product
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Product
    mlp_norm: torch.Tensor
    gate_up: Product
    down: Product


class FusedDecoder:
    """The weights packed, the buffers allocated and one decode step launched: `step()` reads the input ids
    [rows, 1] and the cache position, appends to the cache, writes the logits [rows, vocab] (fp32) and advances
    every layer's position. `longest_prefix`: the most slots a step will attend to (sizes the attention's chunks
    and merge; any length still computes right); the cache's capacity where not given. `fault`: a test's fault
    inside the kernels ("fused_rope_off_by_one", "kv_append_lost")."""

    def __init__(self, model, cache, input_ids: torch.Tensor, options: FusedOptions, fault: str | None = None,
                 longest_prefix: int | None = None, choices: dict[str, PlanChoice] | None = None):
        config, rows = model.config, input_ids.shape[0]
        self.model, self.options, self.cache, self.input_ids, self.rows = model, options, cache, input_ids, rows
        self.choices = dict(choices or {})  # each kind of product's plan where not the rules' (PlanChoice)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.group_pad = group_pad(self.heads, self.kv_heads)
        self.head_dim = cache.layers[0].keys.shape[-1]
        self.hidden, self.eps = config.hidden_size, config.rms_norm_eps
        self.scale = model.model.layers[0].self_attn.scaling
        self.rope_shift, self.append = int(fault == "fused_rope_off_by_one"), fault != "kv_append_lost"
        with torch.no_grad():
            self.layers = [self._layer(layer) for layer in model.model.layers]
            self.embedding = model.model.embed_tokens.weight
            self.final_norm = model.model.norm.weight
            self.lm_head = self._plan("lm_head", model)
            self.cos, self.sin = rotary_tables(model, cache.layers[0].max_cache_len, cache.layers[0].keys.device)
        capacity = cache.layers[0].max_cache_len
        self.longest_prefix = min(longest_prefix or capacity, capacity)
        mlp_bytes = sum(w.numel() * w.element_size() for w in (self.layers[0].gate_up.weight,
                                                               self.layers[0].down.weight))
        self.folded = attention_folded(options, rows, self.longest_prefix, self._kv_bytes(), mlp_bytes, self.head_dim)
        self._buffers(cache.layers[0].keys)
        self.merge_block = merge_block(self.longest_prefix, self.attn_acc.shape[2])

    def _layer(self, layer) -> Layer:
        attn = layer.self_attn
        norms = [getattr(getattr(attn, name, None), "weight", None) for name in ("q_norm", "k_norm")]
        return self._o_launch(Layer(layer.input_layernorm.weight, self._plan("qkv", layer), *norms,
                                    self._plan("o", layer), layer.post_attention_layernorm.weight,
                                    self._plan("gate_up", layer), self._plan("down", layer)))

    @staticmethod
    def _o_launch(layer: Layer) -> Layer:
        """`layer` with its O product letting the gate/up after it launch at O's PDL wait where that gate/up copies
        its first tiles before its own PDL wait (O_AT_WAIT_BEFORE_COPIES_FIRST), so that the copies overlap O; else
        at O's rule (launch_point)."""
        launch = AT_WAIT if O_AT_WAIT_BEFORE_COPIES_FIRST and layer.gate_up.copies_first else -1
        if layer.o.launch == launch:  # the same product (a replanned decoder shares what it did not replan)
            return layer
        return replace(layer, o=replace(layer.o, launch=launch))

    def _plan(self, kind: str, source) -> Product:
        """`kind`'s product of one decoder layer (`source`; lm_head's: the model) as self.choices says, else by the
        rules."""
        choice, sizes = self.choices.get(kind), (self.rows, self.hidden)
        if kind == "gate_up":
            return plan_swiglu(source.mlp.gate_proj.weight, source.mlp.up_proj.weight, self.options, *sizes,
                               choice=choice)
        return plan(PRODUCT_WEIGHTS[kind](source), self.options, kind in SPLITTABLE_KINDS, *sizes, choice=choice,
                    kind=kind)

    def products(self) -> dict[str, Product]:
        """Each kind's product as it runs (every layer's alike): the first layer's, and lm_head."""
        first = self.layers[0]
        return dict(qkv=first.qkv, o=first.o, gate_up=first.gate_up, down=first.down, lm_head=self.lm_head)

    def replanned(self, kind: str, choice: PlanChoice) -> FusedDecoder:
        """A decoder whose `kind` products are planned as `choice` says, sharing this one's other weights, with
        buffers of its own (a step captured from each can be timed against the other's)."""
        other = copy.copy(self)
        other.choices = {**self.choices, kind: choice}
        with torch.no_grad():
            if kind == "lm_head":
                other.lm_head = other._plan(kind, self.model)
            else:
                other.layers = [other._o_launch(replace(layer, **{kind: other._plan(kind, source)}))
                                for layer, source in zip(self.layers, self.model.model.layers)]
        other._buffers(self.cache.layers[0].keys)
        return other

    def _buffers(self, like: torch.Tensor) -> None:
        rows, first = self.rows, self.layers[0]
        f32 = dict(device=like.device, dtype=torch.float32)
        self.residual = torch.zeros(rows, self.hidden, **f32)  # the residual stream, in fp32, added to in place
        self.qkv_parts = torch.zeros(first.qkv.splits, rows, first.qkv.n, **f32)
        self.squares = torch.zeros(first.qkv.splits, rows, **f32)
        self.q = torch.zeros(rows, self.heads, self.head_dim, device=like.device, dtype=like.dtype)
        self.attn_out = torch.zeros(rows, self.heads * self.head_dim, device=like.device, dtype=like.dtype)
        self.act = torch.zeros(rows, first.down.k, device=like.device, dtype=like.dtype)
        self.logits = torch.zeros(rows, self.lm_head.n, **f32)
        splits = self._attention_splits()
        self.attn_acc = torch.empty(rows, self.heads, splits, self.head_dim, **f32)
        self.attn_max, self.attn_sum = (torch.empty(rows, self.heads, splits, **f32) for _ in range(2))
        # chunks of each (row, KV head) done in the folded attention: the last merges them and sets it back to 0
        self.chunks_done = torch.zeros(rows, self.kv_heads, device=like.device, dtype=torch.int32)


    def _attention_splits(self) -> int:
        """The attention's chunks a (row, KV head): for the longest prefix the run decodes to, or the cache's
        capacity (CHUNKS_BY_PREFIX), aimed at the folded kernel's programs or the three launches'."""
        programs = ATTENTION_PROGRAMS if self.folded else UNFOLDED_ATTENTION_PROGRAMS
        if CHUNKS_BY_PREFIX:
            return attention_chunks(self.rows, self.kv_heads, self.longest_prefix, programs, self.head_dim)
        return splits_for(self.rows, self.kv_heads, self.cache.layers[0].max_cache_len, programs)

    def _kv_bytes(self) -> int:
        """Bytes of K and V a layer's attention reads at the longest prefix."""
        keys = self.cache.layers[0].keys
        return 2 * self.rows * self.kv_heads * self.longest_prefix * self.head_dim * keys.element_size()

    def kernels_per_step(self) -> int:
        return (5 if self.folded else 7) * len(self.layers) + 1

    def step(self) -> torch.Tensor:
        position = self.cache.layers[0].cumulative_length
        for index, (layer, kv) in enumerate(zip(self.layers, self.cache.layers)):
            # at layer 0 the embedding rows of the input ids are the residual stream's first value
            x, source = (self.embedding, EMBEDDING) if index == 0 else (self.residual, PLAIN)
            bump = kv.cumulative_length if index else None  # layer 0's, which every kernel reads, goes last (lm_head)
            self._product(layer.qkv, self.qkv_parts, x, input=source, gain=layer.attn_norm)
            if self.folded:
                self._attention(layer, kv, position)
            else:
                self._rope_append(layer, kv, position)
                self._attend(layer, kv, position)
            self._product(layer.o, self.residual, self.attn_out, output=ADD, bump=bump)
            self._product(layer.gate_up, self.act, self.residual, gain=layer.mlp_norm, output=SWIGLU)
            self._product(layer.down, self.residual, self.act, output=ADD)
        self._product(self.lm_head, self.logits, self.residual, gain=self.final_norm, output=LOGITS, bump=position)
        return self.logits

    def _product(self, product: Product, out: torch.Tensor, x: torch.Tensor, input=PLAIN, gain=None,
                 output=PARTIALS, bump=None) -> None:
        """One `_matvec` launch: x (or the embedding rows of the input ids, x the table) times product's weight."""
        launch_product(product, x, out, self.rows, residual=self.residual, ids=self.input_ids, gain=gain,
                       squares=self.squares, bump=bump, eps=self.eps, input=input, output=output, pdl=self.options.pdl)

    def _launch(self) -> dict:
        return pdl_launch(self.options.pdl)

    @staticmethod
    def _head_norms(layer: Layer, absent: torch.Tensor) -> list[torch.Tensor]:
        """Qwen3's q and k RMSNorm gains as a kernel takes them; `absent` stands in for each a model lacks (Llama:
        QK_NORM off, the pointer never read)."""
        return [absent if w is None else w for w in (layer.q_norm, layer.k_norm)]

    def _rope_append(self, layer: Layer, kv, position: torch.Tensor) -> None:
        keys, values = kv.keys, kv.values
        norms = self._head_norms(layer, self.q)
        _rope_append[(self.rows, self.heads + self.kv_heads)](
            self.qkv_parts, self.squares, position, self.cos, self.sin, *norms, self.q, keys, values, self.rows,
            layer.qkv.n, self.hidden, self.eps, keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
            values.stride(1), values.stride(2), HEADS=self.heads, KV_HEADS=self.kv_heads, D=self.head_dim,
            SPLITS=layer.qkv.splits, QK_NORM=layer.q_norm is not None, ROPE_SHIFT=self.rope_shift,
            APPEND=self.append, **self._launch())

    def _attention(self, layer: Layer, kv, position: torch.Tensor) -> None:
        """RoPE, the append, attention over the valid prefix [0, position] and the merge: one launch."""
        keys, values, splits = kv.keys, kv.values, self.attn_acc.shape[2]
        norms = self._head_norms(layer, self.cos)
        ahead = self.weights_ahead(layer)
        _attention[(self.rows, self.kv_heads, splits)](
            self.qkv_parts, self.squares, position, self.cos, self.sin, *norms, keys, values, self.attn_acc,
            self.attn_max, self.attn_sum, self.chunks_done, self.attn_out, self.rows, layer.qkv.n, self.hidden,
            self.eps, self.scale, *keys.stride()[:3], *values.stride()[:3], self.attn_out.stride(0),
            *(ahead or (keys, 0, keys, 0, 0)), AHEAD=ahead is not None, HEADS=self.heads, KV_HEADS=self.kv_heads,
            GROUP_PAD=self.group_pad, D=self.head_dim, QKV_SPLITS=layer.qkv.splits, SPLITS=splits, BLOCK_N=ATTN_BLOCK_N,
            QK_NORM=layer.q_norm is not None, ROPE_SHIFT=self.rope_shift, APPEND=self.append,
            IEEE=keys.dtype == torch.float32 or interpreted(), MERGE_BLOCK=self.merge_block,
            MASK_PAD=QUERY_PADDING_MASKED, KV_PREFETCH=self._kv_prefetch(keys, values),
            TOGETHER=MERGE_HEADS_TOGETHER and splits <= MAX_MERGE_BLOCK, NEW_KV_IN_REGISTERS=NEW_KV_IN_REGISTERS,
            POSITION_BEFORE_WAIT=POSITION_BEFORE_WAIT, PAST_KV_BEFORE_WAIT=PAST_KV_BEFORE_WAIT,
            LAUNCH_AT_START=ATTENTION_LAUNCH_AT_START, PAST_KV_BEFORE_QUERIES=PAST_KV_BEFORE_QUERIES,
            num_warps=FOLDED_ATTENTION_WARPS, num_stages=FOLDED_ATTENTION_STAGES, **self._launch())

    def weights_ahead(self, layer: Layer) -> tuple | None:
        """What the layer's attention asks L2 for (fused.weights_ahead), as its launch takes it: gate/up's weights and
        the bytes of them, down's and theirs, and the bytes a program asks for; None where it does not apply: off, the
        attention not folded and its three launches asking for none (UNFOLDED_AHEAD_IN), a CPU (the bulk prefetch is
        inline PTX), or more K/V to read at the longest prefix than the budget (the attention then keeps HBM busy
        itself), or less than WEIGHTS_AHEAD_FROM_KV_BYTES (too short a chain to hide the requests)."""
        first, second = layer.gate_up.weight, layer.down.weight
        if (not (self.options.weights_ahead and (self.folded or UNFOLDED_AHEAD_IN)) or interpreted()
                or not kv_within_ahead_window(self._kv_bytes()) or first.data_ptr() % 16 or second.data_ptr() % 16):
            return None
        bytes1 = min(first.numel() * first.element_size(), WEIGHTS_AHEAD_BYTES) // 16 * 16  # the bulk prefetch's unit
        bytes2 = min(second.numel() * second.element_size(), WEIGHTS_AHEAD_BYTES - bytes1) // 16 * 16
        programs = self.rows * (self.heads if not self.folded and UNFOLDED_AHEAD_IN == "merge" else
                                self.kv_heads * self.attn_acc.shape[2])
        return first, bytes1, second, bytes2, triton.cdiv(triton.cdiv(bytes1 + bytes2, programs), 16) * 16

    def attention_plan(self) -> str:
        """The layer's attention as the run's `fused_plan` tag says: folded or three launches (and why), and what it
        asks of L2."""
        ahead = self.weights_ahead(self.layers[0])
        asked = f"{(ahead[1] + ahead[3]) / 2**20:.1f} MiB of the MLP's weights asked of L2" if ahead else ""
        if not self.folded:
            why = "fused.fold_attention=false" if not self.options.fold_attention else (
                f"bs=1 past one chunk a KV head, under {FOLD_MIN_KV_BYTES / 2**20:.1f} MiB of K/V or "
                f"{FOLD_MIN_AHEAD_SHARE:.0%} of the MLP's weights asked ahead")
            return f"attention: three launches ({why}{f'; {asked} by its {UNFOLDED_AHEAD_IN}' if ahead else ''})"
        return f"attention: {asked}" if ahead else "attention: no weights asked of L2"

    def _kv_prefetch(self, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """KV_PREFETCH where it applies: a GPU (the bulk prefetch is inline PTX) and each KV head's slots contiguous."""
        return KV_PREFETCH and not interpreted() and all(
            t.stride(3) == 1 and t.stride(2) == self.head_dim for t in (keys, values))

    def _attend(self, layer: Layer, kv, position: torch.Tensor) -> None:
        """attn=triton-decode's split-KV kernel and merge over the valid prefix [0, position], one of them asking L2
        for the MLP's weights where UNFOLDED_AHEAD_IN says (weights_ahead)."""
        keys, values, q, group = kv.keys, kv.values, self.q, self.heads // self.kv_heads
        splits, ahead, none = self.attn_acc.shape[2], self.weights_ahead(layer), (keys, 0, keys, 0, 0)
        in_split, in_merge = (ahead is not None and UNFOLDED_AHEAD_IN == at for at in ("split", "merge"))
        _split_kv_ahead[(self.rows, self.kv_heads, splits)](
            q, keys, values, position, self.attn_acc, self.attn_max, self.attn_sum, self.scale, q.stride(0),
            q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1),
            values.stride(2), *(ahead if in_split else none), GROUP=group, GROUP_PAD=self.group_pad, D=self.head_dim,
            BLOCK_N=ATTN_BLOCK_N, SPLITS=splits, IEEE=q.dtype == torch.float32 or interpreted(), AHEAD=in_split,
            num_warps=SPLIT_KV_WARPS, num_stages=SPLIT_KV_STAGES, **self._launch())
        _merge_ahead[(self.rows, self.heads)](
            self.attn_acc, self.attn_max, self.attn_sum, self.attn_out, self.attn_out.stride(0), self.head_dim,
            *(ahead if in_merge else none), HEADS=self.heads, D=self.head_dim, SPLITS=splits, AHEAD=in_merge,
            **self._launch())


def rotary_tables(model, positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions + 1, head_dim / 2] in fp32, from the model's own rotary embedding (its scaling
    included); each half of transformers' tables repeats the other. One more position than the cache holds: a
    test's fault reads one ahead."""
    position_ids = torch.arange(positions + 1, device=device)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1, device=device, dtype=torch.float32), position_ids)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()
