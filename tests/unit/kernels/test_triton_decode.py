"""harness/kernels/triton_decode.py: the split-KV kernels over the valid prefix (Triton's interpreter), and compiled
ahead of time for sm_90."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.kernels import attention
from tests.support import compiled_for_the_gpu
from tests.unit.kernels.support import CPU


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


@pytest.mark.parametrize("bs, heads, kv_heads, slots, position", [
    (1, 16, 8, 1280, 1033), (3, 4, 2, 256, 0), (3, 4, 2, 256, 63), (3, 4, 2, 256, 64), (2, 8, 1, 512, 300),
    (2, 4, 4, 128, 127),
    # one KV head, 512 slots, 8 chunks of 64 slots: each edge of a block and chunk (a chunk holding the newest
    # token alone at 128, 192, 448); from 448 on the 8th chunk is in use (448: the newest token alone in it), so
    # a merge that dropped its last chunk fails at 448, 449 and 511
    *((1, 4, 1, 512, p) for p in (1, 62, 63, 64, 65, 128, 129, 192, 193, 448, 449, 511))])
@pytest.mark.slow
def test_triton_decode_reads_the_valid_prefix_only(bs, heads, kv_heads, slots, position):
    """Split-KV over the valid prefix, chunks merged: SDPA's answer over slots [0, position] alone, for
    groups of 1 to 8 query heads per KV head, a first slot, a chunk's edge, a whole cache."""
    attention.use_triton_decode(CPU)  # Triton's interpreter
    from harness.kernels.triton_decode import splits_for

    g = torch.Generator().manual_seed(position)
    q = torch.randn(bs, heads, 1, 16, generator=g)
    k, v = (torch.randn(bs, kv_heads, slots, 16, generator=g) for _ in range(2))
    k[:, :, position + 1:], v[:, :, position + 1:] = 1e4, -1e4
    expected = F.scaled_dot_product_attention(q, k[:, :, :position + 1], v[:, :, :position + 1], enable_gqa=True)
    got = attention.triton_decode_op(q, k, v, torch.tensor(position), 0.25)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert splits_for(bs, kv_heads, slots) > 1 or bs * kv_heads >= 132  # the chunks are what is tested


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.slow
def test_triton_decode_in_half_precision_on_a_cpu_computes_in_fp32(dtype):
    """Triton's interpreter multiplies bf16 and fp16 wrongly (errors of ~1e10 seen): there the kernel widens to
    fp32, so a CPU run at the default dtype gets SDPA's answer to the dtype's rounding."""
    attention.use_triton_decode(CPU)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 1, 64, generator=g)
    k, v = (torch.randn(2, 2, 512, 64, generator=g) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k[:, :, :301], v[:, :, :301], enable_gqa=True)
    got = attention.triton_decode_op(q.to(dtype), k.to(dtype), v.to(dtype), torch.tensor(300), 0.125)
    assert got.dtype == dtype and (got.float() - expected).abs().max() < 0.02


AOT_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from harness.kernels.triton_decode import _merge, split_kv_chunk

ints = ["q_row", "q_head", "k_row", "k_head", "k_slot", "v_row", "v_head", "v_slot"]
for group in (2, 4):  # qwen3-0.6b/1.7b, qwen3-4b/8b and llama
    sig = dict(Q="*bf16", K="*bf16", V="*bf16", Pos="*i64", Acc="*fp32", M="*fp32", L="*fp32", scale="fp32",
               **dict.fromkeys(ints, "i32"), **dict.fromkeys(["GROUP", "GROUP_PAD", "D", "BLOCK_N", "SPLITS", "IEEE"], "constexpr"))
    consts = dict(GROUP=group, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=32, IEEE=False)
    print("split_kv", len(triton.compile(ASTSource(split_kv_chunk, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]))
sig = dict(Acc="*fp32", M="*fp32", L="*fp32", Out="*bf16", o_row="i32", o_head="i32", HEADS="constexpr", D="constexpr",
           SPLITS="constexpr")
print("merge", len(triton.compile(ASTSource(_merge, sig, dict(HEADS=16, D=128, SPLITS=32)), target=GPUTarget("cuda", 90, 32)).asm["ptx"]))
"""


@pytest.mark.slow
def test_triton_decode_compiles_for_the_h200():
    """The interpreter checks the arithmetic; Triton's own compiler, run ahead of time for sm_90 (no GPU
    needed), checks that the kernels build as a GPU runs them (bf16, head_dim 128)."""
    printed = compiled_for_the_gpu(AOT_COMPILE).split()
    assert printed[0::2] == ["split_kv", "split_kv", "merge"] and all(int(n) > 10_000 for n in printed[1::2])
