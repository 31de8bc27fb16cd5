"""How far ahead mode=fused's programs should ask L2 for their weights, and on how many warps: each variant's step
captured in one process on one GPU, then timed in alternating blocks (forward then backward order, round after
round), so that a drift of the GPU falls on every variant alike. On a CUDA GPU:
    python benchmarks/fused_prefetch.py model=llama-3.2-1b bs=1 context_len=32 cache_len=16384
    python benchmarks/fused_prefetch.py --only 0,2,5 model=qwen3-0.6b bs=8 context_len=16384   # some variants (each
                                                                                # holds a cache and packed weights)
    python benchmarks/fused_prefetch.py --set attention model=...   # the attention's fold rule, folded, or three
                                                                    # launches (asking L2 for the MLP's weights)
    python benchmarks/fused_prefetch.py --set unfolded_chunks model=...  # the three launches' chunks, against the
                                                                    # rule and the fold
    python benchmarks/fused_prefetch.py --set attention_warps model=...  # the attention's warps and K/V blocks in
                                                                    # flight
    python benchmarks/fused_prefetch.py --set copies_first model=...  # the large products' copies before the wait
    python benchmarks/fused_prefetch.py --set qkv_o_first model=...  # QKV's and O's copies before the wait too
    python benchmarks/fused_prefetch.py --set copies_first_reach model=...  # that rule at 1024 and 4096 wide; its warps
    python benchmarks/fused_prefetch.py --set merge model=...       # chunks the folded attention merges a load
    python benchmarks/fused_prefetch.py --set loop model=...        # weight tiles in flight in a product's loop
    python benchmarks/fused_prefetch.py --set chunks model=...      # the attention's chunks: how many programs
    python benchmarks/fused_prefetch.py --set padding model=...     # the attention's padding query rows
    python benchmarks/fused_prefetch.py --set before model=...      # eight warps and the folded attention, or not
    python benchmarks/fused_prefetch.py --set kv model=...          # the attention's K/V asked of L2 early, the
                                                                    # group's heads merged together
    python benchmarks/fused_prefetch.py --set first model=...       # the new token's K/V from registers or the cache
    python benchmarks/fused_prefetch.py --set wait model=...        # the attention's reads before its PDL wait
    python benchmarks/fused_prefetch.py --set launch model=...      # where each kernel lets the next launch
    python benchmarks/fused_prefetch.py --set slices model=...      # a slice's values a thread; gate/up as tiles
    python benchmarks/fused_prefetch.py --set queries model=...     # the chunk's first K/V before the queries
    python benchmarks/fused_prefetch.py --set rules model=...       # the slice rule against the kernels before
    python benchmarks/fused_prefetch.py --set tma model=...         # the tiles' weights through TMA, or registers
    python benchmarks/fused_prefetch.py --set width model=qwen3-4b  # a model between the rules' widths
    python benchmarks/fused_prefetch.py --set study model=...       # the public study's blocks and early launch
    python benchmarks/fused_prefetch.py --set big_tma model=...     # gate/up, down, lm_head as tiles through TMA
    python benchmarks/fused_prefetch.py --set large_stages model=...  # their tiles in flight through TMA (2048 wide)
    python benchmarks/fused_prefetch.py --set tma_first model=...   # what a TMA program copies before its PDL wait
    python benchmarks/fused_prefetch.py --set large_tiles model=...  # the large products' TMA tiles, K splits
    python benchmarks/fused_prefetch.py --set qkv_splits model=...  # QKV split for one program an SM (2048 wide)
    python benchmarks/fused_prefetch.py --set products model=...    # the products' K splits and tile shapes
    python benchmarks/fused_prefetch.py --set splits model=...      # fewer splits; more before blocks narrow
    python benchmarks/fused_prefetch.py --set gateup model=qwen3-8b ...  # an 8B model's gate/up blocks
    python benchmarks/fused_prefetch.py --set warps model=... bs=32  # four warps at 32 rows, or eight
    python benchmarks/fused_prefetch.py --set study_window model=...  # one replay of 127 steps timed from the
                                                                    # context, as the public study times its graph
    python benchmarks/fused_prefetch.py --set big_tma --verify 1 model=...  # one variant as a verified harness job:
                     # its constants set, then `python -m harness -m mode=fused model=...` in this process (its checks
                     # against fp32, its record in the store, its `fused_plan` tag naming what ran)
Prints each variant's median ms/step over the rounds, its spread, and its ratio to the set's first (prefetch: the
kernels as they were before the prefetch, four warps, none; attention: the rule's, the default) with a 95% interval
from a bootstrap over rounds that keeps each round's pair (harness ab's statistic, harness/measure/stats.py).
"""
from __future__ import annotations

import statistics
import sys

import torch

# this folder's (run as `python benchmarks/fused_prefetch.py`)
from fused_kernels import fused_model_and_prompt, warm_fused_stepper
from harness.cli.main import main as cli_main
from harness.clock import block_ms
from harness.cli.precheck import compose_single_run
from harness.kernels import fused_decode
from harness.measure.stats import paired_ratio_interval
from harness.measure.timing import calls_for

def tiles(bn: int, bk: int, warps: int):
    """tile_sizes in place of fused_decode's: every product on the GPU in BN x BK tiles on that many warps."""
    return lambda n, k: (bn, min(bk, k), warps)


# (name, extra overrides, fused_decode's module constants set for the variant: read when its step is planned and
# launched, so each captured graph keeps its own)
VARIANTS = [
    ("4 warps, no prefetch", ["fused.prefetch=false"], dict(tile_sizes=tiles(64, 128, 4))),
    ("4 warps, 8 MiB first + rolling", ["fused.prefetch=true"], dict(tile_sizes=tiles(64, 128, 4))),
    ("8 warps, no prefetch (the default)", ["fused.prefetch=false"], {}),
    ("8 warps, 4 MiB first", ["fused.prefetch=true"], dict(L2_PREFETCH_BYTES=4 << 20, ROLLING_PREFETCH=False)),
    ("8 warps, 4 MiB first + rolling", ["fused.prefetch=true"], dict(L2_PREFETCH_BYTES=4 << 20)),
    ("8 warps, 8 MiB first + rolling", ["fused.prefetch=true"], {}),
    ("8 warps, 16 MiB first + rolling", ["fused.prefetch=true"], dict(L2_PREFETCH_BYTES=16 << 20)),
    ("16 warps, no prefetch", ["fused.prefetch=false"], dict(tile_sizes=tiles(64, 128, 16))),
    ("16 warps, 8 MiB first + rolling", ["fused.prefetch=true"], dict(tile_sizes=tiles(64, 128, 16))),
]
# `--set attention`: the attention as the rule plans it (the default: folded into one kernel a layer, but three
# launches at bs=1 past one chunk where it would read under 4 MiB of K/V a layer or ask L2 for under 7% of the MLP's
# weights; fused_decode.attention_folded) against folded at any prefix and three launches at any prefix, which ask L2
# for the MLP's weights (fused.weights_ahead's budget and window) from the merge (the default), from the split-KV, or
# not at all
ATTENTION_VARIANTS = [
    ("attention as the rule plans it (the default)", [], {}),
    ("attention folded: one kernel a layer at any prefix", [], dict(FOLD_MIN_AHEAD_SHARE=0, FOLD_MIN_KV_BYTES=0)),
    ("attention unfolded, the MLP's weights asked by the merge", ["fused.fold_attention=false"], {}),
    ("unfolded, the MLP's weights asked by the split-KV", ["fused.fold_attention=false"],
     dict(UNFOLDED_AHEAD_IN="split")),
    ("unfolded, none of the MLP's weights asked", ["fused.fold_attention=false"], dict(UNFOLDED_AHEAD_IN="")),
]
# `--set unfolded_chunks`: the three launches' grid (UNFOLDED_ATTENTION_PROGRAMS, the programs their split-KV's chunks
# aim at), against the rule and the fold at any prefix. At bs=1 with eight KV heads 264 gives 64 chunks a KV head
# past 32 blocks of prefix (about 2048 slots), 256 gives 32; aims added later go last, so that an earlier day's
# `--only` names the same variants
UNFOLDED_CHUNK_VARIANTS = ATTENTION_VARIANTS[:2] + [
    (f"attention unfolded, its chunks for {n} programs", ["fused.fold_attention=false"],
     dict(UNFOLDED_ATTENTION_PROGRAMS=n)) for n in (264, 128, 64, 256)]
# `--set attention_warps`: the attention's programs on more warps or with more K/V blocks in flight (the three launches'
# split-KV where the rule unfolds, the folded kernel where it folds: each variant sets both alike)
WARPS_STAGES = [(4, 3), (8, 3), (4, 4), (8, 4), (4, 2), (8, 2)]
ATTENTION_WARPS_VARIANTS = [
    (f"the attention's programs on {warps} warps, {stages} stages{' (the default)' if not i else ''}", [],
     dict(SPLIT_KV_WARPS=warps, SPLIT_KV_STAGES=stages, FOLDED_ATTENTION_WARPS=warps, FOLDED_ATTENTION_STAGES=stages))
    for i, (warps, stages) in enumerate(WARPS_STAGES)]
# `--set merge`: how many chunks the folded attention's last program merges a load (the default: sized by the chunks
# at the longest prefix the run decodes to, fused_decode.merge_block)
MERGE_VARIANTS = [("sized by the context (the default)", [], {})] + [
    (f"{n} chunks a load", [], dict(merge_block=lambda valid, splits, n=n: min(n, splits))) for n in (1, 4, 16, 64)]
# `--set loop`: how a product's loop keeps its weight loads in flight
LOOP_VARIANTS = [
    ("the next tile in registers (the default)", [], {}),
    ("Triton's pipeliner, 3 stages", [], dict(PIPELINE_STAGES=3)),
    ("Triton's pipeliner, 4 stages", [], dict(PIPELINE_STAGES=4)),
]
# `--set chunks`: how many programs the attention's chunks aim at, folded or three launches alike (fewer: longer
# chunks, fewer queries and merges; at 8 a bs=1 step of an 8-KV-head model has one chunk a KV head, which merges
# nothing, as the public study's attention)
CHUNK_VARIANTS = [("the default (one chunk a KV head up to one_chunk_max_slots of prefix)", [], {})] + [
    (f"attention chunks for {n} programs", [], dict(ATTENTION_PROGRAMS=n, UNFOLDED_ATTENTION_PROGRAMS=n,
                                                    ONE_CHUNK_MAX_SLOTS=0, ONE_CHUNK_MAX_SLOTS_NARROW=0))
    for n in (264, 128, 64, 32, 16, 8)]
# `--set padding`: the attention's padding query rows masked (the default) or repeating the last head's loads;
# `--set before`: what changed Qwen3-8B at bs=32 (eight warps, the attention folded) against the kernels before
PADDING_VARIANTS = [("padding query rows masked (the default)", [], {}),
                    ("padding query rows load the last head again", [], dict(QUERY_PADDING_MASKED=False))]
BEFORE_VARIANTS = [
    ("eight warps, attention folded (the default)", [], {}),
    ("four warps, attention folded", [], dict(tile_sizes=tiles(64, 128, 4))),
    ("eight warps, three attention launches", ["fused.fold_attention=false"], {}),
    ("four warps, three attention launches", ["fused.fold_attention=false"], dict(tile_sizes=tiles(64, 128, 4))),
]
# `--set kv`: the folded attention's chunk of K/V asked of L2 before its queries are computed, and the last chunk's
# merge of the group's heads in straight-line code (all their loads before any store)
KV_VARIANTS = [
    ("as committed", [], {}),
    ("K/V asked of L2 first", [], dict(KV_PREFETCH=True)),
    ("heads merged together", [], dict(MERGE_HEADS_TOGETHER=True)),
    ("both", [], dict(KV_PREFETCH=True, MERGE_HEADS_TOGETHER=True)),
    ("both, chunks for 64 programs", [], dict(KV_PREFETCH=True, MERGE_HEADS_TOGETHER=True, ATTENTION_PROGRAMS=64)),
]
# `--set first`: the folded attention's chunk that holds the new token reading its K/V back from the cache after its
# append and a barrier (the default), or starting from them as computed
FIRST_VARIANTS = [("new K/V read back after the append (the default)", [], {}),
                  ("new K/V from registers", [], dict(NEW_KV_IN_REGISTERS=True))]
# `--set wait`: what the folded attention reads before its PDL wait: nothing (the default), the position and its RoPE
# rows, or those and the chunk's first block of past K/V (the new token's then from registers)
WAIT_VARIANTS = [("nothing before the wait (the default)", [], {}),
                 ("position and RoPE rows before the wait", [], dict(POSITION_BEFORE_WAIT=True)),
                 ("and the chunk's first K/V block", [], dict(PAST_KV_BEFORE_WAIT=True))]
# `--set launch`: where each kernel lets the next one launch (PDL's launch_dependents): as launch_point's rule says and
# the attention at its start (the default; rows 1-11 were first run when every product launched after its loop, the
# last row now), or some kinds of product at their own wait or after their stores; the attention after its wait.
# "slices" are the kinds fused.slices takes at bs=1 in a model 2048 wide at most (gate/up, down, lm_head), "tiles"
# QKV and O
AT_WAIT, AFTER_LOOP, AT_END = fused_decode.AT_WAIT, fused_decode.AFTER_LOOP, fused_decode.AT_END
SLICES, TILES, EVERY = fused_decode.SLICED_KINDS, ("qkv", "o"), fused_decode.PRODUCT_KINDS


def launch_at(kinds, at) -> dict:
    return dict(LAUNCH_AT=dict.fromkeys(kinds, at))


LAUNCH_VARIANTS = [("the default (launch_point: a gate/up sliced on 8 warps after its stores, the rest after their "
                    "loop; the attention at its start)", [], {}),
                   ("every product at its wait", [], launch_at(EVERY, AT_WAIT)),
                   ("slices at their wait", [], launch_at(SLICES, AT_WAIT)),
                   ("tiles at their wait", [], launch_at(TILES, AT_WAIT)),
                   ("every product at its wait, attention after its wait", [],
                    dict(launch_at(EVERY, AT_WAIT), ATTENTION_LAUNCH_AT_START=False)),
                   ("attention after its wait", [], dict(ATTENTION_LAUNCH_AT_START=False)),
                   ("every product after its stores", [], launch_at(EVERY, AT_END)),
                   ("slices after their stores", [], launch_at(SLICES, AT_END)),
                   ("tiles after their stores", [], launch_at(TILES, AT_END))] + [
    (f"{kind} after its stores", [], launch_at([kind], AT_END)) for kind in SLICES] + [
    ("every product after its loop (before launch_point's rule)", [], launch_at(EVERY, AFTER_LOOP))]
BEFORE_RULES = dict(SLICE_VALUES_A_THREAD_NARROW=64)
SLICES_VARIANTS = [("64 values a thread (the default before the slice rules)", [], BEFORE_RULES),
                   ("32 values a thread", [],
                    dict(BEFORE_RULES, SLICE_VALUES_A_THREAD=32, SLICE_VALUES_A_THREAD_NARROW=32)),
                   ("128 values a thread", [],
                    dict(BEFORE_RULES, SLICE_VALUES_A_THREAD=128, SLICE_VALUES_A_THREAD_NARROW=128)),
                   ("gate/up as tiles", [], dict(BEFORE_RULES, SLICED_KINDS=("down", "lm_head"))),
                   ("gate/up as tiles, the next kernel after its stores", [],
                    dict(BEFORE_RULES, SLICED_KINDS=("down", "lm_head"), LAUNCH_AT={"gate_up": AT_END}))]
# `--set rules`: the slice rule (128 values a thread in a model 1024 wide) against the kernels before it (lease Y3 ran
# it with a second rule, a gate/up 2048 wide as tiles, taken out after: 5-6% slower on Qwen3-1.7B)
RULES_VARIANTS = [("the slice rule", [], {}), ("before it", [], BEFORE_RULES)]
# `--set products`: how many programs a product's K splits aim at, and its tile (default 64 x 128 on 8 warps), each
# against the split rule lease G1 ran it on (4 programs an SM, no more splits before blocks narrow), pinned here so
# that the set measures what its labels say under today's defaults too
BEFORE_SPLITS = dict(PROGRAMS_PER_SM=4, WIDE_MAX_SPLITS=8)
PRODUCT_VARIANTS = [
    ("4 programs an SM (G1's default)", [], BEFORE_SPLITS),
    ("2 programs an SM", [], {**BEFORE_SPLITS, "PROGRAMS_PER_SM": 2}),
    ("8 programs an SM, up to 16 splits", [], dict(PROGRAMS_PER_SM=8, MAX_SPLITS=16, WIDE_MAX_SPLITS=16)),
    ("64 x 256 tiles on 8 warps", [], dict(BEFORE_SPLITS, tile_sizes=tiles(64, 256, 8))),
    ("128 x 128 tiles on 8 warps", [], dict(BEFORE_SPLITS, tile_sizes=tiles(128, 128, 8))),
]
# `--set splits`: how many ways the products split K (the committed rule against this morning's and one with fewer),
# and the attention's K/V asked of L2 early or its chunks sized by the capacity
SPLIT_VARIANTS = [
    ("as committed: 2 programs an SM, 16 splits before blocks narrow", [], {}),
    ("before: 4 programs an SM, 8 splits before blocks narrow", [], BEFORE_SPLITS),
    ("1 program an SM", [], dict(PROGRAMS_PER_SM=1)),
    ("K/V asked of L2 first", [], dict(KV_PREFETCH=True)),
    ("attention chunks for the cache's capacity", [], dict(CHUNKS_BY_PREFIX=False)),  # `--only 0,4`: that pair
]  # (lease G2 ran the last the other way round, when the capacity's chunks were the default: "for the longest prefix")
# `--set gateup`: an 8B model's gate/up (hidden 4096, the only product 2 x 12288 or 2 x 14336 wide) in column blocks
# of 32 (twice the programs) or 128 (half), the other products as they are
def gate_up_blocks(bn: int):
    default = fused_decode.tile_sizes
    return lambda n, k: (bn, *default(n, k)[1:]) if n in (2 * 12288, 2 * 14336) else default(n, k)


GATE_UP_VARIANTS = [("64-column blocks (the default)", [], {})] + [
    (f"gate/up in {bn}-column blocks", [], dict(tile_sizes=gate_up_blocks(bn))) for bn in (32, 128)]
# `--set warps`: products on four warps from 32 batch rows, or on eight at every batch (lease G4 ran it when four
# were the rule at 32 rows in every model; now only from hidden size 4096, so the first row is eight on a 1B model)
WARP_VARIANTS = [("four warps from 32 rows in a model 4096 wide (the default)", [], {}),
                 ("four warps from 32 rows in every model", [], dict(FEWER_WARPS_FROM_HIDDEN=0)),
                 ("eight warps at every batch", [], dict(FEWER_WARPS_FROM_ROWS=1 << 30))]
# `--set queries`: the chunk's first K/V block read right after the attention's PDL wait, before the group's queries
# (the new token's K/V then from registers), against the kernels as committed and against the new token's K/V from
# registers alone (what the first variant also changes)
QUERIES_VARIANTS = [("as committed", [], {}),
                    ("first K/V block before the queries", [], dict(PAST_KV_BEFORE_QUERIES=True)),
                    ("the new token's K/V from registers alone", [], dict(NEW_KV_IN_REGISTERS=True))]
# `--set tma`: the tile products' weights through registers, or through the Hopper's tensor memory accelerator into
# shared memory (fused.tma: `_matvec_tma`, Triton's pipeliner keeping that many tiles in flight) in any model (the
# rule: 4096 wide and up); the sliced products (fused.slices) stay as they are
ANY_WIDTH = dict(TMA_FROM_HIDDEN=0)
TMA_VARIANTS = [("tiles through registers", ["fused.tma=false"], {}),
                ("tiles through TMA, 3 stages", [], dict(ANY_WIDTH, TMA_STAGES_WIDE=3)),
                ("tiles through TMA, 4 stages", [], dict(ANY_WIDTH, TMA_STAGES=4, TMA_STAGES_WIDE=4)),
                ("tiles through TMA, 2 stages", [], dict(ANY_WIDTH, TMA_STAGES=2)),
                ("gate/up alone through TMA, 3 stages", [], dict(ANY_WIDTH, TMA_KINDS=("gate_up",),
                                                                 TMA_STAGES_WIDE=3)),
                ("tiles through TMA, 3 stages, first tiles asked of L2 before the wait", ["fused.prefetch=true"],
                 dict(ANY_WIDTH, TMA_STAGES_WIDE=3)),
                # (the second round, on the 8B models): O and down, 512 programs of 61 KB of shared memory at three
                # stages (1.3 waves), on two; or on registers; or split half as many ways
                ("TMA, O and down on 2 stages", [], dict(ANY_WIDTH, TMA_STAGES_OF={"o": 2, "down": 2},
                                                         TMA_STAGES_WIDE=3)),
                ("TMA for QKV, gate/up and lm_head; O and down through registers", [],
                 dict(ANY_WIDTH, TMA_KINDS=("qkv", "gate_up", "lm_head"), TMA_STAGES_WIDE=3)),
                ("TMA, 3 stages, one program an SM for the splits", [],
                 dict(ANY_WIDTH, PROGRAMS_PER_SM=1, TMA_STAGES_WIDE=3)),
                # (the third): two stages where the programs pass one wave at three an SM, lm_head (many waves)
                # too, or on three (the rule as committed after it)
                ("3 stages, 2 past one wave of 3 an SM", [], dict(TMA_WIDE_PROGRAMS_PER_SM=1 << 20)),
                ("the rule: 2 stages where that brings the programs into one wave, else 3", [], {})]
# `--set width`: a model between the rules' widths as they were, slicing up to 2048 wide and streaming tiles through
# TMA from 4096 (Qwen3-4B, 2560 wide, then tiled every product through registers): its tiles through TMA, its bs=1
# products sliced, or both (in Qwen3-1.7B, 2048 wide and sliced already at bs=1, the second and fourth put QKV and O
# through TMA). Measured, TMA from 2560 became the rule (docs/benchmarks.md, "a model between the rules' widths")
WIDTH_VARIANTS = [("TMA from 4096 wide (the rule it was measured against)", [], dict(TMA_FROM_HIDDEN=4096)),
                  ("tiles through TMA from 2048 wide", [], dict(TMA_FROM_HIDDEN=2048)),
                  ("sliced up to 2560 wide (bs=1)", [], dict(SLICE_MAX_HIDDEN=2560)),
                  ("sliced up to 2560 wide, the other tiles through TMA", [],
                   dict(SLICE_MAX_HIDDEN=2560, TMA_FROM_HIDDEN=2048))]
# `--set study`: the public study's projections (docs/benchmarks.md, "the study's recipe"): every product as whole rows
# of the weight read into registers before the PDL wait (fused.slices for QKV and O too), in blocks of two rows on four
# warps (a thread holding 2K/128 values: 32 of a 2048-wide K, 16 of a 1024-wide), and each kernel letting the next
# launch at its start, so that a chain of launched kernels holds the next products' weights while one runs
AT_START = fused_decode.AT_START
EVERY_SLICED = dict(SLICED_KINDS=EVERY, TMA_LARGE_FROM_HIDDEN=1 << 30)  # (as measured: before the large products' TMA)
STUDY_BLOCKS = dict(EVERY_SLICED, SLICE_VALUES_A_THREAD=32, SLICE_VALUES_A_THREAD_NARROW=16,
                    SLICE_MORE_WARPS_FROM=1 << 30)
STUDY_VARIANTS = [("the default (the rules)", [], {}),
                  ("every product sliced (the rules' blocks), launched as the rule", [], EVERY_SLICED),
                  ("every product sliced, each launching the next at its start", [],
                   dict(EVERY_SLICED, **launch_at(EVERY, AT_START))),
                  ("the study's blocks: every product sliced, 2 rows on 4 warps", [], STUDY_BLOCKS),
                  ("the study's blocks, each launching the next at its start", [],
                   dict(STUDY_BLOCKS, **launch_at(EVERY, AT_START))),
                  ("the rules' kinds, the slices launching the next at their start", [], launch_at(SLICES, AT_START))]
# `--set big_tma`: the small models' large products (gate/up, down, lm_head: SLICES, the rules' slices) as tiles whose
# weights Hopper's tensor memory accelerator streams into shared memory, as the 8B models' are (fused.tma), where the
# rules slice them. Not measured before: the rules' TMA starts 2560 wide, and the small models' TMA variants measured so
# far ("tma", "width") streamed only their tile products, QKV and O, a tile or two a program, where it lost. A sliced
# program loads its weights once, before its wait, and drains; a TMA tile program streams its K through STAGES tiles
# in flight, from its wait on (benchmarks/fused_occupancy.py --set big_tma says what each plan holds an SM)


def through_tma(kinds, **more) -> dict:
    """The constants that run `kinds` (of SLICES) as tiles through TMA in a model of any width, the rest as the rules
    plan them (QKV and O as tiles through registers)."""
    return dict(SLICED_KINDS=tuple(kind for kind in SLICES if kind not in kinds), TMA_KINDS=tuple(kinds),
                TMA_FROM_HIDDEN=0, **more)


NO_LARGE_TMA = dict(TMA_LARGE_FROM_HIDDEN=1 << 30)  # the rules before the large products' TMA (sliced at bs=1)
BIG_TMA_VARIANTS = [("the rules before: gate/up, down and lm_head sliced at bs=1", [], NO_LARGE_TMA),
                    ("gate/up, down and lm_head as tiles through TMA (the stage rule)", [], through_tma(SLICES)),
                    ("gate/up as tiles through TMA", [], through_tma(["gate_up"])),
                    ("down as tiles through TMA", [], through_tma(["down"])),
                    ("lm_head as tiles through TMA", [], through_tma(["lm_head"])),
                    ("gate/up, down and lm_head through TMA, 4 stages", [],
                     through_tma(SLICES, TMA_STAGES_OF=dict.fromkeys(SLICES, 4))),
                    ("gate/up, down and lm_head through TMA, gate/up in 32-column tiles (twice the programs)", [],
                     through_tma(SLICES, GATE_UP_TILE_COLUMNS=32)),
                    ("gate/up, down and lm_head as tiles through registers", [], dict(NO_LARGE_TMA, SLICED_KINDS=())),
                    # measured, the rule (fused_decode.TMA_LARGE_FROM_HIDDEN): from 2048 wide, on TMA_LARGE_STAGES
                    ("the rules (from 2048 wide, gate/up, down and lm_head through TMA, 4 stages)", [], {})]
# `--set large_stages`: the large products' tiles in flight a program through TMA in a model 2048 wide (the rule:
# TMA_LARGE_STAGES), against the rules before (sliced at bs=1); each stage is a 64 x 128 tile, 16 KB of shared memory
# (Llama-3.2-1B's gate/up: 69 KB at three stages, three programs an SM; 93 KB at four, two; fused_occupancy.py)
LARGE_STAGES_VARIANTS = [("the rules (4 stages)", [], {})] + [
    (f"{n} stages", [], dict(TMA_LARGE_STAGES=n)) for n in (3, 5, 6, 8)] + [
    ("the rules before: gate/up, down and lm_head sliced at bs=1", [], NO_LARGE_TMA),
    # (first committed at one row; paired on GPU-4e4bab28 as the other way round, at every batch size against it)
    ("the rule at one batch row (from two rows, the tiles through registers)", [], dict(TMA_LARGE_MAX_ROWS=1))]
# `--set tma_first`: what a TMA program copies before its PDL wait. The pipeliner's copies start after the wait (with
# the input's, which the kernel before writes), where `_matvec` loads its first tile into registers before it; and a
# persistent chain measured its barriers 18% cheaper than PDL's launches only with the next rows loaded before each
# (benchmarks/persistent_chain.py, GPU-3354d55b). So: the split's first tile copied before the wait
# (TMA_FIRST_BEFORE_WAIT), its first tiles asked of L2 there (fused.prefetch), both; QKV and O through TMA too; and
# the large products letting the next kernel launch at their wait, its first tile then in flight before its own.
# Measured (GPU-1473ee24, 2026-12-05): every variant slower, by 1.3-14%
FIRST_BEFORE_WAIT = dict(TMA_FIRST_BEFORE_WAIT=True)
EVERY_THROUGH_TMA = dict(TMA_LARGE_KINDS=EVERY)
TMA_FIRST_VARIANTS = [("the rules", [], {}),
                      ("the first tile copied before the PDL wait", [], FIRST_BEFORE_WAIT),
                      ("the first tiles asked of L2 before the wait", ["fused.prefetch=true"], {}),
                      ("the first tile copied and the next asked of L2 before the wait", ["fused.prefetch=true"],
                       FIRST_BEFORE_WAIT),
                      ("QKV and O through TMA too (4 stages)", [], EVERY_THROUGH_TMA),
                      ("QKV and O through TMA too, the first tile before the wait", [],
                       dict(EVERY_THROUGH_TMA, **FIRST_BEFORE_WAIT)),
                      ("the first tile before the wait, the large products launching the next at their wait", [],
                       dict(FIRST_BEFORE_WAIT, **launch_at(fused_decode.TMA_LARGE_KINDS, AT_WAIT)))]
# `--set large_tiles`: the large products' tiles through TMA (a model 2048 wide: gate/up, down, lm_head, each 3 to 60
# times as wide as deep or deep as wide; QKV and O under 3) in other shapes, or their K split for fewer or more programs
# an SM. Profiled under the rule (GPU-1473ee24, PDL off), gate/up read Llama-3.2-1B's weights at 3.48 TB/s and down at
# 3.31, where lm_head reached 4.11 and Qwen3-8B's gate/up 4.03: a 256-column K tile halves a program's loop turns (its
# waits and MMA issues), a 64-column one doubles them on twice the stages, the same bytes in flight (three stages of
# 64 x 256 hold 139 KB of shared memory, one program an SM, two waves: benchmarks/fused_occupancy.py, not paired).
# Measured (GPU-5928ca20, 2026-12-05): the other shapes 9-14% slower; one program an SM, which changed only QKV's
# splits, 1.6% faster on Qwen3-1.7B and 0.1% on Llama-3.2-1B (the rule since: qkv_splits)
def large_tiles(bn: int, bk: int):
    default = fused_decode.tile_sizes
    return lambda n, k: (bn, min(bk, k), 8) if max(n, k) >= 3 * min(n, k) else default(n, k)


LARGE_TILES_VARIANTS = [("the rules (64 x 128 tiles, 4 stages)", [], {}),
                        ("64 x 256 tiles, 2 stages", [], dict(tile_sizes=large_tiles(64, 256), TMA_LARGE_STAGES=2)),
                        ("64 x 64 tiles, 8 stages", [], dict(tile_sizes=large_tiles(64, 64), TMA_LARGE_STAGES=8)),
                        # (as measured, before QKV's own rule: qkv_splits)
                        ("K split for 1 program an SM", [], dict(PROGRAMS_PER_SM=1, QKV_ONE_AN_SM_MAX_ROWS=0)),
                        ("K split for 4 programs an SM, up to 16 ways", [],
                         dict(PROGRAMS_PER_SM=4, MAX_SPLITS=16, QKV_ONE_AN_SM_MAX_ROWS=0))]
# `--set qkv_splits`: QKV split for one program an SM in a model 2048 wide (the rule at bs=1, QKV_ONE_AN_SM_MAX_ROWS;
# `large_tiles`' "K split for 1 program an SM" changed only QKV there, 1.6% off Qwen3-1.7B's step), against the rules
# before (two an SM), and at every batch size
QKV_SPLITS_VARIANTS = [("the rules (QKV for 1 program an SM at bs=1)", [], {}),
                       ("the rules before (QKV for 2 programs an SM)", [], dict(QKV_ONE_AN_SM_MAX_ROWS=0)),
                       ("QKV for 1 program an SM at every batch size", [], dict(QKV_ONE_AN_SM_MAX_ROWS=1 << 30))]
# `--set copies_first`: the large products (a model 2048 wide, one row) as harness/kernels/tma_before_wait.py's Gluon
# kernel, every program's stages copied before its PDL wait (the rule then, on 3 stages, O letting gate/up launch at
# O's wait: TMA_COPIES_BEFORE_WAIT, O_AT_WAIT_BEFORE_COPIES_FIRST; on 2 since, with QKV's copies first: qkv_o_first),
# against `_matvec_tma`, which issues them after it (tma_first's copy before the wait was a copy and a wait at once).
# Profiled with PDL on an H100 (GPU-ad63b242, 2026-12-06), `_matvec_tma`'s gate/up started only 0.36 us before O
# ended: O lets it launch after O's loop. Hence also O letting gate/up launch at O's wait or start. Measured
# (GPU-fc0d0088, 2026-12-06): 3 stages 2.5% and 2.2% faster (Llama-3.2-1B, Qwen3-1.7B), 4 stages 0.8% and 0.6%, O at
# its wait another 0.5-0.8% (the rule since: O_AT_WAIT_BEFORE_COPIES_FIRST); the rules before with O at its start 0.5%
# slower
BEFORE_COPIES_FIRST = dict(TMA_COPIES_BEFORE_WAIT=False)
FOUR = dict(TMA_COPIES_FIRST_STAGES=4)
O_AT_WAIT, O_AT_START = launch_at(["o"], AT_WAIT), launch_at(["o"], fused_decode.AT_START)
O_AFTER_LOOP = launch_at(["o"], AFTER_LOOP)
COPIES_FIRST_VARIANTS = [("the rules before (the copies after the wait)", [], BEFORE_COPIES_FIRST),
                         ("the copies before the PDL wait (Gluon), 4 stages", [], dict(FOUR, **O_AFTER_LOOP)),
                         ("the copies before the PDL wait (Gluon), 4 stages, O launching gate/up at its wait", [],
                          dict(FOUR, **O_AT_WAIT)),
                         ("the copies before the PDL wait (Gluon), 4 stages, O launching gate/up at its start", [],
                          dict(FOUR, **O_AT_START)),
                         ("the rules before, O launching gate/up at its start", [],
                          dict(BEFORE_COPIES_FIRST, **O_AT_START)),
                         ("the copies before the PDL wait (Gluon), 3 stages", [], O_AFTER_LOOP),
                         ("the copies before the PDL wait (Gluon), 3 stages, O launching gate/up at its wait (the "
                          "rule then)", [], {}),
                         ("the copies before the PDL wait (Gluon), 3 stages, O launching gate/up at its start", [],
                          O_AT_START)]


# `--set qkv_o_first`: QKV and O (Llama-3.2-1B's and Qwen3-1.7B's tiles through registers, a tile of each program's
# split loaded before the PDL wait) as the same Gluon kernel, all their split's tiles copied before the wait
# (TMA_COPIES_FIRST_SMALL_KINDS): on the H100's PDL path QKV ran at 1.7 TB/s where gate/up ran at 2.6. And the kernel
# summing each tile as it reads it (TMA_COPIES_FIRST_SUM_EACH_TILE), twice its programs an SM. Measured on an H100
# (GPU-4cc38ddd, 2026-12-06): QKV on 2 stages with the large products on 2 the fastest, 2.8% on both models (the rule
# since); O first, and each tile summed, slower
QKV_O = ("qkv", "o")
# the rules before the copies-first rule reached every width at one row (2048 wide alone, on 8 warps)
BEFORE_REACH = dict(COPIES_FIRST_FROM_HIDDEN=1 << 30, TMA_COPIES_FIRST_WARPS=0)
# the rules before QKV's copies came first: QKV through registers, the large products' copies on 3 stages
BEFORE_QKV_FIRST = dict(BEFORE_REACH, TMA_COPIES_FIRST_SMALL_KINDS=(), TMA_COPIES_FIRST_STAGES=3,
                        TMA_COPIES_FIRST_SMALL_STAGES=4)
QKV_O_FIRST_VARIANTS = [("the rules before (QKV and O through registers)", [], {}),
                        ("QKV copied before the PDL wait (Gluon)", [], dict(TMA_COPIES_FIRST_SMALL_KINDS=("qkv",))),
                        ("O copied before the PDL wait (Gluon)", [], dict(TMA_COPIES_FIRST_SMALL_KINDS=("o",))),
                        ("QKV and O copied before the PDL wait (Gluon)", [], dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O)),
                        ("QKV and O copied before the PDL wait, QKV for 2 programs an SM", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, QKV_ONE_AN_SM_MAX_ROWS=0)),
                        ("QKV and O copied before the PDL wait, 2 stages", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, TMA_COPIES_FIRST_SMALL_STAGES=2)),
                        ("the rules before, each tile summed as it is read (64 registers, not 92)", [],
                         dict(TMA_COPIES_FIRST_SUM_EACH_TILE=True)),
                        ("QKV and O copied before the PDL wait, each tile summed as it is read", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, TMA_COPIES_FIRST_SUM_EACH_TILE=True)),
                        ("QKV copied before the PDL wait, 2 stages", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=("qkv",), TMA_COPIES_FIRST_SMALL_STAGES=2)),
                        ("QKV and O copied before the PDL wait, 3 stages", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, TMA_COPIES_FIRST_SMALL_STAGES=3)),
                        ("QKV and O copied before the PDL wait, 1 stage", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, TMA_COPIES_FIRST_SMALL_STAGES=1)),
                        ("QKV and O copied before the PDL wait, 2 stages, the large products on 2 stages too", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, TMA_COPIES_FIRST_SMALL_STAGES=2,
                              TMA_COPIES_FIRST_STAGES=2)),
                        ("the large products on 2 stages (QKV and O through registers)", [],
                         dict(TMA_COPIES_FIRST_STAGES=2)),
                        ("QKV copied before the PDL wait, 2 stages, the large products on 2 stages too", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=("qkv",), TMA_COPIES_FIRST_SMALL_STAGES=2,
                              TMA_COPIES_FIRST_STAGES=2)),
                        ("QKV and O copied before the PDL wait, 2 stages, the large products on 1 stage", [],
                         dict(TMA_COPIES_FIRST_SMALL_KINDS=QKV_O, TMA_COPIES_FIRST_SMALL_STAGES=2,
                              TMA_COPIES_FIRST_STAGES=1))]


# `--set copies_first_reach`: the copies-first rule (the large products and QKV as the Gluon kernel on 2 stages, a
# model 2048 wide at one row) where it does not reach: a model 1024 wide (Qwen3-0.6B, whose large products the rules
# slice: gate/up in 96 programs of 64 columns or 192 of 32), and the 8B models (4096 wide, every product `_matvec_tma`
# on 2-3 stages, copied after the wait), O then the kernel too, as it has no other TMA path there; and in the models it
# reaches, the kernel on 4 warps (not 8), and O letting gate/up launch after its loop (not at its wait) now that QKV's
# copies come first. Measured on an H100 (GPU-2a0299d8, 2026-12-06): Qwen3-0.6B 7.4% faster at context 1024 from 1024
# wide in 32-column blocks on 4 warps, Qwen3-8B 3.2% at every width on 4 warps (on 8, 1.3% slower), 4 warps within
# 0.5% where the rule reached, O after its loop 2% slower. The last variant is the rule since, which plans each of
# those models as its fastest variant did (tests/test_fused.py); it did not run as such
FROM_1024 = dict(TMA_LARGE_FROM_HIDDEN=1024)
EVERY_WIDTH = dict(TMA_FROM_HIDDEN=1 << 30, TMA_COPIES_FIRST_SMALL_KINDS=QKV_O)
NARROW_GATE_UP = dict(FROM_1024, GATE_UP_TILE_COLUMNS=32)
NARROW_GATE_UP_QKV_TWO = dict(NARROW_GATE_UP, QKV_ONE_AN_SM_MAX_ROWS=0)
REACH_VARIANTS = [("the rules before", [], {}),
                  ("from 1024 wide: the large products and QKV copied before the PDL wait", [], FROM_1024),
                  ("from 1024 wide, gate/up in 32-column blocks", [], NARROW_GATE_UP),
                  ("from 1024 wide, gate/up in 32-column blocks, every split's tiles copied before the wait "
                   "(lm_head's 2)", [], dict(NARROW_GATE_UP, TMA_COPIES_FIRST_STAGES=8,
                                            TMA_STAGES_OF={"lm_head": 2, "down": 3})),  # (down's 3 a split)
                  ("from 1024 wide, QKV for 2 programs an SM", [], dict(FROM_1024, QKV_ONE_AN_SM_MAX_ROWS=0)),
                  ("from 1024 wide, the large products alone copied before the PDL wait", [],
                   dict(FROM_1024, TMA_COPIES_FIRST_SMALL_KINDS=())),
                  ("from 1024 wide, QKV alone copied before the PDL wait", [], dict(FROM_1024, TMA_LARGE_KINDS=())),
                  ("the copies-first kernel on 4 warps", [], dict(TMA_COPIES_FIRST_WARPS=4)),
                  ("O letting gate/up launch after its loop", [], dict(O_AT_WAIT_BEFORE_COPIES_FIRST=False)),
                  ("at every width: each product copied before the PDL wait, O too", [], EVERY_WIDTH),
                  ("at every width, QKV for 2 programs an SM", [], dict(EVERY_WIDTH, QKV_ONE_AN_SM_MAX_ROWS=0)),
                  ("at every width, on 4 warps", [], dict(EVERY_WIDTH, TMA_COPIES_FIRST_WARPS=4)),
                  ("at every width, on 3 stages", [],
                   dict(EVERY_WIDTH, TMA_COPIES_FIRST_STAGES=3, TMA_COPIES_FIRST_SMALL_STAGES=3)),
                  ("from 1024 wide, gate/up in 32-column blocks, QKV for 2 programs an SM", [], NARROW_GATE_UP_QKV_TWO),
                  ("from 1024 wide, gate/up in 32-column blocks, on 4 warps", [],
                   dict(NARROW_GATE_UP, TMA_COPIES_FIRST_WARPS=4)),
                  ("from 1024 wide, gate/up in 32-column blocks, QKV for 2 programs an SM, on 4 warps", [],
                   dict(NARROW_GATE_UP_QKV_TWO, TMA_COPIES_FIRST_WARPS=4)),
                  ("from 1024 wide, gate/up in 32-column blocks, QKV for 2 programs an SM, 3 stages", [],
                   dict(NARROW_GATE_UP_QKV_TWO, TMA_COPIES_FIRST_STAGES=3)),
                  ("the copies-first rule at every width (the rule since)", [],
                   dict(COPIES_FIRST_FROM_HIDDEN=1024, TMA_COPIES_FIRST_WARPS=4))]

# `--set study_window` (no graph_steps in the overrides: each variant names its own): the public study's scope, one
# replay of all 127 steps with the argmax inside, timed from the context (positions 32-159 at its workload) as the
# study times it, where a harness job's window starts after a whole warm-up replay (159-286). Its first variant is one
# step a replay (the argmax not in the graph, not fed); the next two differ only in the attention's plan, sized for the
# job's longest prefix (286 slots): 8 chunks a KV head in three launches (one chunk up to 256 slots, the rule before),
# or one chunk a KV head (the rule since, one_chunk_max_slots; measured first as ONE_CHUNK_MAX_SLOTS=512, the same plan
# at this workload), the plan the study's window alone would take under either
STUDY_WINDOW_VARIANTS = [("one step a replay, the argmax outside the graph", ["graph_steps=1"], {}),
                         ("one replay of 127 steps, the argmax inside, 8 chunks a KV head in three launches",
                          ["graph_steps=127"], dict(ONE_CHUNK_MAX_SLOTS_NARROW=256)),
                         ("one replay of 127 steps, the argmax inside, one chunk a KV head", ["graph_steps=127"], {})]


def as_measured(variants: list, before: dict = BEFORE_COPIES_FIRST) -> list:
    """A set measured before a rule (by default the copies-first rule), each variant as it ran then (`_matvec_tma` at
    one row too): `before`'s constants under each variant's own."""
    return [(name, extra, {**before, **constants}) for name, extra, constants in variants]


SETS = {"prefetch": VARIANTS, "attention": ATTENTION_VARIANTS, "unfolded_chunks": UNFOLDED_CHUNK_VARIANTS,
        "merge": MERGE_VARIANTS, "loop": LOOP_VARIANTS,
        "chunks": CHUNK_VARIANTS, "padding": PADDING_VARIANTS, "before": BEFORE_VARIANTS,
        "kv": KV_VARIANTS, "first": FIRST_VARIANTS, "products": PRODUCT_VARIANTS,
        "splits": SPLIT_VARIANTS, "gateup": GATE_UP_VARIANTS,
        "warps": WARP_VARIANTS, "wait": WAIT_VARIANTS, "launch": LAUNCH_VARIANTS,
        "slices": SLICES_VARIANTS, "queries": QUERIES_VARIANTS, "rules": RULES_VARIANTS, "tma": TMA_VARIANTS,
        "width": WIDTH_VARIANTS, "study": STUDY_VARIANTS, "big_tma": as_measured(BIG_TMA_VARIANTS),
        "large_stages": as_measured(LARGE_STAGES_VARIANTS), "tma_first": as_measured(TMA_FIRST_VARIANTS),
        "large_tiles": as_measured(LARGE_TILES_VARIANTS), "qkv_splits": as_measured(QKV_SPLITS_VARIANTS),
        "attention_warps": ATTENTION_WARPS_VARIANTS,
        "copies_first": as_measured(COPIES_FIRST_VARIANTS, BEFORE_QKV_FIRST),
        "qkv_o_first": as_measured(QKV_O_FIRST_VARIANTS, BEFORE_QKV_FIRST),
        "copies_first_reach": as_measured(REACH_VARIANTS, BEFORE_REACH), "study_window": STUDY_WINDOW_VARIANTS}
# The sets of the designs taken out of the kernels' code, measured slower (docs/benchmarks.md, "the designs taken out"),
# and the commit that still holds each, where it runs as it ran
TAKEN_OUT = dict.fromkeys(("into_o", "into_qkv", "mlp", "persistent", "waits"), "f561a71")
STEPS, ROUNDS = 127, 12
DEFAULTS = {name: getattr(fused_decode, name) for name in (
    "L2_PREFETCH_BYTES", "ROLLING_PREFETCH", "tile_sizes", "merge_block", "PIPELINE_STAGES", "ATTENTION_PROGRAMS",
    "QUERY_PADDING_MASKED", "KV_PREFETCH", "NEW_KV_IN_REGISTERS", "MERGE_HEADS_TOGETHER", "PROGRAMS_PER_SM",
    "MAX_SPLITS", "WIDE_MAX_SPLITS", "CHUNKS_BY_PREFIX", "FEWER_WARPS_FROM_ROWS", "FEWER_WARPS_FROM_HIDDEN",
    "POSITION_BEFORE_WAIT", "PAST_KV_BEFORE_WAIT", "ONE_CHUNK_MAX_SLOTS", "ONE_CHUNK_MAX_SLOTS_NARROW", "LAUNCH_AT",
    "ATTENTION_LAUNCH_AT_START",
    "SLICE_VALUES_A_THREAD", "SLICED_KINDS", "PAST_KV_BEFORE_QUERIES", "SLICE_VALUES_A_THREAD_NARROW", "TMA_KINDS",
    "TMA_STAGES", "TMA_FROM_HIDDEN", "TMA_STAGES_OF", "TMA_STAGES_WIDE", "TMA_WIDE_PROGRAMS_PER_SM",
    "SLICE_MAX_HIDDEN", "SLICE_MORE_WARPS_FROM", "GATE_UP_TILE_COLUMNS", "TMA_LARGE_FROM_HIDDEN", "TMA_LARGE_STAGES",
    "TMA_LARGE_MAX_ROWS", "TMA_LARGE_KINDS", "TMA_FIRST_BEFORE_WAIT", "QKV_ONE_AN_SM_MAX_ROWS", "FOLD_MIN_AHEAD_SHARE",
    "FOLD_MIN_KV_BYTES", "UNFOLDED_AHEAD_IN",
    "UNFOLDED_ATTENTION_PROGRAMS", "SPLIT_KV_WARPS", "SPLIT_KV_STAGES", "FOLDED_ATTENTION_WARPS",
    "FOLDED_ATTENTION_STAGES", "TMA_COPIES_BEFORE_WAIT", "TMA_COPIES_FIRST_STAGES", "O_AT_WAIT_BEFORE_COPIES_FIRST",
    "TMA_COPIES_FIRST_SMALL_KINDS", "TMA_COPIES_FIRST_SMALL_STAGES", "TMA_COPIES_FIRST_SUM_EACH_TILE",
    "TMA_COPIES_FIRST_WARPS", "COPIES_FIRST_FROM_HIDDEN", "COPIES_FIRST_BELOW_HIDDEN", "COPIES_FIRST_O_FROM_HIDDEN")}


def set_constants(constants: dict) -> None:
    """fused_decode's module constants as a variant has them: its own, and every other at its default."""
    for name, value in {**DEFAULTS, **constants}.items():
        setattr(fused_decode, name, value)


def build(model, prompt, overrides: list[str], extra: list[str], constants: dict):
    """A captured fused stepper planned and launched with the variant's module constants (the others at their
    defaults)."""
    set_constants(constants)  # before the capture: the launch arguments are fixed in the graph
    return warm_fused_stepper(model, prompt, compose_single_run(["mode=fused", *overrides, *extra]))


def step_ms(stepper) -> float:
    """ms a step over one block of STEPS steps from the prefilled context (one pair of events, no sync inside): STEPS
    replays of one step, or as few replays of a graph of several steps as make STEPS (one of 127 steps)."""
    stepper.rewind()
    return block_ms(stepper.step, calls_for(stepper, STEPS)) / stepper.tokens_per_step


def main(overrides: list[str]) -> None:
    cfg, model, prompt = fused_model_and_prompt(overrides)
    with torch.inference_mode():
        steppers = []
        for v in VARIANTS:
            try:
                steppers.append(build(model, prompt, overrides, v[1], v[2]))
            except Exception as error:  # a tile that does not build on this GPU: say so, time the rest
                print(f"{v[0]}: not built: {type(error).__name__}: {str(error)[:200]}")
                steppers.append(None)
        times: list[list[float]] = [[] for _ in VARIANTS]
        for round_ in range(ROUNDS):
            order = range(len(VARIANTS)) if round_ % 2 == 0 else reversed(range(len(VARIANTS)))
            for i in order:
                if steppers[i] is not None:
                    times[i].append(step_ms(steppers[i]))
    print(f"\n{cfg.label}: {ROUNDS} rounds of {STEPS} steps a variant, alternating")
    print("| variant | tags | median ms/step | min–max | vs first (95% interval, rounds paired) |")
    print("|---|---|---:|---:|---:|")
    for (name, *_), stepper, spans in zip(VARIANTS, steppers, times):
        if stepper is None:
            continue
        print(f"| {name} | {stepper.tags['fused']} | {statistics.median(spans):.4f} | "
              f"{min(spans):.4f}–{max(spans):.4f} | {against_first(times[0], spans)} |")


def verify(overrides: list[str], variant) -> int:
    """The variant's step as a harness job, in this process so that its module constants hold: planned, captured,
    timed and checked against fp32 as any `mode=fused` run is, and recorded (a run whose checks fail ends FAILED)."""
    name, extra, constants = variant
    set_constants(constants)
    print(f"verifying: {name}", flush=True)
    return cli_main(["-m", "mode=fused", *overrides, *extra])  # Hydra's basic launcher: the job runs in this process


def against_first(first: list[float], spans: list[float]) -> str:
    """The variant's median over the first's, with the 95% interval of a bootstrap over rounds that keeps each round's
    pair together (both timed back to back in it): what harness ab reports for its arms."""
    ratio, low, high = paired_ratio_interval([[t] for t in first], [[t] for t in spans])
    return f"{ratio:.4f} ({low:.4f}–{high:.4f})"


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--set"]:
        if args[1:2] and args[1] in SETS:
            VARIANTS, args = SETS[args[1]], args[2:]
        elif args[1:2] and args[1] in TAKEN_OUT:
            commit = TAKEN_OUT[args[1]]
            sys.exit(f"--set {args[1]}: its design was taken out of the code; it runs at commit {commit} "
                     f"(git worktree add ../harness-{commit} {commit}); a set here is one of {', '.join(SETS)}")
        else:
            sys.exit(f"--set {' '.join(args[1:2])}: a set is one of {', '.join(SETS)}")
    if args[:1] == ["--only"]:
        VARIANTS = [VARIANTS[int(i)] for i in args[1].split(",")]
        args = args[2:]
    if args[:1] == ["--verify"]:
        sys.exit(verify(args[2:], VARIANTS[int(args[1])]))
    main(args)
