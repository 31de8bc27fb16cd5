"""Which tile runs mode=fused's matrix-vector products fastest: `_matvec` alone (a plain bf16 input, fp32 partial sums
out), timed over CUDA-graph replays of 10 launches, for Llama-3.2-1B's four per-layer products, at the batch rows
given, over tile shapes on tensor cores (the weight tile as the MMA's left operand) and on CUDA cores. On a GPU:
    python benchmarks/matvec_tiles.py 1 2 8 32
Prints the fastest shapes for each product and rows, their bandwidth on the weight, and the error against fp32.
(The weights are read from HBM where they exceed the 50 MB L2, from L2 where they fit: qkv and o read faster here
than inside a step.)"""
from __future__ import annotations

import itertools
import sys

import torch

from harness.clock import block_ms
from harness.kernels.fused.plan import Product, pack
from harness.kernels.fused.products import launch_product

PRODUCTS = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "down_proj": (2048, 8192), "gate/up": (16384, 2048)}
TENSOR_CORE = [(bn, bk, splits, 4, True) for bn, bk, splits in itertools.product((32, 64, 128), (64, 128, 256), (1, 2, 4, 8))]
CUDA_CORE = [(bn, bk, splits, warps, False) for bn, bk, splits, warps in itertools.product((8, 16, 32), (256, 512), (1, 2, 4), (2, 4))]
LAUNCHES, REPLAYS = 10, 5


def time_product(n: int, k: int, rows: int, bn: int, bk: int, splits: int, warps: int, dot: bool) -> tuple[float, float]:
    """(µs a launch, max error against fp32) of x [rows, k] @ w.T, w [n, k] packed in bn x bk tiles."""
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(splits, rows, n, device="cuda", dtype=torch.float32)
    product = Product(pack(weight, bn, bk), n, k, bn, bk, splits, dot, True, warps)

    def launch():
        launch_product(product, x, out, rows)

    launch()
    error = float((out.sum(0) - x.float() @ weight.float().T).abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            launch()
    graph.replay()
    return block_ms(graph.replay, REPLAYS) * 1e3 / LAUNCHES, error


def main(batch_rows: list[int]) -> None:
    for rows, (name, (n, k)) in itertools.product(batch_rows, PRODUCTS.items()):
        timed = []
        for bn, bk, splits, warps, dot in TENSOR_CORE + (CUDA_CORE if rows <= 4 else []):
            if k % (splits * bk) == 0:
                us, error = time_product(n, k, rows, bn, bk, splits, warps, dot)
                timed.append((us, n * k * 2 / us / 1e3, error, bn, bk, splits, warps, "tensor" if dot else "CUDA"))
        print(f"rows={rows} {name} {n}x{k}: fastest")
        for row in sorted(timed)[:4]:
            print("  %.2f µs  %.0f GB/s  error %.2g  BN=%d BK=%d splits=%d warps=%d  %s cores" % row)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 8])
