"""harness/kernels/fused/copies_first.py: the Gluon kernel compiled for sm_90, its copies before the PDL wait."""
from __future__ import annotations

import pytest

from tests.support import compiled_for_the_gpu


COPIES_FIRST_COMPILE = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import mangle_type
from harness.kernels.fused.copies_first import GluonASTSource, _matvec_copies_first, descriptor, launch_arguments
# gate/up (normed, SwiGLU), down (split 8 ways, added atomically), lm_head (normed logits, the position bumped), QKV
# (layer 0's: the embedding's row; split 4 ways, normed partial sums) and O (split 8 ways, letting the next kernel
# launch at its wait), each on 4 stages; and, on 4 warps (the rule's), Qwen3-0.6B's gate/up in 32-column blocks and
# its down split 8 ways in 32-column blocks (3 tiles a split)
for x, out, n, k, splits, input, output, norm, bump, launch, bn, warps in (
        ("*fp32", "*bf16", 8192, 2048, 1, 0, 1, True, False, 1, 64, 8),
        ("*bf16", "*fp32", 2048, 8192, 8, 0, 3, False, False, 1, 64, 8),
        ("*fp32", "*fp32", 1024, 2048, 1, 0, 2, True, True, 1, 64, 8),
        ("*bf16", "*fp32", 3072, 2048, 4, 1, 0, True, False, 1, 64, 8),
        ("*bf16", "*fp32", 2048, 2048, 8, 0, 3, False, True, 0, 64, 8),
        ("*fp32", "*bf16", 6144, 1024, 1, 0, 1, True, False, 1, 32, 4),
        ("*bf16", "*fp32", 1024, 3072, 8, 0, 3, False, False, 1, 32, 4)):
    packed = descriptor(torch.zeros(bn * 16 * 8, 128, dtype=torch.bfloat16), bn, 128)
    sizes, consts = launch_arguments(bn, 128, n, k, splits, 4, n // 2 if output == 1 else n, input=input, norm=norm,
                                     bump=bump, output=output, launch=launch, pdl=True)
    types = dict(X=x, Ids="*i64", ResOut="*fp32", Gain="*bf16", Wdesc=mangle_type(packed), Out=out,
                 SquaresOut="*fp32", Bump="*i64", **dict.fromkeys(sizes, "i32"), eps="fp32",
                 **dict.fromkeys(consts, "constexpr"))
    sig = {name: types[name] for name in _matvec_copies_first.arg_names}
    ptx = triton.compile(GluonASTSource(_matvec_copies_first, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=warps)).asm["ptx"]
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    print(ptx.count("cp.async.bulk.tensor", 0, wait), ptx.count("cp.async.bulk.tensor", wait, launch),
          ptx.count("ld.global", 0, wait), -1 < wait < launch, ptx.count("cp.async.bulk.tensor", launch),
          ptx.count("atom.global") + ptx.count("red.global") > 0, consts["SPLIT_TILES"], sizes["k_per_split"])
"""


@pytest.mark.slow
def test_the_large_products_start_every_stage_copying_before_the_pdl_wait_and_read_their_input_after_it():
    """harness/kernels/fused/copies_first.py compiled for sm_90 (Triton's ahead-of-time compiler, no GPU): each
    program's four stages are copied before `griddepcontrol.wait`, the stages copied again in the loop after it, no
    load of the input (which the kernel before writes; at layer 0 the input id naming the embedding's row) before it;
    the next kernel let launch after the loop, or at the wait where the launch point says so (O's: every copy in the
    loop then comes after the launch); down's and O's splits add their sums atomically, whole tiles each (8 of 64,
    QKV's 4 of 16, Qwen3-0.6B's down 3 of 24); the rule's builds on 4 warps in 32-column blocks copy the same. A
    copy left after the wait, as Triton's pipeliner places `_matvec_tma`'s, would fail. What it computes is checked
    on the GPU (tests/gpu/test_fused.py)."""
    printed = compiled_for_the_gpu(COPIES_FIRST_COMPILE, timeout=900).split()
    assert printed == (["4", "1", "0", "True", "0", "False", "16", "2048"]
                       + ["4", "1", "0", "True", "0", "True", "8", "1024"]
                       + ["4", "1", "0", "True", "0", "False", "16", "2048"]
                       + ["4", "1", "0", "True", "0", "False", "4", "512"]
                       + ["4", "0", "0", "True", "1", "True", "2", "256"]
                       + ["4", "1", "0", "True", "0", "False", "8", "1024"]
                       + ["4", "1", "0", "True", "0", "True", "3", "384"])
