"""The attention of a fused decode step: one launch a layer (`_attention`, the folded kernel), or three (`_rope_append`,
`_split_kv`, `_merge_ahead`), and the rules that size its grid.

The folded kernel: one program per (row, KV head, chunk of the valid prefix [0, pos]). It sums the QKV product's split
partials, applies the layer norm's 1/rms, Qwen3's q/k RMSNorm and RoPE at the cache position to its group's queries;
the chunk that holds the position appends the new K and V to the cache (then a barrier, so that the chunk's loads
see its own store); it runs attn=triton-decode's split-KV loop over its chunk (harness/kernels/triton_decode.py); and
the last chunk of a KV head to finish (an atomic count) merges them all. A query tile has GROUP_PAD rows, the MMA's
least, for a group of 2-8 heads: the padding rows load nothing. The three launches do the same in three kernels:
where the chunks are many at bs=1, their grids are sized apart (Knobs.unfolded_attention_programs).

fused.weights_ahead: while the attention's own reads leave HBM idle (a short chain of round trips at a short
context), its programs ask L2 for the first bytes of the layer's gate/up and down weights, so that the MLP's products
find them there: the folded kernel's once a program's chunk is read (asked at the wait, the requests would hold up
the chunks' own reads), the three launches' merge at its start.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels.fused.knobs import Knobs
from harness.kernels.fused.pdl import _pdl_start, _pdl_wait, _weights_to_l2
from harness.kernels.triton_decode import (BLOCK_N, chunk_of, chunk_softmax, merge_head, merge_one_head,
                                           split_kv_chunk, splits_for)


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
               MERGE_BLOCK: tl.constexpr, PDL: tl.constexpr, AHEAD: tl.constexpr = False):
    """One (row, KV head, chunk of the valid prefix [0, pos]): the group's queries from QKV's partials (1/rms, head
    norm, RoPE), the new K/V appended by the chunk that holds slot pos, attention over the chunk (_chunk), and the
    merge of the chunks by the last to finish. The O product after it may launch at once: it waits for this kernel
    at its own PDL wait. AHEAD: each program asks L2 for its share of the MLP's weights (Ahead1's, then Ahead2's)
    once its chunk's K/V are read (at once, past the valid prefix's chunks)."""
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    program = (row * KV_HEADS + kv_head) * SPLITS + split
    _pdl_start(PDL)
    _pdl_wait(PDL)
    pos = tl.load(Pos, cache_modifier=".cg")  # from L2: no line of an earlier step's position in this SM's L1
    cos, sin = _rope_row(Cos, Sin, pos + ROPE_SHIFT, D)  # ROPE_SHIFT: a test's fault
    start, end, chunks = chunk_of(pos.to(tl.int32) + 1, split, SPLITS, BLOCK_N)
    if split < chunks:  # the programs past the valid prefix's chunks have nothing to read
        acc, m_i, l_i = _chunk(Parts, Squares, cos, sin, QNorm, KNorm, Keys, Values, pos, rows, n_total, hidden, eps,
                               scale, k_row, k_head, k_slot, v_row, v_head, v_slot, row, kv_head, start, end,
                               split == chunks - 1, HEADS, KV_HEADS, GROUP_PAD, D, QKV_SPLITS, BLOCK_N, QK_NORM,
                               APPEND, IEEE)
        if AHEAD:
            _weights_to_l2(Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share, program)
        _finish(acc, m_i, l_i, Acc, M, L, Count, Out, o_row, row, kv_head, split, chunks, HEADS, KV_HEADS, GROUP_PAD,
                D, SPLITS, MERGE_BLOCK)
    elif AHEAD:
        _weights_to_l2(Ahead1, ahead1_bytes, Ahead2, ahead2_bytes, ahead_share, program)


@triton.jit
def _chunk(Parts, Squares, cos, sin, QNorm, KNorm, Keys, Values, pos, rows, n_total, hidden, eps, scale, k_row, k_head,
           k_slot, v_row, v_head, v_slot, row, kv_head, start, end, holds_pos, HEADS: tl.constexpr,
           KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, QKV_SPLITS: tl.constexpr,
           BLOCK_N: tl.constexpr, QK_NORM: tl.constexpr, APPEND: tl.constexpr, IEEE: tl.constexpr):
    """The group's queries and its partial softmax over the chunk [start, end), the new K/V appended first where the
    chunk holds slot pos (`holds_pos`), then a barrier, and every slot read, the new one from the cache."""
    inv_rms = _inv_rms(Squares, rows, row, hidden, eps, QKV_SPLITS)
    q = _group_queries(Parts, rows, n_total, row, kv_head, inv_rms, QNorm, cos, sin, eps, HEADS, KV_HEADS,
                       GROUP_PAD, D, QKV_SPLITS, QK_NORM).to(Keys.dtype.element_ty)
    if holds_pos:  # the new K/V first, seen by all the program's threads before the chunk's loads
        _append(Parts, rows, n_total, row, kv_head, inv_rms, KNorm, cos, sin, pos, eps, Keys, Values, k_row,
                k_head, k_slot, v_row, v_head, v_slot, HEADS, KV_HEADS, D, QKV_SPLITS, QK_NORM, APPEND)
        tl.debug_barrier()
    return chunk_softmax(q, Keys, Values, row, kv_head, start, end, scale, k_row, k_head, k_slot, v_row, v_head,
                         v_slot, GROUP_PAD, D, BLOCK_N, IEEE)


@triton.jit
def _group_queries(Parts, rows, n_total, row, kv_head, inv_rms, QNorm, cos, sin, eps, HEADS: tl.constexpr,
                   KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, QKV_SPLITS: tl.constexpr,
                   QK_NORM: tl.constexpr):
    """The KV head's group of queries [GROUP_PAD, D], normed and rotated, padded to the MMA's 16 rows: the padding
    rows load nothing (zero queries, never stored)."""
    group, g = HEADS // KV_HEADS, tl.arange(0, GROUP_PAD)
    heads, real = kv_head * group + g, (g < group)[:, None]
    return _rotated_heads(Parts, rows, n_total, row, heads[:, None] * D, inv_rms, QNorm, cos, sin, eps,
                          QKV_SPLITS, QK_NORM, D, real)


@triton.jit
def _finish(acc, m_i, l_i, Acc, M, L, Count, Out, o_row, row, kv_head, split, chunks, HEADS: tl.constexpr,
            KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
            MERGE_BLOCK: tl.constexpr):
    """A chunk's partial softmax to the output: normalised where it is the only chunk; else stored, counted, and
    the last chunk of the KV head to be counted merges them all (then zeroes the count for the next layer)."""
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    heads, real = kv_head * (HEADS // KV_HEADS) + g, g < HEADS // KV_HEADS
    if chunks == 1:
        _store_group(acc, l_i, Out, o_row, row, kv_head, HEADS, KV_HEADS, GROUP_PAD, D)
    else:
        at = (row * HEADS + heads) * SPLITS + split
        tl.store(Acc + at[:, None] * D + d[None, :], acc, mask=real[:, None])
        tl.store(M + at, m_i, mask=real)
        tl.store(L + at, l_i, mask=real)
        tl.debug_barrier()  # every thread's partials written before the count (released at the GPU's scope) says so
        counted = tl.atomic_add(Count + row * KV_HEADS + kv_head, 1, sem="acq_rel", scope="gpu")
        if counted == chunks - 1:  # the last: the chunks from L2 (".cg": other SMs wrote them), one head after
            for h in tl.static_range(HEADS // KV_HEADS):  # another, MERGE_BLOCK chunks a load
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
def _split_kv(Q, K, V, Pos, Acc, M, L, scale, q_row, q_head, k_row, k_head, k_slot, v_row, v_head, v_slot,
              GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
              SPLITS: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr):
    """attn=triton-decode's split-KV program, launched with PDL (the merge let launch before this program's wait)."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    split_kv_chunk(Q, K, V, Pos, Acc, M, L, scale, q_row, q_head, k_row, k_head, k_slot, v_row, v_head, v_slot, GROUP,
                   GROUP_PAD, D, BLOCK_N, SPLITS, IEEE)


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




def group_pad(heads: int, kv_heads: int) -> int:
    """The query tile's rows for a KV head's group of heads: the MMA's least (16), or the group to a power of two."""
    return max(16, triton.next_power_of_2(heads // kv_heads))


def one_chunk_max_slots(knobs: Knobs, rows: int, head_dim: int) -> int:
    """The longest prefix whose attention takes one chunk a (row, KV head), which merges nothing: the chunk's loop
    reads its few blocks one after another, where several chunks read them side by side and the last merges them (a
    store, an atomic count and a load from L2 in the chain of every layer). Narrow heads at one row reach further."""
    narrow = rows == 1 and head_dim <= knobs.narrow_head_dim
    return knobs.one_chunk_max_slots_narrow if narrow else knobs.one_chunk_max_slots


def attention_chunks(knobs: Knobs, rows: int, kv_heads: int, longest_prefix: int, programs: int,
                     head_dim: int) -> int:
    """Chunks a (row, KV head) of the attention's grid for a run whose longest prefix is `longest_prefix` slots (not
    the cache's capacity: no programs launched only to exit, and a longer prefix still computes right, in longer
    chunks): one up to one_chunk_max_slots, else as many as bring the programs to about `programs` (splits_for)."""
    if longest_prefix <= one_chunk_max_slots(knobs, rows, head_dim):
        return 1
    return splits_for(rows, kv_heads, longest_prefix, programs)


def merge_block(knobs: Knobs, valid_slots: int, splits: int) -> int:
    """Chunks the folded attention merges a load where a KV head's valid prefix is `valid_slots` long, cut as
    triton_decode.chunk_of cuts it: one at a time for a few chunks (the merge's code is then smallest, and every
    program of the kernel, merging or not, pays for its registers), else all of them in one load (one round trip
    to L2)."""
    chunk = triton.cdiv(triton.cdiv(valid_slots, splits), BLOCK_N) * BLOCK_N
    chunks = triton.cdiv(valid_slots, chunk)
    if chunks <= knobs.serial_merge_max_chunks:
        return 1
    return min(knobs.max_merge_block, triton.next_power_of_2(chunks))


def kv_within_ahead_window(knobs: Knobs, kv_bytes: int) -> bool:
    """Whether the attention's K/V at the longest prefix leave room for fused.weights_ahead's requests: enough to
    hide them behind (a chain long enough), no more than their budget (past it the attention keeps HBM busy itself)."""
    return knobs.weights_ahead_from_kv_bytes <= kv_bytes <= knobs.weights_ahead_bytes


def attention_folded(options, knobs: Knobs, rows: int, longest_prefix: int, kv_bytes: int, mlp_bytes: int,
                     head_dim: int) -> bool:
    """Whether a layer's attention is one kernel (folded) or three launches: as fused.fold_attention says, except at
    bs=1 past one chunk a KV head, where the fold pays only as the host of the MLP's weights asked ahead over a chain
    long enough to hide them: it folds only if it reads at least fold_min_kv_bytes of K/V (`kv_bytes` a layer) and
    the weights it would ask L2 for (fused.weights_ahead's budget and window, as a GPU's plan would, whether or not
    the switch is on) are at least fold_min_ahead_share of the MLP's (`mlp_bytes`)."""
    if not options.fold_attention:
        return False
    if rows > 1 or longest_prefix <= one_chunk_max_slots(knobs, rows, head_dim):
        return True
    asked = min(mlp_bytes, knobs.weights_ahead_bytes) if kv_within_ahead_window(knobs, kv_bytes) else 0
    return kv_bytes >= knobs.fold_min_kv_bytes and asked >= knobs.fold_min_ahead_share * mlp_bytes


def rotary_tables(model, positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions + 1, head_dim / 2] in fp32, from the model's own rotary embedding (its scaling
    included); each half of transformers' tables repeats the other. One more position than the cache holds: a
    test's fault reads one ahead."""
    position_ids = torch.arange(positions + 1, device=device)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1, device=device, dtype=torch.float32), position_ids)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()
