"""How many programs of each mode=fused product a Hopper SM holds at once, and how many weight bytes a wave of them
has in flight: every product of a model's step planned as a GPU's rules plan it, compiled for sm_90 by Triton's
ahead-of-time compiler (no GPU needed), its registers and shared memory read from ptxas's output (cuobjdump
-res-usage, the tool Triton ships) and its 16-byte loads before the PDL wait from the PTX, and an H200's per-SM
limits applied; each compiled with its arguments specialised as Triton's JIT specialises the step's launch. A product
whose tiles stream through TMA (fused.tma) is `_matvec_tma`, compiled the same way: its shared memory is its stages'
tiles, and it asks for no weights before its wait (the copies start after it). On any machine:
    python benchmarks/fused_occupancy.py model=llama-3.2-1b [bs=1 ...]
    python benchmarks/fused_occupancy.py --knobs copies_first_warps=8 model=qwen3-0.6b   # a variant's plan
The GPU decides what the compiler does not say (how the programs of two kernels share an SM under PDL, how fast a
wave drains); this says what the plans allow: the programs a wave, the waves a product, and the weights a wave asks
for before its PDL wait.
"""
from __future__ import annotations

import os

if __name__ == "__main__":  # the kernels compiled for the GPU, not run in Triton's interpreter (set before
    os.environ["TRITON_INTERPRET"] = "0"  # harness.kernels is imported: Triton reads it where a kernel is defined)
import math  # noqa: E402
import re
import subprocess
import sys
import tempfile
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type

from common import knobs_from
from harness.cli.precheck import compose_single_run
from harness.kernels.fused import copies_first, plan as fused_plan
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import SPLITTABLE_KINDS, Product, launch_point, plan, plan_swiglu
from harness.kernels.fused.products import (ADD, LOGITS, PARTIALS, PLAIN, SWIGLU, _matvec, _matvec_tma,
                                            product_constants, product_sizes)

# An H200's (and H100's) streaming multiprocessor, sm_90: CUDA's occupancy limits, and the SMs of either
REGISTERS_AN_SM, THREADS_AN_SM, PROGRAMS_AN_SM, SHARED_BYTES_AN_SM = 65536, 2048, 32, 228 * 1024
SHARED_BYTES_RESERVED_A_PROGRAM = 1024  # the runtime's share of each resident block's shared memory
REGISTER_UNIT = 256  # a warp's registers are allocated in units of this many
SM90, SMS = GPUTarget("cuda", 90, 32), fused_plan.HOPPER_SMS
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

# Each kind's input, output and pointer types as FusedDecoder._product launches it, past the first layer
POINTERS = dict(X="*fp32", ResOut="*fp32", Ids="*i64", Gain="*bf16", W="*bf16", Out="*fp32", SquaresOut="*fp32",
                Bump="*i64")
LAUNCHED_AS = {  # kind: (X, Out, norm, output, bump)
    "qkv": ("*fp32", "*fp32", True, PARTIALS, False),
    "o": ("*bf16", "*fp32", False, ADD, False),
    "gate_up": ("*fp32", "*bf16", True, SWIGLU, False),
    "down": ("*bf16", "*fp32", False, ADD, False),
    "lm_head": ("*fp32", "*fp32", True, LOGITS, True),
}


def programs_an_sm(registers: int, warps: int, shared_bytes: int) -> int:
    """How many programs of `warps` warps, `registers` a thread and `shared_bytes` of shared memory one SM holds."""
    by_threads = THREADS_AN_SM // (32 * warps)
    registers_a_warp = math.ceil(registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
    by_registers = REGISTERS_AN_SM // registers_a_warp // warps
    by_shared = SHARED_BYTES_AN_SM // (shared_bytes + SHARED_BYTES_RESERVED_A_PROGRAM)
    return min(by_threads, by_registers, by_shared, PROGRAMS_AN_SM)


def step_products(model_cfg, rows: int, options, knobs) -> dict[str, Product]:
    """Each kind's product of one layer (and lm_head) as a GPU's rules plan it for `rows` batch rows (planned
    here, with Triton's interpreter taken as off: the interpreter's plans are its own), over bf16 weights of the
    model's shapes on the meta device: their values are never read, and packing an 8B model's real ones took seconds
    of copies."""
    hidden, heads, kv_heads = model_cfg.hidden_size, model_cfg.num_attention_heads, model_cfg.num_key_value_heads
    d, inter = model_cfg.head_dim, model_cfg.intermediate_size

    def weight(n: int, k: int) -> torch.Tensor:
        return torch.empty(n, k, dtype=torch.bfloat16, device="meta")

    with mock.patch.object(fused_plan, "interpreted", lambda: False):
        planned = lambda kind, n, k: plan(weight(n, k), options, knobs, kind in SPLITTABLE_KINDS, rows, hidden,
                                          kind=kind)
        return {"qkv": planned("qkv", (heads + 2 * kv_heads) * d, hidden), "o": planned("o", hidden, heads * d),
                "gate_up": plan_swiglu(weight(inter, hidden), weight(inter, hidden), options, knobs, rows, hidden),
                "down": planned("down", hidden, inter), "lm_head": planned("lm_head", model_cfg.vocab_size, hidden)}


def launch_sizes(kind: str, product: Product, rows: int) -> dict[str, int]:
    """The integers `product`'s `_matvec` is launched with in the step (launch_product's, x's row stride first): x
    is a whole row of K wide, and gate/up's output half its columns."""
    sizes = product_sizes(product, rows, product.n // 2 if kind == "gate_up" else product.n, eps=0.0)
    del sizes["eps"]  # a float: the JIT does not specialise it
    return dict(x_row=product.k, **sizes, prefetch_ahead=product.prefetch_ahead)


def specialised(sizes: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """What Triton's JIT makes of a launch's integers: those equal to 1 compiled in as constants, and the names of
    those it marks as multiples of 16 (the pointers too: a torch allocation is), which lets it vectorise loads."""
    ones = {name: 1 for name, value in sizes.items() if value == 1}
    return ones, [*POINTERS, *(name for name, value in sizes.items() if value != 1 and value % 16 == 0)]


def resources(kind: str, product: Product, rows: int, pdl: bool = True) -> tuple[int, int, int]:
    """(registers a thread, shared bytes a program, 16-byte loads a thread issues before its PDL wait) of
    `product`'s kernel (`_matvec`, or `_matvec_tma` where its tiles stream through TMA) as ptxas compiles it for
    sm_90, its arguments specialised as the JIT specialises the step's (launch_product's)."""
    if product.copies_first:
        return copies_first_resources(kind, product, rows, pdl)
    x, out, norm, output, bump = LAUNCHED_AS[kind]
    constants = product_constants(product, rows, PLAIN, output, norm, bump, pdl)
    warps = constants.pop("num_warps")
    constants.pop("launch_pdl", None)
    types = {**POINTERS, "X": x, "Out": out, "eps": "fp32"}
    if product.descriptor is None:
        kernel = _matvec
        constants.update(ONE_TILE=product.one_tile)
    else:  # the descriptor's type names its tile: what the JIT would take from the descriptor itself
        kernel = _matvec_tma
        constants.update(STAGES=product.stages)
        types["Wdesc"] = mangle_type(product.descriptor)
    sizes = {name: value for name, value in launch_sizes(kind, product, rows).items() if name in kernel.arg_names}
    compiled = compiled_for_sm90(ASTSource, kernel, types, sizes, constants, warps)
    ptx = compiled.asm["ptx"]
    before_wait = ptx[:ptx.find("griddepcontrol.wait")] if pdl else ptx
    wide_loads = len(re.findall(r"ld\.global[.\w]*\.v4\.(?:b32|u32|f32)", before_wait))
    return cubin_registers(compiled), compiled.metadata.shared, wide_loads


def copies_first_resources(kind: str, product: Product, rows: int, pdl: bool) -> tuple[int, int, int]:
    """`resources` of a product run as copies_first.py's Gluon kernel, its arguments as its launch passes them
    (none of its loads before the wait is a 16-byte load: its copies there are the copy engine's)."""
    x, out, norm, output, bump = LAUNCHED_AS[kind]
    sizes, constants = copies_first.launch_arguments(product.bn, product.bk, product.n, product.k, product.splits,
                                                     product.stages, launch_sizes(kind, product, rows)["out_cols"],
                                                     input=PLAIN, norm=norm, bump=bump, output=output,
                                                     launch=launch_point(product), pdl=pdl)
    types = {**POINTERS, "X": x, "Wdesc": mangle_type(product.descriptor), "Out": out, "eps": "fp32"}
    compiled = compiled_for_sm90(copies_first.GluonASTSource, copies_first._matvec_copies_first, types, sizes,
                                 constants, product.warps)
    return cubin_registers(compiled), compiled.metadata.shared, 0


def compiled_for_sm90(source, kernel, types: dict, sizes: dict[str, int], constants: dict, warps: int):
    """`kernel` compiled for sm_90 through `source` (Triton's ASTSource, or Gluon's): `types` the types of its
    pointers (those it takes) and floats, its integers `sizes` specialised as the JIT specialises a launch's."""
    ones, aligned = specialised(sizes)
    constants = {**constants, **ones}
    every = {**types, **dict.fromkeys(sizes, "i32"), **dict.fromkeys(constants, "constexpr")}
    signature = {name: every[name] for name in kernel.arg_names}
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned if name in kernel.arg_names}
    return triton.compile(source(kernel, signature, constants, attrs=attrs), target=SM90, options=dict(num_warps=warps))


def cubin_registers(compiled) -> int:
    """Registers a thread of a compiled kernel, as ptxas allocated them (cuobjdump -res-usage)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", usage).group(1))


def occupancy_rows(products: dict[str, Product], rows: int) -> list[dict]:
    """A row a product: its plan, resources, programs an SM, waves and the weights a full wave holds."""
    table = []
    for kind, product in products.items():
        programs = product.grid[0] * product.grid[1]
        registers, shared, wide_loads = resources(kind, product, rows)
        per_sm = programs_an_sm(registers, product.warps, shared)
        at_once = min(programs, per_sm * SMS)
        if product.copies_first:  # copies_first.py's programs copy their stages' tiles before the wait
            first_bytes = product.bn * product.bk * 2 * min(product.stages,
                                                            triton.cdiv(product.k_tiles, product.splits))
        elif product.descriptor is not None:  # `_matvec_tma`'s copies come after it (its loop's)
            first_bytes = 0
        else:  # a tile or slice loaded before the wait
            first_bytes = product.bn * min(product.bk, triton.cdiv(product.k, product.splits)) * 2
        table.append(dict(kind=kind, plan=str(product), programs=programs, registers=registers, shared=shared,
                          wide_loads=wide_loads, per_sm=per_sm, waves=programs / (per_sm * SMS),
                          wave_mb=at_once * first_bytes / 1e6, weight_mb=product.n * product.k * 2 / 1e6))
    return table


def print_table(label: str, table: list[dict]) -> None:
    print(f"\n{label}")
    print("| product | plan | programs | registers a thread | shared bytes | 16-byte loads a thread before the wait "
          "| programs an SM | waves | MB a wave asks before its wait | MB of weights |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in table:
        print(f"| {row['kind']} | {row['plan']} | {row['programs']} | {row['registers']} | {row['shared']} | "
              f"{row['wide_loads']} | {row['per_sm']} | {row['waves']:.2f} | {row['wave_mb']:.1f} | "
              f"{row['weight_mb']:.1f} |")


def main(overrides: list[str], knobs=KNOBS) -> None:
    cfg = compose_single_run(["mode=fused", *overrides])
    print(f"{cfg.label}: Triton {triton.__version__}, compiled for sm_90")
    print_table("the rules" if knobs == KNOBS else "the knobs given", occupancy_rows(
        step_products(cfg.model, cfg.bs, cfg.fused, knobs), cfg.bs))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--knobs"] and len(args) > 1:
        main(args[2:], knobs_from(args[1]))
    else:
        main(args)
