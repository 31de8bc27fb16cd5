"""A run proves its decode against the computation it claims to equal, after its timed loop.

- Exact modes (eager, graphed, bucketed) run eager's own kernels. In lockstep with plain eager steppers of
  the same rows (a bucket's padding rows included), every logit of every row must equal eager's, as far
  as eager reproduces itself (bit for bit where its kernels are deterministic; on the H200, SDPA over a
  1024-slot cache is not, from about the 50th step). The loop's own tokens (warm-up and first timed block,
  kept on the device) must each be eager's choice given the same history, or a tie within TIE_TOLERANCE.
  A bucketed run's agreement with the unpadded batch is logged beside it.
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
TIE_TOLERANCE = 0.0625  # 2x eager's run-to-run logit difference at cache 1024 on the H200 (docs/benchmarks.md)
FP32_FLOOR = 1e-5  # where eager's own error is 0 (an fp32 run), rounding of this size relative to the logits


def verify(model, prompt, stepper, cfg, exact: bool, decoded: torch.Tensor) -> tuple[dict, str | None]:
    """Metrics of the checks that apply, and the failure reason of the first that failed (or None).
    `decoded` [steps, bs]: the tokens of the run's warm-up and first timed block, as the loop produced them."""
    metrics, failure = {}, None
    if exact:
        failure = _exact(model, prompt, stepper, cfg, metrics) or _decoded_tokens(model, prompt, stepper, cfg,
                                                                                  decoded, metrics)
    # (a K-step graph feeds itself, so it cannot be teacher-forced token by token: its exact check stands)
    if (not exact or cfg.attn.value != "sdpa") and stepper.tokens_per_step == 1:
        failure = failure or _against_fp32(model, prompt, stepper, cfg, metrics)
    metrics["verified"] = float(failure is None)
    return metrics, failure


def _exact(model, prompt, stepper, cfg, metrics) -> str | None:
    """Lockstep against two plain eager steppers of the same rows: the mode may differ from eager no more
    than eager differs from itself, which is not at all where its kernels are deterministic."""
    first, second = (EagerStepper(model, prompt, cfg.cache_len, rows=stepper.rows) for _ in range(2))
    stepper.restart(prompt)
    diff = own = 0.0
    for _ in range(calls_for(stepper, VERIFY_TOKENS)):
        out, ref = advance(stepper), _advance_k(first, stepper.tokens_per_step)
        again = _advance_k(second, stepper.tokens_per_step)
        diff = max(diff, float((out.float() - ref.float()).abs().max()))
        own = max(own, float((again.float() - ref.float()).abs().max()))
    metrics.update(max_logit_diff=diff, eager_self_max_logit_diff=own)
    if stepper.rows != stepper.bs:
        metrics.update(_unpadded_agreement(model, prompt, cfg, stepper.rows))
    if diff > 2 * own:
        return (f"logits differ from eager's (same kernels, {stepper.rows} rows) by up to {diff:.4g} over "
                f"{VERIFY_TOKENS} steps, where eager differs from itself by {own:.4g}")
    return None


def _decoded_tokens(model, prompt, stepper, cfg, decoded, metrics) -> str | None:
    """The loop's own tokens, judged teacher-forced: fed the same history, eager must pick each of them,
    or rank it within TIE_TOLERANCE of its best (eager's own run-to-run rounding can flip such a tie)."""
    reference = EagerStepper(model, prompt, cfg.cache_len, rows=stepper.rows)
    ties = wrong = 0
    first_wrong = None
    for step in range(decoded.shape[0]):
        logits = reference.step().float()
        best, chosen = logits.max(dim=-1).values, logits.gather(-1, decoded[step][:, None])[:, 0]
        ties += int(((best - chosen > 0) & (best - chosen <= TIE_TOLERANCE)).sum())
        bad = int((best - chosen > TIE_TOLERANCE).sum())
        wrong += bad
        first_wrong = step if bad and first_wrong is None else first_wrong
        reference.input_ids.copy_(decoded[step][:, None])
    metrics.update(tokens_match=float(wrong == 0), decoded_tokens_checked=float(decoded.numel()),
                   decoded_tokens_at_ties=float(ties))
    if wrong:
        return (f"the decoded token at step {first_wrong} (warm-up and first timed block) is not eager's choice "
                f"given the same history ({wrong} of {decoded.numel()} tokens)")
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


