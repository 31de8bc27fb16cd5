"""How each matrix-vector product of a fused decode step runs: its tiles or slices, K splits, warps, TMA stages,
and where it lets the next kernel launch; and its weight as the kernel reads it (packed tile-major, or row-major).

Why these shapes: a decode step at small batch reads every weight once and does little with each, so what counts is
keeping HBM busy. A product whose column blocks are too few for the GPU splits its K (the splits' sums are added by
the consumer, or atomically into the residual), and where even the splits leave SMs idle its blocks narrow. Weights
are packed at prepare time so that each program reads its tiles as contiguous runs of 16-byte loads. At one row a
product's tensor-core tile is 1/16 used, so the rules take other shapes there: whole rows of the weight on CUDA
cores (fused.slices) in a narrow model, and in a wider one tiles that the tensor memory accelerator copies into
shared memory (fused.tma), started before the PDL wait where the copies-first kernel may run them.

Every number a rule compares against is a knob (`Knobs`, knobs.py), handed in; the SM count is the device's.
`PlanChoice` is what a product's plan leaves open to fused.tune, one choice per kind of product.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from harness.kernels.fused import copies_first
from harness.kernels.fused.knobs import Knobs
from harness.kernels.triton_runtime import interpreted

# The kinds of product a step launches, each planned alike in every layer; those whose K may split (gate/up needs
# whole sums for SiLU; lm_head has blocks enough)
PRODUCT_KINDS = ("qkv", "o", "gate_up", "down", "lm_head")
SPLITTABLE_KINDS = ("qkv", "o", "down")
# Where a product lets the next kernel launch (PDL's launch_dependents): AT_WAIT, at its own PDL wait, where its
# programs have all started and its predecessor is done; AFTER_LOOP, once its weight loop has read every weight,
# before it stores; AT_END, after its stores, so that the next kernel's programs take no slot while this one's run
AT_WAIT, AFTER_LOOP, AT_END = 0, 1, 2
# The SMs of the H100 SXM and the H200: the plan's target where no GPU is present to ask (Triton's interpreter, an
# ahead-of-time compile for sm_90)
HOPPER_SMS = 132


def sm_count(device: torch.device | str) -> int:
    """The streaming multiprocessors a product's programs fill: the GPU's own, or HOPPER_SMS without one."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return HOPPER_SMS


@dataclass(frozen=True)
class PlanChoice:
    """What a product's plan leaves open, one choice per kind of product (every layer's QKV alike): the programs an
    SM its K splits aim at, packed or row-major weights, warps a program, the L2 prefetch before the PDL wait, row
    slices or tiles. The rules give each its default; fused.tune=true times the others in the step on the GPU at
    hand (tune.py)."""

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
    descriptor: object = None  # the weight's TMA descriptor where its tiles stream through it, else None
    stages: int = 0  # the tiles in flight a program where they do
    copies_first: bool = False  # its TMA copies start before its PDL wait (copies_first.py: one row, packed)
    launch: int = -1  # where its programs let the next kernel launch, where the step set it (-1: launch_point's)

    def __str__(self) -> str:
        shape = f"{self.bn}x{self.bk} " + ("row slices" if self.choice and self.choice.slices else "tiles")
        return (f"{shape}, {self.splits} split{'s' * (self.splits > 1)}, {self.warps} warps, "
                f"{'packed' if self.packed else 'row-major'}" + ", L2 prefetch" * (self.prefetch_bytes > 0)
                + f", TMA {self.stages} stages" * (self.descriptor is not None)
                + ", copied before the wait" * self.copies_first)

    @property
    def prefetch_ahead(self) -> int:
        """Columns of K between the tile a loop iteration loads and the one it asks L2 for (the rolling prefetch):
        the tiles that the first prefetch covered (at least one), or 0 where there is no prefetch."""
        if not self.prefetch_bytes:
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


def launch_point(product: Product) -> int:
    """Where `product`'s programs let the next kernel launch: the point the step set for it (the decoder's O before
    a gate/up that copies first), else after its stores for a gate/up sliced on eight warps (the next kernel's
    programs would take its slots), after its weight loop for the rest."""
    if product.launch >= 0:
        return product.launch
    sliced = product.choice is not None and product.choice.slices
    return AT_END if product.kind == "gate_up" and sliced and product.warps >= 8 else AFTER_LOOP


def tile_sizes(knobs: Knobs, n: int, k: int) -> tuple[int, int, int]:
    """(BN, BK, warps). On a GPU, tensor cores with the weight tile as the MMA's left operand. In Triton's interpreter
    (CUDA-core products in fp32), whose cost is per program and per operation, wide column blocks and narrow K tiles,
    so that a tiny model's products still run split and over several tiles (the paths the tests check)."""
    if interpreted():
        return (min(knobs.interpreted_columns, triton.next_power_of_2(n)),
                min(knobs.interpreted_k, triton.next_power_of_2(k)), 1)
    return knobs.tile_columns, min(knobs.tile_k, triton.next_power_of_2(k)), knobs.tile_warps


def warps_for(knobs: Knobs, warps: int, rows: int, hidden: int) -> int:
    """A product's warps at `rows` batch rows in a model of `hidden` size: tile_sizes' own, or fewer from many rows
    in a wide model, on a GPU."""
    fewer = (rows >= knobs.fewer_warps_from_rows and hidden >= knobs.fewer_warps_from_hidden
             and not interpreted())
    return min(warps, knobs.fewer_warps) if fewer else warps


def split_count(knobs: Knobs, sms: int, n: int, k: int, bn: int, bk: int, allowed: bool, most: int | None = None,
                per_sm: int | None = None) -> int:
    """K splits where the column blocks alone are too few: a power of two that brings the programs to at least
    `per_sm` (programs_per_sm) on each of `sms` SMs and leaves whole tiles per split, `most` (max_splits) at most."""
    blocks, splits = triton.cdiv(n, bn), 1
    most, per_sm = most or knobs.max_splits, per_sm or knobs.programs_per_sm
    while allowed and splits < most and blocks * splits < per_sm * sms and k % (2 * splits * bk) == 0:
        splits *= 2
    return splits


def blocks_and_splits(knobs: Knobs, sms: int, n: int, k: int, bk: int, split_k: bool,
                      per_sm: int | None = None) -> tuple[int, int]:
    """(BN, K splits): tile_columns a block, split where the blocks are too few (split_count); where even those
    splits leave SMs without a program (a 1024-wide model's O and down), up to wide_max_splits; and only then
    narrower blocks, down to the MMA's 16."""
    bn = tile_sizes(knobs, n, k)[0]
    splits = split_count(knobs, sms, n, k, bn, bk, split_k, per_sm=per_sm)
    if not interpreted() and triton.cdiv(n, bn) * splits < sms:  # more splits first, where K has the tiles
        splits = split_count(knobs, sms, n, k, bn, bk, split_k, knobs.wide_max_splits, per_sm)
    while not interpreted() and bn > 16 and triton.cdiv(n, bn) * splits < sms:
        bn //= 2
        splits = split_count(knobs, sms, n, k, bn, bk, split_k, per_sm=per_sm)
    return bn, splits


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


def slice_layout(knobs: Knobs, n: int, k: int, splittable: bool, warps: int, hidden: int = 0) -> tuple[int, int, int]:
    """(rows a program, BK, K splits) of fused.slices: K split in two until a split is slice_columns or fewer (where
    `splittable`), BK the split's length to the next power of two (the loads past it masked), and as many rows as
    keep slice_values(hidden) of the slice in each of `warps` warps' threads (two at least: gate/up's halves). All of
    a program's loads are then in flight at once, held by the register file rather than a loop."""
    splits = 1
    while splittable and triton.cdiv(k, splits) > knobs.slice_columns:
        splits *= 2
    bk = triton.next_power_of_2(triton.cdiv(k, splits))
    return max(2, slice_values(knobs, hidden) * warps * 32 // bk), bk, splits


def slice_values(knobs: Knobs, hidden: int) -> int:
    """A slice's values a thread in a model of `hidden` size (0: not given): more in a narrow model."""
    narrow = 0 < hidden <= knobs.slice_narrow_hidden
    return knobs.slice_values_a_thread_narrow if narrow else knobs.slice_values_a_thread


def prefetch_bytes(knobs: Knobs, n: int, k: int, bn: int, bk: int, splits: int, element_bytes: int, asked) -> int:
    """Bytes each program of a product asks L2 for before its PDL wait: its share of l2_prefetch_bytes, at most its
    slice of the weights, in the bulk prefetch's 16-byte units. 0 where it does not apply: not asked (`asked`: the
    run's switches, or the product's own PlanChoice), row-major weights (a program's tiles are not one run), or
    Triton's interpreter (no inline PTX)."""
    if not (asked.prefetch and asked.packed) or interpreted():
        return 0
    programs = triton.cdiv(n, bn) * splits
    slice_bytes = triton.cdiv(triton.cdiv(k, bk), splits) * bn * bk * element_bytes
    return min(slice_bytes, knobs.l2_prefetch_bytes // programs) // 16 * 16


def default_choice(knobs: Knobs, n: int, k: int, options, rows: int, hidden: int, kind: str = "",
                   element_size: int = 2) -> PlanChoice:
    """The rules' plan for an n x k product of `kind` with weights of `element_size` bytes at `rows` batch rows of a
    model of `hidden` size: fused.slices for the sliced kinds where the rows are few and the model narrow enough, on
    a GPU (in Triton's interpreter, whose cost is per program, tiles), unless the large products' rule streams the
    kind through TMA or the copies-first rule takes it (copies_first_reaches)."""
    slices = (kind in knobs.sliced_kinds and hidden <= knobs.slice_max_hidden and slices_apply(knobs, options, rows)
              and not large_through_tma(knobs, kind, hidden, options, element_size)
              and not copies_first_reaches(knobs, kind, hidden, options, element_size, rows, options.packed))
    warps = rule_warps(knobs, kind, n, k, options, rows, hidden, slices)
    if slices:
        return PlanChoice(knobs.programs_per_sm, options.packed, warps, slices=True)
    one_an_sm = kind == "qkv" and qkv_one_an_sm(knobs, hidden, options, element_size, rows)
    return PlanChoice(1 if one_an_sm else knobs.programs_per_sm, options.packed, warps, options.prefetch)


def qkv_one_an_sm(knobs: Knobs, hidden: int, options, element_size: int, rows: int) -> bool:
    """Whether the rules split QKV's K for one program an SM, not programs_per_sm (four tiles a program, where two
    gave it more programs than SMs hold at once): at qkv_one_an_sm_max_rows rows at most, where the large products'
    rule or the copies-first rule's width streams the rest of the step (fused.tma=false plans the step before
    both)."""
    return rows <= knobs.qkv_one_an_sm_max_rows and (large_rule_model(knobs, hidden, options, element_size)
                                                     or copies_first_width(knobs, hidden, options, element_size, rows))


def rule_warps(knobs: Knobs, kind: str, n: int, k: int, options, rows: int, hidden: int, slices: bool) -> int:
    """The warps the rules give a program of an n x k product of `kind`, as fused.slices or as tiles: a slice whose K
    slice_layout does not split (gate/up and lm_head never; QKV, O and down where fused.split_k is off or K is
    slice_columns at most) and is slice_more_warps_from columns or more on eight, other slices on slice_warps;
    tiles on tile_sizes' warps, fewer from many rows in a wide model (warps_for)."""
    if slices:
        splittable = options.split_k and kind in SPLITTABLE_KINDS
        splits = slice_layout(knobs, n, k, splittable, knobs.slice_warps, hidden)[2]
        return 8 if splits == 1 and k >= knobs.slice_more_warps_from else knobs.slice_warps
    return warps_for(knobs, tile_sizes(knobs, n, k)[2], rows, hidden)


def slices_apply(knobs: Knobs, options, rows: int) -> bool:
    """Whether the rules plan fused.slices: asked, at slice_max_rows rows or fewer, on a GPU."""
    return options.slices and rows <= knobs.slice_max_rows and not interpreted()


def plan(weight: torch.Tensor, options, knobs: Knobs, splittable: bool, rows: int = 1, hidden: int = 0,
         choice: PlanChoice | None = None, kind: str = "") -> Product:
    """How to run x @ weight.T for `rows` batch rows of a model of `hidden` size (as `choice` says, else by the
    rules), and the weight as the kernel reads it. `options`: the run's fused.* switches."""
    n, k = weight.shape
    choice = choice or default_choice(knobs, n, k, options, rows, hidden, kind, weight.element_size())
    if choice.slices:
        bn, bk, splits = slice_layout(knobs, n, k, options.split_k and splittable, choice.warps, hidden)
        return Product(weight.contiguous(), n, k, bn, bk, splits, False, False, choice.warps, 0, choice, kind)
    bk = tile_sizes(knobs, n, k)[1]
    bn, splits = blocks_and_splits(knobs, sm_count(weight.device), n, k, bk, options.split_k and splittable,
                                   choice.per_sm)
    return streamed(Product(pack(weight, bn, bk) if choice.packed else weight.contiguous(), n, k, bn, bk, splits,
                            not interpreted(), choice.packed, choice.warps,  # (the interpreter: bf16 tl.dot wrong)
                            prefetch_bytes(knobs, n, k, bn, bk, splits, weight.element_size(), choice), choice, kind),
                    options, knobs, hidden, rows)


def plan_swiglu(gate: torch.Tensor, up: torch.Tensor, options, knobs: Knobs, rows: int = 1, hidden: int = 0,
                choice: PlanChoice | None = None) -> Product:
    """gate and up as one product whose every BN columns are half gate, half up (never split: SiLU needs whole sums),
    for `rows` batch rows of a model of `hidden` size. Where the copies-first rule takes it and its blocks are fewer
    than the SMs, narrower blocks: gate/up cannot split, so they are its one way to more programs."""
    both, k = 2 * gate.shape[0], gate.shape[1]
    choice = choice or default_choice(knobs, both, k, options, rows, hidden, "gate_up", gate.element_size())
    if choice.slices:
        bn, bk, _ = slice_layout(knobs, both, k, False, choice.warps, hidden)
    else:
        bn, bk, _ = tile_sizes(knobs, both, k)
        if (triton.cdiv(both, bn) < sm_count(gate.device)
                and copies_first_reaches(knobs, "gate_up", hidden, options, gate.element_size(), rows, choice.packed)):
            bn //= 2
    paired = pair_blocks(gate, up, bn // 2)
    n = paired.shape[0]
    if choice.slices:  # row-major rows, on CUDA cores
        return Product(paired, n, k, bn, bk, 1, False, False, choice.warps, 0, choice, "gate_up")
    return streamed(Product(pack(paired, bn, bk) if choice.packed else paired, n, k, bn, bk, 1, not interpreted(),
                            choice.packed, choice.warps,
                            prefetch_bytes(knobs, n, k, bn, bk, 1, paired.element_size(), choice), choice, "gate_up"),
                    options, knobs, hidden, rows)


def streamed(product: Product, options, knobs: Knobs, hidden: int, rows: int) -> Product:
    """`product` with a TMA descriptor of its weight where fused.tma applies (16-bit tiles in a model tma_from_hidden
    wide or wider, or by the large products' rule): [bn, bk] boxes of the packed weight viewed as [tiles * bn, bk],
    or of the row-major weight; run as the copies-first kernel where gluon_runs says it may, for the large products
    and copies_first_small_kinds in the models the large products' rule covers, and for the kinds the copies-first
    rule's width takes (copies_first_reaches)."""
    element_size = product.weight.element_size()
    large = large_through_tma(knobs, product.kind, hidden, options, element_size)
    small = product.kind in knobs.copies_first_small_kinds and large_rule_model(knobs, hidden, options, element_size)
    reached = copies_first_reaches(knobs, product.kind, hidden, options, element_size, rows, product.packed)
    wide = options.tma and hidden >= knobs.tma_from_hidden and tma_element_size(element_size)
    if (large or small or reached) and gluon_runs(product.kind, rows, product.packed):
        split_tiles = triton.cdiv(product.k_tiles, product.splits)
        stages = (knobs.copies_first_stages if product.kind in knobs.tma_large_kinds
                  else min(split_tiles, knobs.copies_first_small_stages))
        return replace(product, descriptor=copies_first.descriptor(product.weight, product.bn, product.bk),
                       stages=stages, copies_first=True, warps=knobs.copies_first_warps or product.warps)
    if not (wide or large):
        return product
    stages = knobs.tma_large_stages if large else tma_stages(knobs, product)
    boxed = product.weight.view(-1, product.bk) if product.packed else product.weight
    return replace(product, descriptor=TensorDescriptor.from_tensor(boxed, [product.bn, product.bk]), stages=stages)


def gluon_runs(kind: str, rows: int, packed: bool) -> bool:
    """Whether the copies-first kernel may run a product of `kind`: one row, weights packed tile-major, on a GPU
    (Gluon does not run in Triton's interpreter), a kind whose input and output it takes."""
    return rows == 1 and packed and not interpreted() and kind in copies_first.KINDS


def copies_first_width(knobs: Knobs, hidden: int, options, element_size: int, rows: int) -> bool:
    """Whether the copies-first rule's width takes a step (copies_first_reaches): one row, fused.tma, weights it
    streams, a model copies_first_from_hidden wide or wider."""
    return (rows == 1 and options.tma and tma_element_size(element_size)
            and hidden >= knobs.copies_first_from_hidden)


def copies_first_reaches(knobs: Knobs, kind: str, hidden: int, options, element_size: int, rows: int,
                         packed: bool) -> bool:
    """Whether the copies-first rule's width runs a product of `kind` as the copies-first kernel: in a step it takes
    (copies_first_width), the large kinds, copies_first_small_kinds and, from copies_first_o_from_hidden wide, O,
    where the kernel may run it (gluon_runs)."""
    wide_o = ("o",) if hidden >= knobs.copies_first_o_from_hidden else ()
    kinds = knobs.tma_large_kinds + knobs.copies_first_small_kinds + wide_o
    return (kind in kinds and copies_first_width(knobs, hidden, options, element_size, rows)
            and gluon_runs(kind, rows, packed))


def tma_element_size(element_size: int) -> bool:
    """Whether fused.tma streams weights of `element_size` bytes: 16-bit ones, as measured on a GPU (any, in Triton's
    interpreter)."""
    return element_size == 2 or interpreted()


def large_through_tma(knobs: Knobs, kind: str, hidden: int, options, element_size: int) -> bool:
    """Whether a product of `kind` with weights of `element_size` bytes streams through TMA by the large products'
    rule alone (tma_large_kinds, in a model large_rule_model takes), and so runs as tiles where the rules would slice
    it."""
    return kind in knobs.tma_large_kinds and large_rule_model(knobs, hidden, options, element_size)


def large_rule_model(knobs: Knobs, hidden: int, options, element_size: int) -> bool:
    """Whether a step is one the large products' rule applies to: fused.tma, weights it streams (tma_element_size),
    a model between tma_large_from_hidden and tma_from_hidden wide."""
    return (options.tma and tma_element_size(element_size)
            and knobs.tma_large_from_hidden <= hidden < knobs.tma_from_hidden)


def tma_stages(knobs: Knobs, product: Product) -> int:
    """Tiles in flight a program of `product` through TMA: tma_stages_wide where its programs pass one wave at
    tma_programs_per_sm an SM (what a program of tma_stages leaves room for) and fit one at
    tma_wide_programs_per_sm, else tma_stages (within one wave, or several waves either way)."""
    programs, sms = product.grid[0] * product.grid[1], sm_count(product.weight.device)
    wide = knobs.tma_programs_per_sm * sms < programs <= knobs.tma_wide_programs_per_sm * sms
    return knobs.tma_stages_wide if wide else knobs.tma_stages
