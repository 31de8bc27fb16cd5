"""Does plain eager reproduce itself, and if not, which kernel varies? One model, one shape, one process.

    python benchmarks/eager_variation.py model=qwen3-0.6b bs=32 context_len=16384 [--passes 3] [--steps 16]

Where eager does not reproduce itself bit for bit, a graphed run cannot be judged against eager's own loop: its
check decodes eager again, twice or more (lockstep.exact), and at bs=32 and a long context that is most of a job's
verification. This decodes eager from one prefilled context `--passes` times, fed the same tokens, under
transformers' SDPA as dispatched (`default`) and restricted to each of torch's SDPA backends, and prints how far
each pass's logits are from the first's, with the attention and GEMM kernels one step launched.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import models  # noqa: E402
from harness.clock import resolve_device  # noqa: E402
from harness.measure import traces  # noqa: E402
from harness.measure.job import seeded_prompt  # noqa: E402
from harness.modes.eager import EagerStepper  # noqa: E402
from common import run_config  # noqa: E402  (this folder's: run as a script)

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def passes_apart(stepper, tokens: torch.Tensor, passes: int) -> list[float]:
    """Each later pass's largest logit difference from the first, every pass from the same context."""
    first, apart = None, []
    for _ in range(passes):
        stepper.rewind()
        logits = traces.forced(stepper, tokens).logits.float()
        if first is None:
            first = logits
        else:
            apart.append(float((logits - first).abs().max()))
    return apart


def kernels_of_one_step(stepper, device: torch.device) -> list[str]:
    """The CUDA kernels of one decode step that attend or multiply, by name, with their calls."""
    stepper.rewind()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        stepper.step()
        torch.cuda.synchronize(device)
    names: dict[str, int] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            names[event.name] = names.get(event.name, 0) + 1
    wanted = ("attn", "fmha", "flash", "cudnn", "gemm", "gemv", "splitk", "sm90", "cutlass", "reduce")
    return [f"{calls:4d} x {name[:110]}" for name, calls in sorted(names.items())
            if any(w in name.lower() for w in wanted)]


@torch.inference_mode()
def main(overrides: list[str], passes: int, steps: int) -> None:
    cfg = run_config(*overrides)
    device = resolve_device(cfg.device)
    model = models.get_model(cfg.model, cfg.dtype.value, "sdpa", device, cfg.seed).model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, device)
    stepper = EagerStepper(model, prompt, cfg.cache_len)
    tokens = traces.free_run(stepper, steps).tokens
    print(f"{cfg.model.name} bs={cfg.bs} context={cfg.context_len} cache={cfg.cache_len}: {passes} passes of "
          f"{steps} steps each, fed the same tokens from one context")
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
                apart = passes_apart(stepper, tokens, passes)
                kernels = kernels_of_one_step(stepper, device) if device.type == "cuda" else []
        except RuntimeError as err:  # a backend that cannot run this shape (a mask, a head size) says so
            print(f"{name:9s} not available here: {str(err).splitlines()[0][:160]}")
            continue
        verdict = "reproduces itself" if max(apart, default=0.0) == 0 else "VARIES"
        print(f"{name:9s} {verdict}: passes apart from the first by {', '.join(f'{a:.4g}' for a in apart)}")
        for line in kernels:
            print(f"          {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    args, rest = parser.parse_known_args()
    main(rest, args.passes, args.steps)
