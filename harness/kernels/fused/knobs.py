"""Every tuning knob of mode=fused's kernels and their plan, in one frozen dataclass that the planner is handed.

A knob is a value a rule compares against or a kernel is launched with; a switch (`fused.*`, the run schema's
FusedConfig) turns a whole technique on or off. The defaults are the rules the harness runs; a benchmark or a test
makes a variant with `dataclasses.replace(KNOBS, name=value)` and passes it, so that two variants can live in one
process. Why each default holds, and the paired measurement behind it, is a row of docs/fused-knobs.md.

Hardware facts (an SM count, the per-SM limits) are not knobs: the plan reads them from the device
(harness/kernels/fused/plan.py, sm_count).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Knobs:
    # -- products as tiles (_matvec): the grid, K splits and warps
    tile_columns: int = 64  # output columns a tile (BN) on a GPU: the weight tile is the MMA's left operand
    tile_k: int = 128  # K columns a tile (BK) on a GPU, at most
    tile_warps: int = 8  # warps a tile's program on a GPU
    interpreted_columns: int = 256  # BN in Triton's interpreter, whose cost is per program (tests' tiny models)
    interpreted_k: int = 32  # BK in Triton's interpreter: tiny models still run over several tiles and splits
    programs_per_sm: int = 2  # programs a product's K splits aim at, per SM
    max_splits: int = 8  # K splits a product takes at most to reach programs_per_sm
    wide_max_splits: int = 16  # K splits at most where max_splits still leave SMs idle, before blocks narrow
    fewer_warps_from_rows: int = 32  # batch rows from which a wide model's products take fewer_warps
    fewer_warps_from_hidden: int = 4096  # hidden size from which that applies
    fewer_warps: int = 4  # warps a product's program takes there
    l2_prefetch_bytes: int = 8 << 20  # fused.prefetch: bytes all of a product's programs ask L2 for before their wait

    # -- fused.slices: a bs=1 product as whole rows of the weight on CUDA cores
    slice_max_rows: int = 1  # batch rows at most where the rules slice
    slice_max_hidden: int = 2048  # hidden size at most where the rules slice
    sliced_kinds: tuple[str, ...] = ("gate_up", "down", "lm_head")  # the kinds of product the rules slice
    slice_columns: int = 2048  # K columns a slice's split holds at most (K halves until it fits)
    slice_values_a_thread: int = 64  # a slice's values a thread holds
    slice_narrow_hidden: int = 1024  # hidden size at most where a thread holds slice_values_a_thread_narrow
    slice_values_a_thread_narrow: int = 128  # a slice's values a thread in such a narrow model
    slice_warps: int = 4  # warps a slice's program
    slice_more_warps_from: int = 2048  # K columns from which an unsplit slice takes eight warps

    # -- fused.tma: weight tiles through the tensor memory accelerator (_matvec_tma)
    tma_from_hidden: int = 2560  # hidden size from which every product streams its tiles through TMA
    tma_stages: int = 3  # tiles in flight a program through TMA
    tma_programs_per_sm: int = 3  # programs of tma_stages stages an SM holds
    tma_stages_wide: int = 2  # tiles in flight where that brings a product's programs into one wave
    tma_wide_programs_per_sm: int = 4  # programs of tma_stages_wide stages an SM holds
    tma_large_kinds: tuple[str, ...] = ("gate_up", "down", "lm_head")  # the large products' rule's kinds
    tma_large_from_hidden: int = 2048  # hidden size from which the large products stream through TMA
    tma_large_stages: int = 4  # tiles in flight a large product's program
    qkv_one_an_sm_max_rows: int = 1  # batch rows at most where QKV splits for one program an SM (2048-2560 wide)

    # -- copies first (copies_first.py): a bs=1 product's TMA copies started before its PDL wait
    copies_first_stages: int = 2  # tiles a large product's program copies ahead (before its wait, then in its loop)
    copies_first_small_kinds: tuple[str, ...] = ("qkv",)  # kinds besides the large ones that copy first
    copies_first_small_stages: int = 2  # tiles such a small product's program copies ahead, at most
    copies_first_warps: int = 4  # warps a copies-first program (0: the tile's)
    copies_first_from_hidden: int = 1024  # hidden size from which the copies-first rule takes a bs=1 step
    copies_first_o_from_hidden: int = 2560  # hidden size from which O copies first too

    # -- the attention: its grid, chunks, merge and launches
    attention_programs: int = 264  # programs the folded attention's chunks aim at (rows and KV heads together)
    unfolded_attention_programs: int = 128  # programs the three launches' split-KV chunks aim at
    one_chunk_max_slots: int = 256  # longest prefix (slots) that takes one chunk a (row, KV head)
    one_chunk_max_slots_narrow: int = 384  # the same at bs=1 for heads at most narrow_head_dim wide
    narrow_head_dim: int = 64  # head size at most that counts as narrow
    serial_merge_max_chunks: int = 4  # chunks a KV head up to which the merge reads one chunk a load
    max_merge_block: int = 64  # chunks a load at most past that
    folded_attention_warps: int = 4  # warps a folded attention program
    folded_attention_stages: int = 3  # K/V blocks in flight a folded attention program
    split_kv_warps: int = 4  # warps a split-KV program of the three launches
    split_kv_stages: int = 3  # K/V blocks in flight a split-KV program
    fold_min_kv_bytes: int = 4 << 20  # bs=1 past one chunk: K/V bytes a layer from which the attention stays folded
    fold_min_ahead_share: float = 0.07  # ... and the least share of the MLP's weights it must ask L2 for ahead

    # -- fused.weights_ahead: the MLP's weights asked of L2 while the attention runs
    weights_ahead_bytes: int = 6 << 20  # bytes of gate/up then down a layer's attention asks L2 for, at most
    weights_ahead_from_kv_bytes: int = 1 << 20  # K/V bytes a layer from which the attention asks (at most the above)

    # -- the greedy kernel (graph_steps > 1)
    greedy_block: int = 1024  # logits a program reads a load
    greedy_most_programs: int = 64  # programs a row at most

    # -- fused.tune: the search over each kind of product's plan
    tune_take_below: float = 0.995  # a candidate replaces the plan where its step's median ratio is below this
    tune_per_sm: tuple[int, ...] = (1, 2, 4)  # programs an SM a split product may aim at
    tune_warps: tuple[int, ...] = (4, 8)  # warps a program may take
    tune_rounds: int = 6  # pairs of blocks (AB, BA) a candidate's step is timed in against the plan's
    tune_replays: int = 16  # replays of a captured step a block


KNOBS = Knobs()  # the rules as the harness runs them
