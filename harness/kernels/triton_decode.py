"""attn=triton-decode: a split-KV ("flash-decoding") attention kernel for one query token per row, in Triton.

The valid prefix [0, position] is cut into SPLITS equal chunks, one program per (row, KV head, chunk); the
query heads of a KV head's group are the rows of one tile, so each K/V block is read once for the whole
group. The chunk size is computed on the device from the position, so a captured graph adapts to the
context as it grows, and slots after the position are never read. A second kernel merges the chunks'
partial softmaxes. Imported through attention.use_triton_decode(); on a machine without an NVIDIA GPU
(tests) it runs in Triton's interpreter, chosen at the start of the process (triton_runtime.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels import TRITON_DECODE_BLOCK
from harness.kernels.triton_runtime import interpreted, quicken_the_interpreter

quicken_the_interpreter()

BLOCK_N = TRITON_DECODE_BLOCK  # slots per step of a program's loop
TARGET_PROGRAMS = 264  # about two per SM of the H200 and H100 SXM (132): the split count aims at this many programs


@triton.jit
def chunk_of(valid, split, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Chunk `split` of a valid prefix of `valid` slots cut into SPLITS chunks of whole blocks: its first slot, its
    end, and how many of the chunks hold any slot (the first ones; the others are empty)."""
    chunk = tl.cdiv(tl.cdiv(valid, SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    return start, tl.minimum(start + chunk, valid), tl.cdiv(valid, chunk)


@triton.jit
def chunk_softmax(q, K, V, row, kv_head, start, end, scale, k_row, k_head, k_slot, v_row, v_head, v_slot,
                  GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """The query heads q [GROUP_PAD, D] of one KV head over slots [start, end): the unnormalised output, the
    running max and the softmax's sum (flash-decoding's partials of one chunk)."""
    m_i, l_i, acc = empty_softmax(GROUP_PAD, D)
    return softmax_over(q, K, V, row, kv_head, start, end, scale, k_row, k_head, k_slot, v_row, v_head, v_slot, m_i,
                        l_i, acc, D, BLOCK_N, IEEE)


@triton.jit
def empty_softmax(GROUP_PAD: tl.constexpr, D: tl.constexpr):
    """A running softmax over no slot yet: max -inf, sum 0, output 0."""
    return (tl.full([GROUP_PAD], float("-inf"), tl.float32), tl.zeros([GROUP_PAD], tl.float32),
            tl.zeros([GROUP_PAD, D], tl.float32))


@triton.jit
def softmax_over(q, K, V, row, kv_head, start, end, scale, k_row, k_head, k_slot, v_row, v_head, v_slot, m_i, l_i, acc,
                 D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """A running softmax (m_i, l_i, acc) carried on over slots [start, end) of one KV head, a block at a time:
    the unnormalised output, the running max and the sum."""
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        k, v = kv_block(K, V, row, kv_head, n, end, k_row, k_head, k_slot, v_row, v_head, v_slot, D)
        m_i, l_i, acc = softmax_block(q, k, v, n < end, scale, m_i, l_i, acc, IEEE)
    return acc, m_i, l_i


@triton.jit
def kv_block(K, V, row, kv_head, n, end, k_row, k_head, k_slot, v_row, v_head, v_slot, D: tl.constexpr):
    """The keys and values of one KV head at slots n [BLOCK_N], each [BLOCK_N, D] (zeros from slot `end` on)."""
    d, inside = tl.arange(0, D), (n < end)[:, None]
    k = tl.load(K + row * k_row + kv_head * k_head + n[:, None] * k_slot + d[None, :], mask=inside, other=0.0)
    v = tl.load(V + row * v_row + kv_head * v_head + n[:, None] * v_slot + d[None, :], mask=inside, other=0.0)
    return k, v


@triton.jit
def softmax_block(q, k, v, inside, scale, m_i, l_i, acc, IEEE: tl.constexpr):
    """One block of slots (`inside` [BLOCK_N]: those that count) into a chunk's running max, sum and unnormalised
    output. A block with no slot inside leaves them as they are where the running max is finite."""
    if IEEE:  # exact fp32 products: an fp32 run, or any dtype in Triton's interpreter (widened here)
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(inside[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha, p = tl.exp(m_i - m_new), tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def split_kv_chunk(Q, K, V, Pos, Acc, M, L, scale, q_row, q_head, k_row, k_head, k_slot, v_row, v_head, v_slot,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLITS: tl.constexpr, IEEE: tl.constexpr):
    """The program's (row, KV head, chunk): its group's queries over the chunk of the valid prefix [0, Pos], the
    partial softmax stored for the merge."""
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end, _ = chunk_of(tl.load(Pos).to(tl.int32) + 1, split, SPLITS, BLOCK_N)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    heads = kv_head * GROUP + g
    q = tl.load(Q + row * q_row + heads[:, None] * q_head + d[None, :], mask=(g < GROUP)[:, None], other=0.0)
    acc, m_i, l_i = chunk_softmax(q, K, V, row, kv_head, start, end, scale, k_row, k_head, k_slot, v_row, v_head,
                                   v_slot, GROUP_PAD, D, BLOCK_N, IEEE)
    out = (row * GROUP * tl.num_programs(1) + heads) * SPLITS + split  # [bs, heads, SPLITS] index of each row
    tl.store(Acc + out[:, None] * D + d[None, :], acc, mask=(g < GROUP)[:, None])
    tl.store(M + out, m_i, mask=g < GROUP)
    tl.store(L + out, l_i, mask=g < GROUP)


@triton.jit
def _merge(Acc, M, L, Out, o_row, o_head, HEADS: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    merge_one_head(Acc, M, L, Out, o_row, o_head, HEADS, D, SPLITS)


@triton.jit
def merge_one_head(Acc, M, L, Out, o_row, o_head, HEADS: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """The program's (row, head): its SPLITS chunks' partial softmaxes merged into its output."""
    row, head = tl.program_id(0), tl.program_id(1)
    out = merge_head(Acc, M, L, (row * HEADS + head) * SPLITS, SPLITS, D, SPLITS, "")
    tl.store(Out + row * o_row + head * o_head + tl.arange(0, D), out.to(Out.dtype.element_ty))


@triton.jit
def merge_head(Acc, M, L, base, count, D: tl.constexpr, BLOCK: tl.constexpr, CACHE: tl.constexpr):
    """One query head's output [D] from the partial softmaxes of its first `count` chunks, at [base, base + count)
    of Acc, M and L: BLOCK chunks a load, merged online; an empty chunk (max -inf) weighs nothing. CACHE: the loads'
    cache modifier."""
    s, d = tl.arange(0, BLOCK), tl.arange(0, D)
    m_run = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    total, out = tl.sum(tl.zeros([BLOCK], tl.float32), 0), tl.zeros([D], tl.float32)
    for first in range(0, count, BLOCK):
        live = first + s < count
        m = tl.load(M + base + first + s, mask=live, other=float("-inf"), cache_modifier=CACHE)
        m_new = tl.maximum(m_run, tl.max(m, 0))
        weight, alpha = tl.where(m > float("-inf"), tl.exp(m - m_new), 0.0), tl.exp(m_run - m_new)
        total = total * alpha + tl.sum(weight * tl.load(L + base + first + s, mask=live, other=0.0,
                                                        cache_modifier=CACHE), 0)
        acc = tl.load(Acc + (base + first + s)[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                      cache_modifier=CACHE)
        out, m_run = out * alpha + tl.sum(weight[:, None] * acc, 0), m_new
    return out / total


def splits_for(rows: int, kv_heads: int, slots: int, programs: int = TARGET_PROGRAMS) -> int:
    """Chunks per (row, KV head): enough to bring the programs to about `programs`, a power of two, no more than
    the blocks."""
    wanted = max(1, programs // (rows * kv_heads))
    return max(1, min(triton.next_power_of_2(wanted), triton.next_power_of_2(triton.cdiv(slots, BLOCK_N))))


def triton_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, position: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """query [bs, heads, 1, d] at slot `position` (0-d, on the device) over key/value [bs, kv_heads, slots, d]:
    attention over slots [0, position], as [bs, heads, 1, d]."""
    bs, heads, _, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    if dim != triton.next_power_of_2(dim) or key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError(f"attn=triton-decode needs a power-of-two head_dim and contiguous heads, not {dim}")
    query, group = query.contiguous(), heads // kv_heads
    # Triton's interpreter computes a bf16 or fp16 tl.dot wrongly (errors of ~1e10 seen): on a CPU the kernel
    # widens what it loads to fp32 and multiplies in fp32 (IEEE), then writes the output in the query's dtype
    exact_fp32 = query.dtype == torch.float32 or interpreted()
    splits = splits_for(bs, kv_heads, slots)
    acc = torch.empty(bs, heads, splits, dim, device=query.device, dtype=torch.float32)
    maxes, sums = (torch.empty(bs, heads, splits, device=query.device, dtype=torch.float32) for _ in range(2))
    split_kv_chunk[(bs, kv_heads, splits)](  # the kernel, launched (the fused attention calls it too)
        query, key, value, position, acc, maxes, sums, scale, query.stride(0), query.stride(1),
        key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_N=BLOCK_N, SPLITS=splits,
        IEEE=exact_fp32)
    out = torch.empty(bs, heads, 1, dim, device=query.device, dtype=query.dtype)
    _merge[(bs, heads)](acc, maxes, sums, out, out.stride(0), out.stride(1), HEADS=heads, D=dim, SPLITS=splits)
    return out
