"""Where a fused decode step's time goes: each kernel of mode=fused's step, its time a call and a step, and the
bandwidth it reaches on the bytes it must read (weights; K/V of the valid prefix), from torch.profiler over replays
of the captured step; then the step's time by CUDA events and the GPU's idle share of it. With PDL on, kernels
overlap, so each also gets its share of the step's path: how far its end lies past the latest end before it, and
how long it ran beside the kernel before (path_times). On a CUDA GPU:
    python benchmarks/fused_kernels.py model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 [fused.pdl=false ...]
    python benchmarks/fused_kernels.py --variant attention:1 model=...   # the step of benchmarks/fused_prefetch.py's
                                                     # --set attention variant 1: its module constants and overrides
"""
from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from harness.clock import cuda_event_ms
from harness.cli.precheck import compose_single_run
from harness.measure.job import seeded_prompt
from harness.models import get_model
from harness.modes.fused import FusedMode

QKV, ATTENTION, O, GATE_UP, DOWN = ("qkv (norm, matvec)", "attention (rope, append, split-KV, merge)", "o_proj",
                                    "gate/up (norm, matvec, SiLU)", "down_proj")
STEPS = 50


def layer_kernels(decoder) -> tuple[str, ...]:
    """A layer's kernels in launch order, as the decoder plans them: the attention folded into one, or as three
    (fused.fold_attention=false, or past one chunk at bs=1 by fused_decode.attention_folded's rule)."""
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


def fused_model_and_prompt(overrides: list[str]):
    """The config, the model (on the GPU) and the seeded prompt that `python -m harness mode=fused ...` builds."""
    cfg = compose_single_run(["mode=fused", *overrides])
    device = torch.device("cuda")
    model = get_model(cfg.model, cfg.dtype.value, cfg.attn, device, cfg.seed).model
    return cfg, model, seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, device)


def warm_fused_stepper(model, prompt, cfg, steps: int = 10):
    """mode=fused's captured stepper for the run, restarted from the prompt and replayed `steps` times (call under
    torch.inference_mode)."""
    stepper = FusedMode().prepare(model, prompt, cfg)
    stepper.restart(prompt)
    for _ in range(steps):
        if stepper.feeds_itself:  # a graph of several steps: replays on from one another could pass the cache
            stepper.rewind()
        stepper.step()
    return stepper


def main(overrides: list[str]) -> None:
    cfg, model, prompt = fused_model_and_prompt(overrides)
    with torch.inference_mode():
        stepper = warm_fused_stepper(model, prompt, cfg)
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


def variant_overrides(spec: str) -> list[str]:
    """`--variant SET:I`: variant I of benchmarks/fused_prefetch.py's set SET, its module constants set in
    fused_decode (every other at its default); returns the overrides it adds to the command line's."""
    import fused_prefetch  # this folder's; imported here because it imports this module

    name, _, index = spec.partition(":")
    variants = fused_prefetch.SETS.get(name)
    if variants is None or not index.isdigit() or int(index) >= len(variants):
        sys.exit(f"--variant {spec}: give SET:I, a set of benchmarks/fused_prefetch.py "
                 f"({', '.join(fused_prefetch.SETS)}) and the index of one of its variants")
    label, extra, constants = variants[int(index)]
    fused_prefetch.set_constants(constants)
    print(f"variant {spec}: {label}")
    return list(extra)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--variant"]:
        args = args[2:] + variant_overrides(" ".join(args[1:2]))
    main(args)
