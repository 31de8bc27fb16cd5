"""Copies first: a bs=1 product whose weight tiles the tensor memory accelerator starts copying before the PDL wait.

Why a kernel of its own, in Gluon: Triton's pipeliner issues `_matvec_tma`'s first copies with its input's, after
`griddepcontrol.wait`, so a large product reads nothing while the kernel before drains; a copy placed before the wait
in Triton's language is lowered as a copy and a wait on its barrier at once, so each program would wait for its first
tile before it even waits for the kernel before. Gluon (Triton's lower-level language, with explicit shared memory
and barriers) lets each program start all its stages' copies, wait for the kernel before only then, and read the
input (which that kernel wrote) after it.

One row (bs=1), weights packed tile-major (plan.pack), any of a step's products: QKV (its split's partial
sums and squares, the embedding's row its input at layer 0), O and down (added to the residual, atomically where K
is split), gate/up (SwiGLU) and lm_head (logits). On CUDA cores: a row leaves the tensor cores 1/16 used, and a tile
is 32 multiply-adds a thread. Gluon runs on the GPU only (not in Triton's interpreter): the CPU suite compiles it for
sm_90 and checks the order of its copies and its wait; the GPU suite checks what it computes.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import _runtime as gluon_runtime
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Triton releases name three of its pieces differently (3.6 and 3.9 both run here; the first: for the ahead-of-time
# compiles of it in the tests and benchmarks/fused_occupancy.py; 3.6 keeps it in _runtime alone)
GluonASTSource = getattr(gluon, "GluonASTSource", None) or gluon_runtime.GluonASTSource
_copy_tile = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_all_threads = getattr(gl, "thread_barrier", None) or gl.barrier
KINDS = ("qkv", "o", "gate_up", "down", "lm_head")  # the products whose input and output it takes (all a step has)
GLUON_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@gluon.jit
def _grid_dependency(instruction: gl.constexpr):
    """PDL's wait or early launch (griddepcontrol), in every thread."""
    gl.inline_asm_elementwise(instruction + " // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _input_columns(X, ResOut, Gain, k_first, tile, tiles, k_total, pid_n, NORM: gl.constexpr, EMBEDDING: gl.constexpr,
                   BK: gl.constexpr, layout: gl.constexpr):
    """The input row's columns of the split's `tile` (zeros past the split or K) in fp32, and the same times the
    norm's gain where NORM. EMBEDDING: X is the embedding's row of the input id, the residual stream's first value,
    which the first column block writes to ResOut."""
    k = k_first + tile * BK + gl.arange(0, BK, layout=layout)
    inside = (k < k_total) & (tile < tiles)
    x = gl.load(X + k, mask=inside, other=0.0).to(gl.float32)
    if EMBEDDING:
        if pid_n == 0:
            gl.store(ResOut + k, x, mask=inside)
    if NORM:
        return x, x * gl.load(Gain + k, mask=inside, other=0.0).to(gl.float32)
    return x, x


@gluon.jit
def _copy_stage(Wdesc, weights, ready, stage, tile, pred, BN: gl.constexpr):
    """The packed tile `tile` (rows tile * BN.. of the [tiles * BN, BK] view) copied into `stage`, where `pred`."""
    mbarrier.expect(ready.index(stage), Wdesc.block_type.nbytes, pred=pred)
    _copy_tile(Wdesc, [tile * BN, 0], ready.index(stage), weights.index(stage), pred=pred)


@gluon.jit
def _start_copies(Wdesc, weights, ready, first_tile, tiles, STAGES: gl.constexpr, BN: gl.constexpr):
    """Each stage's barrier readied and the split's first STAGES tiles (as many as it has) copied into them."""
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    for s in gl.static_range(STAGES):
        _copy_stage(Wdesc, weights, ready, s, first_tile + s, s < tiles, BN)


@gluon.jit
def _launch_dependents(PDL: gl.constexpr, HERE: gl.constexpr):
    """PDL's early launch of the next kernel, where this is the point its launch constant names."""
    if PDL:
        if HERE:
            _grid_dependency("griddepcontrol.launch_dependents;")


@gluon.jit
def _matvec_copies_first(X, Ids, ResOut, Gain, Wdesc, Out, SquaresOut, Bump, k_total, n_total, out_cols, k_per_split,
                         k_tiles, eps, INPUT: gl.constexpr, NORM: gl.constexpr, OUTPUT: gl.constexpr,
                         SPLITS: gl.constexpr, BUMP: gl.constexpr, LAUNCH: gl.constexpr, BN: gl.constexpr,
                         BK: gl.constexpr, STAGES: gl.constexpr, SPLIT_TILES: gl.constexpr, PDL: gl.constexpr):
    """out = norm?(x) @ W.T for one row, one block of BN output columns (program id 0) and one K split (id 1): the
    split's first STAGES tiles copied before the PDL wait, each stage copied again once every warp has read it; the
    next kernel let launch where LAUNCH says (plan.launch_point). INPUT, OUTPUT and LAUNCH are numbered as
    products.py's and plan.py's (PLAIN, EMBEDDING; PARTIALS, SWIGLU, LOGITS, ADD; AT_WAIT, AFTER_LOOP, AT_END)."""
    pid_n, pid_k = gl.program_id(0), gl.program_id(1)
    first_tile = pid_n * k_tiles + pid_k * SPLIT_TILES
    tiles = gl.minimum(SPLIT_TILES, k_tiles - pid_k * SPLIT_TILES)
    weights = gl.allocate_shared_memory(Wdesc.dtype, [STAGES, BN, BK], Wdesc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    _start_copies(Wdesc, weights, ready, first_tile, tiles, STAGES, BN)  # the weights need no kernel before
    if PDL:
        _grid_dependency("griddepcontrol.wait;")
    _launch_dependents(PDL, LAUNCH == 0)  # AT_WAIT
    if INPUT == 1:  # EMBEDDING: X is the table, its row the input id's (read after the wait, as the input is)
        X = X + gl.load(Ids).to(gl.int64) * k_total
    first, second, squares = _stages_read(X, ResOut, Gain, Wdesc, weights, ready, first_tile, tiles,
                                          pid_k * k_per_split, k_total, pid_n, NORM, INPUT == 1, BN, BK, STAGES)
    _launch_dependents(PDL, LAUNCH == 1)  # AFTER_LOOP
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
    first, second = gl.sum(first, 1), gl.sum(second, 1)
    _store(first, second, gl.sum(squares, 0), Out, SquaresOut, Bump, pid_n, pid_k, k_total, n_total, out_cols, eps,
           NORM, OUTPUT, SPLITS, BUMP, BN)
    _launch_dependents(PDL, LAUNCH == 2)  # AT_END


@gluon.jit
def _stages_read(X, ResOut, Gain, Wdesc, weights, ready, first_tile, tiles, k_first, k_total, pid_n,
                 NORM: gl.constexpr, EMBEDDING: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                 STAGES: gl.constexpr):
    """The split's products, each stage's tile as its copy lands, the stage copied again once every warp has read it:
    the products of the tile's first and second half of rows (gate/up: gate's, then up's) [BN / 2, BK] a half,
    summed over the tile's columns only at the end (one sum across threads a split, not one a tile); and the input's
    squares [BK]."""
    tile_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [gl.num_warps(), 1], [1, 0])  # 16 bytes a thread
    columns: gl.constexpr = gl.SliceLayout(0, tile_layout)
    HALF: gl.constexpr = BN // 2
    x, xg = _input_columns(X, ResOut, Gain, k_first, 0, tiles, k_total, pid_n, NORM, EMBEDDING, BK, columns)
    squares = gl.zeros([BK], gl.float32, columns)
    first = gl.zeros([HALF, BK], gl.float32, tile_layout)
    second = gl.zeros([HALF, BK], gl.float32, tile_layout)
    for i in range(tiles):
        x_next, xg_next = _input_columns(X, ResOut, Gain, k_first, i + 1, tiles, k_total, pid_n, NORM, EMBEDDING, BK,
                                         columns)
        stage = i % STAGES
        mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
        tile = weights.index(stage)
        first += tile.slice(0, HALF).load(tile_layout).to(gl.float32) * xg[None, :]
        second += tile.slice(HALF, HALF).load(tile_layout).to(gl.float32) * xg[None, :]
        squares += x * x
        _all_threads()  # every warp has read the stage before it is copied over, and those reads are ordered
        fence_async_shared()  # before the copy engine's write
        _copy_stage(Wdesc, weights, ready, stage, first_tile + i + STAGES, i + STAGES < tiles, BN)
        x, xg = x_next, xg_next
    return first, second, squares


@gluon.jit
def _store(first, second, squares, Out, SquaresOut, Bump, pid_n, pid_k, k_total, n_total, out_cols, eps,
           NORM: gl.constexpr, OUTPUT: gl.constexpr, SPLITS: gl.constexpr, BUMP: gl.constexpr, BN: gl.constexpr):
    """The block's sums, its first and second half of columns: the split's partial sums (and, normed, the squares of
    its columns of the input, for the consumer's norm), SwiGLU's activations (gate's half, then up's), the logits, or
    added to the residual (atomically where K is split)."""
    HALF: gl.constexpr = BN // 2
    if NORM and OUTPUT != 0:  # the whole K in this program: the norm's 1/rms is known here
        inv_rms = gl.rsqrt(squares / k_total + eps)
        first, second = first * inv_rms, second * inv_rms
    j = gl.arange(0, HALF, layout=first.type.layout)
    n = pid_n * BN + j
    if OUTPUT == 0:  # PARTIALS [SPLITS, 1, n]
        gl.store(Out + pid_k * n_total + n, first, mask=n < n_total)
        gl.store(Out + pid_k * n_total + n + HALF, second, mask=n + HALF < n_total)
        if NORM:
            if pid_n == 0:
                gl.store(SquaresOut + pid_k, squares)
    elif OUTPUT == 1:  # SWIGLU
        out = pid_n * HALF + j
        gl.store(Out + out, (first / (1.0 + gl.exp(-first)) * second).to(Out.dtype.element_ty), mask=out < out_cols)
    elif OUTPUT == 2:  # LOGITS
        gl.store(Out + n, first, mask=n < n_total)
        gl.store(Out + n + HALF, second, mask=n + HALF < n_total)
    elif OUTPUT == 3:  # ADD, each split's sums
        if SPLITS == 1:
            gl.store(Out + n, gl.load(Out + n, mask=n < n_total) + first, mask=n < n_total)
            gl.store(Out + n + HALF, gl.load(Out + n + HALF, mask=n + HALF < n_total) + second,
                     mask=n + HALF < n_total)
        else:
            gl.atomic_add(Out + n, first, mask=n < n_total, sem="relaxed")
            gl.atomic_add(Out + n + HALF, second, mask=n + HALF < n_total, sem="relaxed")
    if BUMP:  # the cache position this kernel's layer keeps, one step on (nothing in this kernel reads it)
        if pid_n + pid_k == 0:
            gl.store(Bump, gl.load(Bump) + 1)


def descriptor(packed: torch.Tensor, bn: int, bk: int) -> TensorDescriptor:
    """Gluon's TMA descriptor of a weight packed tile-major ([tiles * bn, bk] boxes, 128-byte swizzled)."""
    layout = gl.NVMMASharedLayout.get_default_for([bn, bk], GLUON_DTYPES[packed.dtype])
    return TensorDescriptor.from_tensor(packed.view(-1, bk), [bn, bk], layout)


def launch_arguments(bn: int, bk: int, n: int, k: int, splits: int, stages: int, out_cols: int, *, input: int,
                     norm: bool, bump: bool, output: int, launch: int, pdl: bool) -> tuple[dict, dict]:
    """The integers `_matvec_copies_first` takes after its pointers (by name, in order) and its compile-time
    constants, for an n x k product in `splits` K splits of whole tiles (launch's; benchmarks/fused_occupancy.py
    compiles the same)."""
    k_tiles = -(-k // bk)
    split_tiles = -(-k_tiles // splits)  # a split is whole tiles: its first is a packed tile's first column
    sizes = dict(k_total=k, n_total=n, out_cols=out_cols, k_per_split=split_tiles * bk, k_tiles=k_tiles)
    return sizes, dict(INPUT=input, NORM=norm, OUTPUT=output, SPLITS=splits, BUMP=bump, LAUNCH=launch, BN=bn, BK=bk,
                       STAGES=stages, SPLIT_TILES=split_tiles, PDL=pdl)


def launch(descriptor: TensorDescriptor, grid: tuple[int, int], x: torch.Tensor, out: torch.Tensor, *, ids, residual,
           gain, squares, bump, n: int, k: int, splits: int, stages: int, warps: int, eps: float, input: int,
           output: int, launch_at: int, pdl: bool) -> None:
    """One launch over `grid` (column blocks, K splits): x [1, k] (input=EMBEDDING: the row of the table x that
    `ids` names, written to `residual`; normed by `gain` where given) times the weight into `out` as `output` says
    (the squares of the input's columns into `squares`, where partial sums are normed), the cache position `bump`
    advanced where given, the next kernel let launch at `launch_at`. A pointer not read may be any tensor (`out`
    stands in)."""
    sizes, constants = launch_arguments(*descriptor.block_shape, n, k, splits, stages, out.shape[-1], input=input,
                                        norm=gain is not None, bump=bump is not None, output=output, launch=launch_at,
                                        pdl=pdl)
    ids, residual, gain, squares, bump = (out if p is None else p for p in (ids, residual, gain, squares, bump))
    _matvec_copies_first[grid](x, ids, residual, gain, descriptor, out, squares, bump, *sizes.values(), eps,
                               **constants, num_warps=warps, **(dict(launch_pdl=True) if pdl else {}))
