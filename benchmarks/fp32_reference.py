"""What the fp32 reference costs step by step against teacher-forced in forwards, on one model in one process.

    python benchmarks/fp32_reference.py model=qwen3-30b-a3b bs=32 context_len=16 cache_len=256 [--rounds 2]

The job's own path to that point: the model as a job builds it, a prefill, a free run of plain eager (the tokens
a run would feed the references), the context K/V copied for the rows fp32 checks. Then, alternating, the fp32
decode of those rows fed those tokens a step at a time (the reference as it was) and in forwards over the known
tokens (as harness/measure/fidelity.py now computes it): the seconds each took, and how far apart their logits
are, against the largest logit and against bf16 eager's own error from fp32 (the unit of the bound a run is judged
by).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import models  # noqa: E402
from harness.clock import resolve_device, stopwatch  # noqa: E402
from harness.measure import context_check, fidelity, traces  # noqa: E402
from harness.measure.job import seeded_prompt  # noqa: E402
from harness.measure.timing import calls_for  # noqa: E402
from harness.modes.eager import EagerStepper  # noqa: E402
from common import run_config  # noqa: E402  (this folder's: run as a script)


@torch.inference_mode()
def main(overrides: list[str], rounds: int) -> None:
    cfg = run_config(*overrides)
    device = resolve_device(cfg.device)
    model = models.get_model(cfg.model, cfg.dtype.value, cfg.attn, device, cfg.seed).model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, device)
    run = EagerStepper(model, prompt, cfg.cache_len)
    tokens = traces.free_run(run, calls_for(run, context_check.VERIFY_TOKENS)).tokens
    context = fidelity._context_copy(model, run)
    print(f"{cfg.model.name} bs={cfg.bs} context={cfg.context_len} cache={cfg.cache_len}: fp32 checks "
          f"{context.rows} rows over {tokens.shape[0]} steps")
    plain = fidelity._decode_from(model, prompt, cfg, context, tokens).float()
    for round_index in range(rounds):
        ms: dict[str, float] = {}
        with fidelity.computed_in_fp32(model):
            with stopwatch(device, ms, "steps"):
                by_steps = fidelity._decode_from(model, prompt, cfg, context, tokens, dtype=torch.float32).float()
            with stopwatch(device, ms, "forwards"):
                forwards = fidelity._decode_from(model, prompt, cfg, context, tokens, dtype=torch.float32,
                                               step_by_step=False).float()
        apart = float((forwards - by_steps).abs().max())
        print(f"round {round_index}: step by step {ms['steps'] / 1e3:.2f} s, teacher-forced {ms['forwards'] / 1e3:.2f} s "
              f"({ms['steps'] / ms['forwards']:.1f}x); logits apart by {apart:.3g} (largest logit "
              f"{float(by_steps.abs().max()):.3g}; bf16 eager's own error from fp32 "
              f"{float((plain - by_steps).abs().max()):.3g})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args, rest = parser.parse_known_args()
    main(rest, args.rounds)
