"""Which plan of mode=fused's step is faster: each variant's step captured in one process on one GPU, then timed in
alternating blocks (forward then backward order, round after round), so that a drift of the GPU falls on every
variant alike. A variant is a set of knobs (harness/kernels/fused/knobs.py) handed to the planner, and overrides of
the run's config; the first variant is the rules. On a CUDA GPU:
    python benchmarks/fused_variants.py --variant one_chunk_max_slots=512 \
        --variant attention_programs=128,unfolded_attention_programs=64 model=llama-3.2-1b bs=1 context_len=32 \
        cache_len=16384
    python benchmarks/fused_variants.py --study-window model=llama-3.2-1b bs=1 context_len=32 cache_len=16384
`--study-window` times the public megakernel study's scope: one replay of 127 steps with the argmax inside (the
variant), against one step a replay (the first), each from the context as the study times it.
Prints each variant's median ms/step over the rounds, its spread, and its ratio to the first with a 95% interval
from a bootstrap over rounds that keeps each round's pair (harness ab's statistic, harness/measure/stats.py).
"""
from __future__ import annotations

import statistics
import sys

import torch

from common import against_first, fused_model_and_prompt, knobs_from, step_ms, warm_fused_stepper
from harness.cli.precheck import compose_single_run
from harness.kernels.fused.knobs import KNOBS

STEPS, ROUNDS = 127, 12


def main(overrides: list[str], variants: list[tuple[str, list[str], object]]) -> None:
    cfg, model, prompt = fused_model_and_prompt(overrides)
    with torch.inference_mode():
        steppers = [warm_fused_stepper(model, prompt, compose_single_run(["mode=fused", *overrides, *extra]), knobs)
                    for _, extra, knobs in variants]
        times: list[list[float]] = [[] for _ in variants]
        for round_ in range(ROUNDS):
            order = range(len(variants)) if round_ % 2 == 0 else reversed(range(len(variants)))
            for i in order:
                times[i].append(step_ms(steppers[i], STEPS))
    print(f"\n{cfg.label}: {ROUNDS} rounds of {STEPS} steps a variant, alternating")
    print("| variant | plan | median ms/step | min–max | vs first (95% interval, rounds paired) |")
    print("|---|---|---:|---:|---:|")
    for (name, *_), stepper, spans in zip(variants, steppers, times):
        print(f"| {name} | {stepper.tags['fused_plan']} | {statistics.median(spans):.4f} | "
              f"{min(spans):.4f}–{max(spans):.4f} | {against_first(times[0], spans)} |")


def parse(args: list[str]) -> tuple[list[str], list[tuple[str, list[str], object]]]:
    """The config's overrides and the variants: the rules first, then each `--variant KNOBS`, or the study's scope."""
    variants, overrides = [("the rules", [], KNOBS)], []
    while args:
        if args[0] == "--variant" and len(args) > 1:
            variants.append((args[1], [], knobs_from(args[1])))
            args = args[2:]
        elif args[0] == "--study-window":
            variants = [("one step a replay, the argmax outside the graph", ["graph_steps=1"], KNOBS),
                        ("one replay of 127 steps, the argmax inside", ["graph_steps=127"], KNOBS)]
            args = args[1:]
        else:
            overrides.append(args.pop(0))
    return overrides, variants


if __name__ == "__main__":
    main(*parse(sys.argv[1:]))
