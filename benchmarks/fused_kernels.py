"""Where a fused decode step's time goes: each kernel of mode=fused's step, its time a call and a step, and the
bandwidth it reaches on the bytes it must read (weights; K/V of the valid prefix), from torch.profiler over replays
of the captured step; then the step's time by CUDA events and the GPU's idle share of it. With PDL on, kernels
overlap, so each also gets its share of the step's path: how far its end lies past the latest end before it, and
how long it ran beside the kernel before (path_times). On a CUDA GPU:
    python benchmarks/fused_kernels.py model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 [fused.pdl=false ...]
    python benchmarks/fused_kernels.py --knobs one_chunk_max_slots=512 model=...   # a variant's step (common.py)
"""
from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from common import fused_model_and_prompt, knobs_from, warm_fused_stepper
from harness.clock import cuda_event_ms

QKV, ATTENTION, O, GATE_UP, DOWN = ("qkv (norm, matvec)", "attention (rope, append, split-KV, merge)", "o_proj",
                                    "gate/up (norm, matvec, SiLU)", "down_proj")
STEPS = 50


def layer_kernels(decoder) -> tuple[str, ...]:
    """A layer's kernels in launch order, as the decoder plans them: the attention folded into one, or as three
    (fused.fold_attention=false, or past one chunk at bs=1 by attention_folded's rule)."""
    if decoder.folded:
        attention = (QKV, ATTENTION, O)
    else:
        attention = (QKV, "rope + K/V append", "attention split-KV", "attention merge", O)
    return attention + (GATE_UP, DOWN)


def weight_bytes(decoder) -> dict[str, float]:
    """Bytes each kernel reads a step of weights (the packed copies' padding is zeros it also reads)."""
    per = defaultdict(float)
    names = layer_kernels(decoder)
    for layer in decoder.layers:
        products = {QKV: layer.qkv, O: layer.o, GATE_UP: layer.gate_up, DOWN: layer.down}
        for name in names:
            if name in products:
                per[name] += products[name].n * products[name].k * products[name].weight.element_size()
    per["final norm + lm_head"] = decoder.lm_head.n * decoder.lm_head.k * decoder.lm_head.weight.element_size()
    return per


def kernel_times(stepper, per_step: int, layer_kernels: tuple[str, ...]) -> dict[str, list[tuple[float, float]]]:
    """Every launch's (start, end) in µs over STEPS replays, in launch order, by its place in the step."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            stepper.step()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    events = [e for e in events if not e.name.lower().startswith(("memcpy", "memset"))]
    assert len(events) == STEPS * per_step, f"{len(events)} kernels in {STEPS} steps, expected {per_step} a step"
    times = defaultdict(list)
    for i, event in enumerate(events):
        place = i % per_step
        name = "final norm + lm_head" if place == per_step - 1 else layer_kernels[place % len(layer_kernels)]
        times[name].append((event.time_range.start, event.time_range.end))
    return times


def path_times(ranges: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """For kernels' (start, end) in launch order: how far each one's end lies past the latest end before it (its share
    of the step's path, an idle gap before it included: under PDL a kernel that ends inside the one before adds
    nothing, and the shares sum to the span from the first start to the last end), and how long it ran beside the
    kernel before (its head start: 0 where it started after that one's end, as without PDL)."""
    shares, head_starts, latest_end, previous_end = [], [], None, None
    for start, end in ranges:
        shares.append(end - start if latest_end is None else max(0.0, end - latest_end))
        head_starts.append(0.0 if previous_end is None else max(0.0, min(previous_end, end) - start))
        latest_end = end if latest_end is None else max(latest_end, end)
        previous_end = end
    return shares, head_starts


def main(overrides: list[str], knobs=None) -> None:
    cfg, model, prompt = fused_model_and_prompt(overrides)
    with torch.inference_mode():
        stepper = warm_fused_stepper(model, prompt, cfg, knobs)
        step_ms = sorted(cuda_event_ms(stepper.step, STEPS))[STEPS // 2]  # the median step
        stepper.rewind()
        decoder = stepper.decoder
        times = kernel_times(stepper, decoder.kernels_per_step(), layer_kernels(decoder))
    report(cfg, stepper, times, step_ms)


def report(cfg, stepper, times: dict[str, list[tuple[float, float]]], step_ms: float) -> None:
    weights = weight_bytes(stepper.decoder)
    spans = {name: [end - start for start, end in ranges] for name, ranges in times.items()}
    in_order = sorted((r, name) for name, ranges in times.items() for r in ranges)
    shares, head_starts = path_times([r for r, _ in in_order])
    path, beside = defaultdict(float), defaultdict(float)
    for (_, name), share, head_start in zip(in_order, shares, head_starts):
        path[name] += share / STEPS
        beside[name] += head_start / STEPS
    busy_us = sum(map(sum, spans.values())) / STEPS
    step_us = step_ms * 1e3
    print(f"\n{cfg.label} ({stepper.tags['fused']}): {step_us:.1f} µs a step (median of {STEPS} replays, CUDA "
          f"events), {stepper.decoder.kernels_per_step()} kernels, GPU busy {busy_us:.1f} µs, idle "
          f"{1 - busy_us / step_us:.0%} (the kernels' durations summed: under PDL an overlap counts twice, and idle may "
          f"be negative); the path's shares sum to {sum(path.values()):.1f} µs a step under the profiler")
    print("| kernel | calls/step | µs/call | µs/step | share | GB/s on weights | path µs/step | path GB/s | "
          "beside the one before µs/call |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, durations in sorted(spans.items(), key=lambda kv: -sum(kv[1])):
        per_step_us, calls = sum(durations) / STEPS, len(durations)
        bandwidth = f"{weights[name] / (per_step_us * 1e3):.0f}" if name in weights else "-"
        path_bandwidth = f"{weights[name] / (path[name] * 1e3):.0f}" if name in weights and path[name] else "-"
        print(f"| {name} | {calls // STEPS} | {sum(durations) / calls:.2f} | {per_step_us:.1f} | "
              f"{per_step_us / busy_us:.0%} | {bandwidth} | {path[name]:.1f} | {path_bandwidth} | "
              f"{beside[name] * STEPS / calls:.2f} |")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--knobs"] and len(args) > 1:
        main(args[2:], knobs_from(args[1]))
    else:
        main(args)
