"""The device functions every fused kernel shares: programmatic dependent launch (PDL) and Hopper's bulk L2 prefetch.

PDL lets a kernel be scheduled while the one before it drains: each kernel calls `_pdl_wait` before it reads what its
predecessor wrote, and `_pdl_start` where it lets the next kernel launch (`Product`'s launch point: never before its
own wait, or a chain of kernels would launch, each waiting beside the one it waits for). What is computed is the same
wherever the next kernel launches: its own wait holds it until this one has finished.
"""
from __future__ import annotations

import triton
import triton.language as tl

from harness.kernels.triton_runtime import quicken_the_interpreter

quicken_the_interpreter()  # every fused kernel imports this module


@triton.jit
def _pdl_wait_launch(PDL: tl.constexpr, WAIT: tl.constexpr, LAUNCH: tl.constexpr):
    """PDL's wait where WAIT, then the next kernel let launch where LAUNCH (nothing where PDL is off)."""
    if PDL:
        if WAIT:
            tl.extra.cuda.gdc_wait()
        if LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    _pdl_wait_launch(PDL, False, True)


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    _pdl_wait_launch(PDL, True, False)


@triton.jit
def _prefetch_to_l2(W, first, nbytes):
    """Ask L2 for `nbytes` contiguous bytes of W from element `first` on: one Hopper bulk prefetch
    (cp.async.bulk.prefetch.L2, a copy engine's request: no registers, not waited for), issued by the program's
    thread 0 alone (one request a program, not one a thread)."""
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


def pdl_launch(pdl: bool) -> dict:
    """A kernel launch's options: PDL's wait and early launch in the kernel, and the launch that lets it overlap."""
    return dict(PDL=True, launch_pdl=True) if pdl else dict(PDL=False)
