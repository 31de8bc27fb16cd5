"""A run proves its decode against the computation it claims to equal, after its timed loop.

- Exact modes (eager, graphed, bucketed) run eager's own kernels. Against a plain eager stepper with the
  same rows (a bucket's padding rows included), every logit of every row must be equal at every verified
  step, and the timed loop's own tokens (kept on the device) must equal the reference's free-running
  tokens at the same positions. A bucketed run's agreement with the unpadded batch is logged beside it.
- Inexact modes (Inductor's kernels) and attention backends other than `sdpa` round differently. They are
  judged teacher-forced against an fp32 eager decode of the same model (sdpa attention) and prompt: their
  largest logit error against fp32 may be at most INEXACT_BOUND times the error of this dtype's plain
  eager decode against fp32, and a token may differ from fp32's only where fp32's top-2 logits are closer
  than twice the measured error.
"""
from __future__ import annotations

import copy

import torch

from harness.modes.eager import EagerStepper
from harness.timing import advance, calls_for

VERIFY_TOKENS = 32  # steps compared logit by logit
INEXACT_BOUND = 4.0  # an inexact run's error against fp32, in units of plain eager's own (docs/benchmarks.md)
FP32_FLOOR = 1e-5  # where eager's own error is 0 (an fp32 run), rounding of this size relative to the logits


def verify(model, prompt, stepper, cfg, exact: bool, timed_tokens: torch.Tensor) -> tuple[dict, str | None]:
    """Metrics of the checks that apply, and the failure reason of the first that failed (or None)."""
    metrics, failure = {}, None
    if exact:
        failure = _exact(model, prompt, stepper, cfg, timed_tokens, metrics)
    if not exact or cfg.attn.value != "sdpa":
        failure = failure or _against_fp32(model, prompt, stepper, cfg, metrics)
    metrics["verified"] = float(failure is None)
    return metrics, failure


def _exact(model, prompt, stepper, cfg, timed_tokens, metrics) -> str | None:
    reference = EagerStepper(model, prompt, cfg.cache_len, rows=stepper.rows)
    stepper.restart(prompt)
    diff, first = 0.0, None
    for i in range(calls_for(stepper, VERIFY_TOKENS)):
        out, ref = advance(stepper), _advance_k(reference, stepper.tokens_per_step)
        step_diff = float((out.float() - ref.float()).abs().max())
        if step_diff > 0 and first is None:
            first = (i + 1) * stepper.tokens_per_step - 1
        diff = max(diff, step_diff)
        if first is not None:
            break
    metrics.update(max_logit_diff=diff)
    if stepper.rows != stepper.bs:
        metrics.update(_unpadded_agreement(model, prompt, cfg, stepper.rows))
    if first is not None:
        return (f"logits differ from eager's (same kernels, {stepper.rows} rows) at decode step {first}: "
                f"max |diff| {diff:.4g}, where replaying eager's kernels must give 0")
    return _timed_tokens(model, prompt, stepper, cfg, timed_tokens, metrics)


def _timed_tokens(model, prompt, stepper, cfg, timed_tokens, metrics) -> str | None:
    """Every timed block's tokens [blocks, steps, bs] against a free-running eager decode of the same positions."""
    warm, steps = calls_for(stepper, cfg.warmup) * stepper.tokens_per_step, timed_tokens.shape[-2]
    reference = EagerStepper(model, prompt, cfg.cache_len, rows=stepper.rows)
    tokens = _free_run(reference, warm + steps)[warm:]
    differs = (tokens != timed_tokens).any(dim=-1)  # [blocks, steps]
    metrics.update(tokens_match=float(not bool(differs.any())), timed_tokens_checked=float(differs.numel()))
    if bool(differs.any()):
        block, step = (int(i) for i in differs.nonzero()[0])
        return (f"the timed loop's token at decode step {step} of block {block + 1} differs from eager's "
                f"({int(differs.sum())} of {differs.numel()} steps differ)")
    return None


def _unpadded_agreement(model, prompt, cfg, rows: int) -> dict[str, float]:
    """Padding changes the GEMMs' shapes, hence cuBLAS's kernels, not the answer: how close the padded
    batch's eager decode stays to the unpadded one's (teacher-forced, a separate figure, not a check)."""
    padded = EagerStepper(model, prompt, cfg.cache_len, rows=rows)
    plain = EagerStepper(model, prompt, cfg.cache_len)
    same, diff = 0, 0.0
    for _ in range(VERIFY_TOKENS):
        a, b = padded.step(), plain.step()
        diff = max(diff, float((a.float() - b.float()).abs().max()))
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        for s in (padded, plain):
            s.input_ids.copy_(a.argmax(dim=-1, keepdim=True))
    return {"unpadded_token_agreement": same / (VERIFY_TOKENS * prompt.shape[0]), "unpadded_max_logit_diff": diff}


def _against_fp32(model, prompt, stepper, cfg, metrics) -> str | None:
    reference = EagerStepper(_fp32_copy(model), prompt, cfg.cache_len)
    plain = EagerStepper(model, prompt, cfg.cache_len)
    stepper.restart(prompt)
    err, own, scale, flips = 0.0, 0.0, 0.0, []
    for _ in range(VERIFY_TOKENS):
        ref = reference.step().float()
        out, base = stepper.step().float(), plain.step().float()
        err, own = max(err, float((out - ref).abs().max())), max(own, float((base - ref).abs().max()))
        scale = max(scale, float(ref.abs().max()))
        top2 = ref.topk(2, dim=-1).values
        flips.append(((out.argmax(-1) != ref.argmax(-1)), top2[:, 0] - top2[:, 1]))
        for s in (reference, plain, stepper):  # all fed fp32's tokens
            s.input_ids.copy_(ref.argmax(dim=-1, keepdim=True))
    del reference
    bound = max(INEXACT_BOUND * own, FP32_FLOOR * scale)
    differ = torch.cat([d for d, _ in flips]).float()
    near_ties = all(bool((gap[d] <= 2 * err).all()) for d, gap in flips)
    metrics.update(fp32_max_logit_err=err, eager_fp32_max_logit_err=own, fp32_err_bound=bound,
                   fp32_err_vs_eager=err / own if own else float("nan"),
                   fp32_token_agreement=1.0 - float(differ.mean()))
    if err > bound:
        return (f"logit error against fp32 {err:.4g} exceeds the bound {bound:.4g} "
                f"({INEXACT_BOUND:g} x eager's own {own:.4g})")
    if not near_ties:
        return f"a token differs from fp32's where fp32's top-2 gap exceeds twice the error ({2 * err:.4g})"
    return None


def _fp32_copy(model):
    reference = copy.deepcopy(model).float()
    if hasattr(reference, "set_attn_implementation"):
        reference.set_attn_implementation("sdpa")  # the reference attention, whatever the run's backend
    return reference


def _advance_k(stepper, k: int) -> torch.Tensor:
    for _ in range(k):
        out = advance(stepper)
    return out


def _free_run(stepper, n: int) -> torch.Tensor:
    tokens = torch.empty(n, stepper.bs, dtype=torch.long, device=stepper.input_ids.device)
    for i in range(n):
        advance(stepper)
        tokens[i].copy_(stepper.input_ids[:, 0])
    return tokens
