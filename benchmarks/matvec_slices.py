"""Does a bs=1 product read HBM faster when each program loads its whole slice of K at once? `_matvec` alone, as
mode=fused plans it without fused.slices (64-column tensor-core tiles, the next tile in registers), against "slices":
a few rows of the weight (row-major) times a whole split of K, one load before the PDL wait, summed on CUDA cores, so
that all of a program's weight bytes are in flight together and the register file, not a loop, holds the loads.
Timed in CUDA graphs of launches with PDL on (each launch's loads overlap the one before's tail, as in the step), over
a ring of weight copies larger than L2 (so that no product reads from L2). On a GPU:
    python benchmarks/matvec_slices.py [model ...]
Prints for each product the fastest plans (µs a launch, bandwidth on the weight, error against fp32), then the tiles'.
"""
from __future__ import annotations

import itertools
import sys

import torch
import triton

from harness.clock import block_ms
from harness.config.fused import FusedConfig
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import Product, plan
from harness.kernels.fused.products import launch_product

# (n, k) of each product at bs=1; gate/up as one product of both halves
MODELS = {
    "llama-3.2-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                     "lm_head": (128256, 2048)},
    "qwen3-0.6b": {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
                   "lm_head": (151936, 1024)},
    "llama-3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
}
RING_BYTES = 160 << 20  # weight copies launched in turn: more than the H200's 50 MB L2 between two reads of one
REPLAYS = 20


def slice_plans(n: int, k: int):
    """(BN, BK, splits, warps) of the slices: BN rows, a split of BK columns (K's whole when one split)."""
    for bn, length, warps in itertools.product((2, 4, 8, 16), (512, 1024, 2048, 4096), (4, 8)):
        if length < k and k % length:
            continue
        bk, splits = (triton.next_power_of_2(k), 1) if length >= k else (length, k // length)
        if length > k and length // 2 >= k:
            continue
        if bn * bk // (warps * 32) <= KNOBS.slice_values_a_thread:  # a thread's share of the slice, as the step's
            yield bn, bk, splits, warps


def timed(n: int, k: int, product_of, label: str) -> tuple[float, str]:
    """µs a launch of x [1, k] @ w.T over a ring of weight copies, checked against fp32 on the first."""
    copies = max(2, -(-RING_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    products = [product_of(w) for w in weights]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    first = products[0]
    out = torch.zeros(first.splits, 1, n, device="cuda", dtype=torch.float32)

    def launch(product):
        launch_product(product, x, out, 1, pdl=True)

    launch(first)
    error = float((out.sum(0) - x.float() @ weights[0].float().T).abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for product in products:
            launch(product)
    graph.replay()
    us = block_ms(graph.replay, REPLAYS) * 1e3 / copies
    return us, f"{us:8.2f} µs {n * k * 2 / us / 1e3:6.0f} GB/s  err {error:.1e}  {label}"


def main(models: list[str]) -> None:
    for model in models:
        for name, (n, k) in MODELS[model].items():
            splittable = name not in ("gate_up", "lm_head")
            tiles = FusedConfig(slices=False)  # the plan at larger batches, and fused.slices=false's
            rows = [timed(n, k, lambda w: plan(w, tiles, KNOBS, splittable, 1, k), "tiles: " + str(plan(
                torch.empty(n, k, device="cuda", dtype=torch.bfloat16), tiles, KNOBS, splittable, 1, k)))]
            for bn, bk, splits, warps in slice_plans(n, k):
                if splits > 1 and not splittable:
                    continue
                rows.append(timed(n, k, lambda w: Product(w.contiguous(), n, k, bn, bk, splits, False, False, warps),
                                  f"slices {bn}x{bk}, {splits} splits, "
                                  f"{warps} warps, {triton.cdiv(n, bn) * splits} programs"))
            print(f"\n{model} {name} {n}x{k}:")
            for _, line in sorted(rows)[:6]:
                print(line)
            print("  ...", rows[0][1])


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
