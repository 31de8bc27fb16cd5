"""The article's section-6 loop, minimal and standalone, timed in the same process as the harness.

    python benchmarks/reference_loop.py [--rounds 3] [--bs 1] [--cache-len 256] [--context-len 16]

The reference is the article's method as transformers 5.x allows it (no cache_position: the
StaticCache advances its own device-side position): prefill, 10 eager warm-up steps, 3 warm-ups on a
side stream, capture, reset, prefill again, then 128 replays, each timed with a pair of CUDA events.
Both loops decode the same random-weight Qwen3-0.6B (built once) from the same prompt; rounds
alternate reference and harness so that clock drift hits both. The harness's median must be within
3% of the reference's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import StaticCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import models  # noqa: E402
from harness.measure.job import measure, seeded_prompt  # noqa: E402
from harness.modes.base import CACHE_KWARG  # noqa: E402
from common import run_config  # noqa: E402  (this folder's: run as a script)

NUM_DECODE_TOKENS = 128
WARMUP_STEPS = 10


@torch.inference_mode()
def reference_graphed(model, input_ids: torch.Tensor, max_cache_len: int) -> list[float]:
    """The article's run_graphed(), less the tokenizer and the file output."""
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)

    def prefill():
        return model(input_ids=input_ids, **{CACHE_KWARG: cache}, use_cache=True).logits[:, -1:, :].argmax(dim=-1)

    next_tokens = prefill()
    for _ in range(WARMUP_STEPS):
        out = model(input_ids=next_tokens, **{CACHE_KWARG: cache}, use_cache=True)
        next_tokens = out.logits[:, -1:, :].argmax(dim=-1)
    torch.cuda.synchronize()

    static_input_ids = next_tokens.clone()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(input_ids=static_input_ids, **{CACHE_KWARG: cache}, use_cache=True)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = model(input_ids=static_input_ids, **{CACHE_KWARG: cache}, use_cache=True)
    static_output_logits = out.logits

    cache.reset()
    static_input_ids.copy_(prefill())
    torch.cuda.synchronize()

    events_pair = []
    for _ in range(NUM_DECODE_TOKENS - 1):
        step_start = torch.cuda.Event(enable_timing=True)
        step_end = torch.cuda.Event(enable_timing=True)
        step_start.record()
        g.replay()
        step_end.record()
        events_pair.append((step_start, step_end))
        next_tokens = static_output_logits[:, -1:, :].argmax(dim=-1)
        static_input_ids.copy_(next_tokens)
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in events_pair]


@torch.inference_mode()
def reference_eager(model, input_ids: torch.Tensor, max_cache_len: int) -> list[float]:
    """An independent eager loop: the model called once per token, each call between two CUDA events."""
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    next_tokens = model(input_ids=input_ids, **{CACHE_KWARG: cache}, use_cache=True).logits[:, -1:, :].argmax(dim=-1)
    for _ in range(WARMUP_STEPS):
        next_tokens = model(input_ids=next_tokens, **{CACHE_KWARG: cache}, use_cache=True).logits[:, -1:, :].argmax(dim=-1)
    torch.cuda.synchronize()
    events_pair = []
    for _ in range(NUM_DECODE_TOKENS - 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        logits = model(input_ids=next_tokens, **{CACHE_KWARG: cache}, use_cache=True).logits
        end.record()
        events_pair.append((start, end))
        next_tokens = logits[:, -1:, :].argmax(dim=-1)
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in events_pair]


def compare(name: str, reference_loop, cfg, model, prompt, rounds: int) -> None:
    """Alternate the reference loop and the harness, `rounds` times; their medians must agree within 3%."""
    ref, har = [], []
    for r in range(rounds):
        t = time.perf_counter()
        ref.append(statistics.median(reference_loop(model, prompt, cfg.cache_len)))
        har.append(measure(cfg).metrics["step_ms_median"])
        print(f"{name} round {r}: reference {ref[-1]:.4f} ms/step, harness {har[-1]:.4f} ms/step "
              f"({time.perf_counter() - t:.1f} s)", flush=True)
    ratio = statistics.median(har) / statistics.median(ref)
    print(f"{name}: {torch.cuda.get_device_name()} bs={cfg.bs} cache_len={cfg.cache_len}: reference median "
          f"{statistics.median(ref):.4f} ms/step, harness median {statistics.median(har):.4f} ms/step, "
          f"harness/reference = {ratio:.4f} ({'within' if abs(ratio - 1) <= 0.03 else 'OUTSIDE'} 3%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--cache-len", type=int, default=256)
    ap.add_argument("--context-len", type=int, default=16)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("reference_loop.py needs a CUDA GPU")

    overrides = ("model=qwen3-0.6b", f"bs={args.bs}", f"cache_len={args.cache_len}", f"context_len={args.context_len}",
                 f"decode_tokens={NUM_DECODE_TOKENS}", f"warmup={WARMUP_STEPS}")
    cfg = run_config(*overrides, "mode=graphed", "repeats=1")
    device = torch.device("cuda")
    model = models.get_model(cfg.model, "bf16", "sdpa", device, cfg.seed).model
    prompt = seeded_prompt(args.bs, args.context_len, model.config.vocab_size, cfg.seed, device)

    compare("graphed", reference_graphed, cfg, model, prompt, args.rounds)
    # every speedup divides by eager: the harness's eager must match an independent eager loop too
    compare("eager", reference_eager, run_config(*overrides, "mode=eager", "repeats=1"), model, prompt, args.rounds)


if __name__ == "__main__":
    main()
