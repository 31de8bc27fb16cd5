"""A run proves its decode against the computation it claims to equal, after its timed loop: verify() runs the checks
that apply, each in the module named for what it checks.

The run's stepper first decodes VERIFY_TOKENS steps from its prefilled context (more where the attention backend
reads in blocks: past the first position that starts one, context_check.verified_steps), fed the tokens its timed
loop decoded (greedily where its graph feeds itself); its logits and tokens are kept (traces.free_run). Every
reference is then fed the same tokens (teacher-forced), so that one near-tie cannot send two decodes apart, and runs
one after another in the stepper's own cache (rewound to the context), so that a check at a long context needs no
second cache and no second prefill. A reference an earlier job of the same shape computed for the very same tokens is
taken as it is (references.py): in a sweep, graphed's check reuses eager's.
- Exact modes (eager, graphed, bucketed) run eager's own kernels with the run's attention backend
  (harness/measure/lockstep.py). Every logit of every row must equal plain eager's at the same rows (a bucket's
  padding included), as far as eager reproduces itself (bit for bit where its kernels are deterministic; on the
  H200, SDPA over a 1024-slot cache is not, from about the 50th step), measured again before a run fails. The loop's
  own tokens (warm-up and first timed block, kept on the device) must each be eager's choice given the same
  history, or a tie: within TIE_TOLERANCE, or twice eager's own variation over that history where it varies.
  A bucketed run's agreement with the unpadded batch is logged beside it.
- Inexact modes (Inductor's kernels) and attention backends other than `sdpa` round differently
  (harness/measure/fidelity.py). They are judged against an fp32 eager decode (sdpa attention) of the same model,
  prompt and tokens: their largest logit error against fp32 may be at most INEXACT_BOUND times that of this dtype's
  plain eager decode (sdpa) against fp32, and a token may differ from fp32's only where fp32's top-2 logits are
  closer than twice the measured error. The fp32 decode starts from the run's own context K/V, upcast (no fp32
  prefill), in a cache of its own (twice the bytes): it checks as many rows as half the free memory holds, up to
  FP32_TOKENS of context (`fp32_rows_checked`), beside the run's cache where they fit there, else after it is
  freed, and takes every step's logits from forwards over the run's tokens (teacher forcing), not a step at a time;
  plain eager's decode, the bound's unit, takes those rows' context K/V as they are, in a cache of its own, and
  decodes step by step as the run does.
- The context itself (harness/measure/context_check.py): every reference decodes from it, so it is checked against a
  digest taken after the prefill and kept apart (each slot's K/V summed per layer, `context_digest`), which must be
  unchanged after the timed blocks and the free run. A run that passed, its context as the prefill left it, hands
  its cache to the next job of the sweep (harness/modes/kept_context.py): where that job would prefill the very same
  context, it decodes from this one. The same module checks the cache's write position after a rewind, the blocks a
  backend plans to read, and that every token the loop recorded is an argmax of the logits its call returned.
"""
from __future__ import annotations

import torch

from harness.kernels import attention_spec
from harness.measure import context_check, fidelity, layer_gate, lockstep, mutations, references, traces
from harness.measure.timing import calls_for


def verify(model, prompt, stepper, cfg, exact: bool, decoded: torch.Tensor,
           kept: references.JobReferences | None = None, choices: list | None = None) -> tuple[dict, str | None]:
    """Metrics of the checks that apply, and the failure reason of the first that failed (or None).
    `decoded` [steps, bs]: the tokens of the run's warm-up and first timed block, as the loop produced them;
    `kept`: what the job took and offers (its loop's own logits, where it was plain eager; the context it hands on);
    `choices`: (phase, its calls' timing.note_choice [calls, 2, bs]) for the warm-up and every timed block, whose
    recorded tokens must each be an argmax of the logits they came from (context_check.recorded_tokens). The job's
    last use of the stepper's cache: freed at the end, or kept for the next job (context_check.keep_or_release)."""
    metrics, applied = {}, []
    failure = context_check.recorded_tokens(choices, metrics) if choices is not None else None
    stepper.rewind()
    failure = failure or context_check.rewound_to_the_context(stepper, prompt.shape[1])
    steps = context_check.verified_steps(cfg.attn, prompt.shape[1], cfg.cache_len)
    run = traces.free_run(stepper, calls_for(stepper, steps), decoded)
    digest = context_check.context_digest(stepper)  # the context as the checks find it: fp32's references' key
    failure = failure or context_check.context_changed(stepper, digest, metrics)
    references.new_job()
    if exact:
        applied.append("eager")
        lockstep.one_pass_serves_both(model, prompt, stepper, run, decoded, kept.loop if kept else None)
        failure = (failure or lockstep.exact(model, prompt, stepper, run, metrics)
                   or lockstep.decoded_tokens(model, prompt, stepper, decoded, metrics))
        if stepper.rows != stepper.bs:
            metrics.update(lockstep.unpadded_agreement(model, prompt, cfg, stepper.rows))
    gate = layer_gate.check(model, stepper, cfg, exact, metrics)  # layer by layer, while the run's cache is whole
    # fp32 is fed the run's tokens, every step's: a stepper that decodes several a call must show each of them
    if (not exact or not attention_spec(cfg.attn).reference) and fidelity.every_token_shown(stepper, run):
        applied.append("fp32")
        failure = failure or fidelity.against_fp32(model, prompt, stepper, cfg, run, digest, metrics)
    behind = int(mutations.requested(cfg.mode, cfg.attn) in mutations.READ_PLAN_FAULTS)  # a test's fault: 1 behind
    plan = context_check.read_plan_problem(cfg.attn, prompt.shape[1], steps, cfg.cache_len, prompt.device, metrics,
                                           behind)
    failure = failure or plan or gate  # the layer gate's reason only where every check before it passed
    if not applied:  # fail closed: a run that no check can judge is not verified
        failure = failure or (f"no check applies: mode={cfg.mode} computes with other kernels than eager's and decodes "
                              f"{stepper.tokens_per_step} tokens a call without showing each, so fp32's "
                              f"teacher-forced decode cannot follow it")
    metrics.update(verified=float(failure is None), checks_applied=float(len(applied)), verified_steps=float(steps))
    context_check.keep_or_release(model, prompt, stepper, failure, kept.context_offer if kept else None)
    return metrics, failure
