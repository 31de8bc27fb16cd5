"""Per-layer decode attention on the GPU, each backend captured in a CUDA graph and replayed: one query token,
qwen3-0.6b's heads (16 q, 8 KV, d=128), bf16. Prints a markdown table for docs/context.md.

    python benchmarks/attention.py [--replays 200]
"""
from __future__ import annotations

import argparse
import statistics
import types

import torch

from harness.kernels import attention
from harness.measure.roofline import ceilings
from harness.clock import cuda_event_ms
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SHAPES = [(1, 1024, 1024), (1, 1280, 1034), (8, 16384, 160), (8, 16384, 16384), (8, 16640, 16522), (32, 33024, 32906)]
BACKENDS = {
    "transformers sdpa (repeat_kv + mask)": sdpa_attention_forward,
    "sdpa enable_gqa": attention.enable_gqa_attention,
    "sdpa packed rows": attention.packed_rows_attention,
    "flex": attention.flex_attention_forward,
    "triton-decode": attention.triton_decode_forward,
}
NO_MASK = (attention.flex_attention_forward, attention.triton_decode_forward)  # they cut at the position


def time_backend(fn, bs: int, slots: int, valid: int, replays: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(bs, 16, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(bs, 8, slots, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    mask = (torch.arange(slots, device="cuda") < valid).view(1, 1, 1, slots).expand(bs, 1, 1, slots)
    position_ids = torch.tensor([[valid - 1]], device="cuda")
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
    call = lambda: fn(module, q, k, v, None if fn in NO_MASK else mask,  # noqa: E731
                      scaling=128 ** -0.5, position_ids=position_ids)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return statistics.median(cuda_event_ms(graph.replay, replays)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=200)
    args = ap.parse_args()
    attention.use_flex(torch.device("cuda"))
    attention.use_triton_decode(torch.device("cuda"))
    bandwidth = ceilings(torch.device("cuda"))["copy_bytes_per_s"]
    print(f"| bs | cache | valid | {' | '.join(BACKENDS)} | valid-KV floor |")
    print("|---:|---:|---:|" + "---:|" * (len(BACKENDS) + 1))
    for bs, slots, valid in SHAPES:
        with torch.inference_mode():
            us = [time_backend(fn, bs, slots, valid, args.replays) for fn in BACKENDS.values()]
        floor_us = 2 * bs * 8 * valid * 128 * 2 / bandwidth * 1e6
        print(f"| {bs} | {slots} | {valid} | " + " | ".join(f"{t:.1f} µs" for t in us) + f" | {floor_us:.1f} µs |",
              flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
