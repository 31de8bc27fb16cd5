"""The matrix-vector products of a fused decode step (`_matvec`, and `_matvec_tma` under fused.tma), with the
elementwise work around them: QKV, O, gate/up, down and the final norm with lm_head are each one launch of these.

How a product is computed: each program takes one block of BN output columns and one split of K (program ids 0 and
1). Its weight tiles are the MMA's left operand on tensor cores (the batch rows, padded to 16, are the narrow side),
or, for a bs=1 product planned as slices (fused.slices), a few whole rows of the weight summed on CUDA cores. Its
first weight tile is loaded before the PDL wait: the weights do not depend on the kernel before. The input is the
residual stream (fp32; at layer 0 the embedding rows of the input ids, which the first column block writes as the
stream's first value), times the norm's gain where the product has one; the norm's 1/rms is a per-row scale, so the
program sums the squares of the input it reads anyway, and whichever program holds the whole K applies it. Where K
is split, the splits leave partial sums that the consumer adds (QKV), or add atomically into the fp32 residual (O,
down): no extra launch.

Under fused.tma the tiles stream through Hopper's tensor memory accelerator into shared memory, where the tensor
cores read them (Triton's pipeliner keeps `stages` tiles in flight), instead of passing through registers and a
store to shared memory for the MMA.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels.fused import copies_first
from harness.kernels.fused.pdl import _pdl_wait_launch, _prefetch_to_l2, pdl_launch
from harness.kernels.fused.plan import Product, launch_point

# `_matvec`'s input: a buffer (any dtype), or the embedding rows of the input ids (written as the residual's value)
PLAIN, EMBEDDING = 0, 1
# its output: fp32 partial sums [splits, rows, n], SiLU(gate)·up of packed pairs, logits (norm applied), or a sum
# added to the fp32 residual stream in place (atomically where K is split)
PARTIALS, SWIGLU, LOGITS, ADD = 0, 1, 2, 3


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
def _program_split(W, k_total, k_per_split, k_tiles, prefetch_bytes, BN: tl.constexpr, BK: tl.constexpr,
                   PREFETCH: tl.constexpr):
    """The program's block of columns and split of K (program ids 0 and 1), and its split's columns [start, end);
    PREFETCH: its first packed tiles asked of L2 (a split's tiles are contiguous from its first one)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, k_total)
    if PREFETCH:
        _prefetch_to_l2(W, (pid_n * k_tiles + k_start // BK) * BN * BK, prefetch_bytes)
    return pid_n, pid_k, k_start, k_end


@triton.jit
def _matvec(X, x_row, ResOut, Ids, Gain, W, Out, SquaresOut, Bump, rows, k_total, n_total, out_cols, k_per_split,
            k_tiles, eps, prefetch_bytes, prefetch_ahead, INPUT: tl.constexpr, NORM: tl.constexpr, OUTPUT: tl.constexpr,
            SPLITS: tl.constexpr, BUMP: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            PACKED: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr = False,
            ONE_TILE: tl.constexpr = False, LAUNCH: tl.constexpr = 1):
    """out = norm?(input) @ W.T for one block of BN output columns and one K split (program ids 0 and 1)."""
    pid_n, pid_k, k_start, k_end = _program_split(W, k_total, k_per_split, k_tiles, prefetch_bytes, BN, BK, PREFETCH)
    w = _weight_tile(W, pid_n, k_start, k_end, n_total, k_total, k_tiles, BN, BK, PACKED)  # weights: before the wait
    _pdl_wait_launch(PDL, True, LAUNCH == 0)  # where the next kernel may launch (0-2): launch_point
    acc, squares = _weight_loop(w, X, x_row, ResOut, Ids, Gain, W, rows, k_start, k_end, k_total, n_total, k_tiles,
                                pid_n, prefetch_ahead, INPUT, NORM, ROWS, BN, BK, PACKED, DOT, PREFETCH, ONE_TILE)
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
                PREFETCH: tl.constexpr = False, LAUNCH: tl.constexpr = 1):
    """`_matvec` with the weight tiles read through the descriptor Wdesc: the tensor memory accelerator copies each
    [BN, BK] tile into shared memory, STAGES tiles in flight (Triton's pipeliner), and the tensor cores read it
    there. The pipeliner's first copies come after the PDL wait (they are issued with the input's, which the kernel
    before writes); PREFETCH asks L2 for the first tiles before it."""
    pid_n, pid_k, k_start, k_end = _program_split(W, k_total, k_per_split, k_tiles, prefetch_bytes, BN, BK, PREFETCH)
    _pdl_wait_launch(PDL, True, LAUNCH == 0)
    acc = tl.zeros([BN, ROWS] if DOT else [ROWS, BN], tl.float32)
    squares = tl.zeros([ROWS], tl.float32)
    for k0 in tl.range(k_start, k_end, BK, num_stages=STAGES):
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
                 ONE_TILE: tl.constexpr = False):
    """The product over the split's K, from its first tile `w`, loaded before the PDL wait: the sums [BN, ROWS]
    (tensor cores: the weight tile is the MMA's left operand, its columns fill the MMA's M, which a handful of batch
    rows could not) or [ROWS, BN], and the input's squares [ROWS]. The next tile is loaded before this one is used.
    ONE_TILE: the split is that one tile (no loop, and no registers held for a next tile)."""
    acc = tl.zeros([BN, ROWS] if DOT else [ROWS, BN], tl.float32)
    squares = tl.zeros([ROWS], tl.float32)
    if ONE_TILE:
        x, squares = _input_tile(X, x_row, ResOut, Ids, Gain, rows, k_start, k_end, k_total, pid_n, INPUT, NORM,
                                 ROWS, BK)
        acc = _multiply_add(acc, w, x, DOT)
    else:
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


def launch_product(product: Product, x: torch.Tensor, out: torch.Tensor, rows: int, *, residual=None, ids=None,
                   gain=None, squares=None, bump=None, eps: float = 1e-6, input: int = PLAIN, output: int = PARTIALS,
                   pdl: bool = False) -> None:
    """One launch of `product`'s kernel as its plan says: x [rows, k] (input=EMBEDDING: the rows of the table x that
    `ids` name) times its weight into `out`, the norm's gain where given, into the fp32 `residual` where output=ADD,
    the cache position `bump` advanced where given. A pointer the launch does not read may be left out (`out` stands
    in). The step and the benchmarks launch products through this one call."""
    if product.copies_first:  # one row
        copies_first.launch(product.descriptor, product.grid, x, out, ids=ids, residual=residual, gain=gain,
                            squares=squares, bump=bump, n=product.n, k=product.k, splits=product.splits,
                            stages=product.stages, warps=product.warps, eps=eps, input=input, output=output,
                            launch_at=launch_point(product), pdl=pdl)
        return
    residual, ids, gain_given = out if residual is None else residual, out if ids is None else ids, gain is not None
    gain, squares = out if gain is None else gain, out if squares is None else squares
    bump_at = out if bump is None else bump
    shared = product_constants(product, rows, input, output, gain_given, bump is not None, pdl)
    sizes = tuple(product_sizes(product, rows, out.shape[-1], eps).values())
    if product.descriptor is not None:
        _matvec_tma[product.grid](x, x.stride(0), residual, ids, gain, product.weight, product.descriptor, out,
                                  squares, bump_at, *sizes, STAGES=product.stages, **shared)
        return
    _matvec[product.grid](x, x.stride(0), residual, ids, gain, product.weight, out, squares, bump_at, *sizes,
                          product.prefetch_ahead, ONE_TILE=product.one_tile, **shared)


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
