"""Exact modes (eager, graphed, bucketed) against plain eager, step by step: the same kernels over the same history.

Every logit of every row must equal plain eager's fed the run's tokens (exact), as far as eager reproduces itself,
measured again before a run fails; the loop's own tokens (warm-up and first timed block) must each be eager's choice
given the same history, or a tie (decoded_tokens). Eager's decodes come from references.py where an earlier job of
the shape computed them for the very same tokens, or from plain eager's own loop (one_pass_serves_both)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from harness.modes.eager import EagerStepper
from harness.measure import references, traces
from harness.measure.context_check import VERIFY_TOKENS
from harness.measure.traces import Trace

TIE_TOLERANCE = 0.0625  # 2x eager's run-to-run logit difference at cache 1024 (docs/checks.md)
RECHECKS = 2  # more eager decodes that measure eager's own variation before a run fails for exceeding it


def exact(model, prompt, stepper, run: Trace, metrics) -> str | None:
    """Plain eager decodes of the same rows, fed the run's tokens: the run may differ from the first no more than
    eager differs from itself, which is not at all where its kernels are deterministic. Where the run differs at
    all, a second eager decode measures that variation, and before failing a run, up to RECHECKS more, until the
    variation measured covers the run's difference: where eager varies only now and then (cuDNN's attention, where
    torch's SDPA dispatches to it on the H200: benchmarks/eager_variation.py), two passes may agree by chance.
    A variation an earlier job of the same shape and prompt measured (the kernels' nondeterminism there, whatever
    tokens it fed) serves a run within twice it; a run beyond is judged on variation measured again in its own
    cache."""
    k = stepper.tokens_per_step
    shape, inputs = references.shape_of(model, stepper, k), [prompt, stepper.first_ids, run.tokens]

    def eager(index: int) -> Trace:  # the index-th eager decode fed the run's tokens (an earlier job's, if it had them)
        return references.reference("forced", shape, inputs, index,
                                    lambda: traces.forced(traces.eager_in(model, stepper), run.tokens, k))

    first = eager(0)
    diff, own = traces.max_diff(run.logits, first.logits), None
    if diff > 0:  # where the run equals eager bit for bit it passes at any variation: none is measured
        own = _variation_measured_before(shape, inputs, diff, eager, first, metrics)
        if own is None or diff > 2 * own:
            if references.from_earlier_job("forced"):
                # eager's variation is measured between decodes in one cache: an earlier job's pass against this
                # job's would count a difference of prefills as eager's variation. Decide as if none were kept.
                references.drop("forced")
                first = eager(0)
                diff = traces.max_diff(run.logits, first.logits)
            own = _eager_variation(lambda index: traces.max_diff(eager(index).logits, first.logits),
                                   covers=lambda variation: diff <= 2 * variation)
            references.note_variation(shape, inputs[:2], own)
        metrics["eager_self_max_logit_diff"] = own
    metrics["max_logit_diff"] = diff
    if own is not None and diff > 2 * own:
        return (f"logits differ from eager's (same kernels, {stepper.rows} rows) by up to {diff:.4g} over "
                f"{run.tokens.shape[0]} steps, where eager differs from itself by {own:.4g}")
    return None


def _eager_variation(apart: Callable[[int], float], covers: Callable[[float], bool]) -> float:
    """Eager's own variation: how far its later passes land from its first (`apart(index)`), the second pass's and
    then up to RECHECKS more, until the variation measured `covers` what is judged. Where eager varies only now and
    then, two passes may agree by chance; a steady eager takes every pass before a run fails."""
    variation = 0.0
    for index in range(1, 2 + RECHECKS):
        variation = max(variation, apart(index))
        if covers(variation):
            break
    return variation


def _variation_measured_before(shape, inputs, diff: float, eager, first: Trace, metrics) -> float | None:
    """Eager's variation an earlier job measured already: between its own passes over these very tokens, in one cache
    (within it, the run passes), else, where the run is within twice it, at this shape and prompt over other tokens."""
    own = None
    if (kept := references.passes_of_one_earlier_job("forced")) >= 2:
        own = max(traces.max_diff(eager(index).logits, first.logits) for index in range(1, kept))
    if (own is None or diff > 2 * own) and (earlier := references.variation(shape, inputs[:2])) is not None:
        if diff <= 2 * earlier:
            own = earlier
            metrics["eager_variation_reused"] = 1.0
    return own


def one_pass_serves_both(model, prompt, stepper, run: Trace, decoded: torch.Tensor,
                          loop: references.LoopReference | None = None) -> None:
    """Where the free run followed the timed loop's tokens (a stepper that does not feed itself; one that does,
    where its greedy tokens were the loop's), eager fed the loop's tokens is, over its first steps, eager fed the
    free run's: one decode gives the token check its gaps and the lockstep its first reference, where two would
    compute the same steps twice. Where the loop was plain eager, that decode is the loop itself: its kept logits
    serve, and no eager step is taken again. The free run, which followed the loop's tokens, is then a second eager
    decode fed them in the same cache, the very pass that measures eager's variation against the first: it is kept
    as that pass, where a third decode would compute the same steps again."""
    steps = run.tokens.shape[0]
    if loop is not None:
        shape = references.shape_of(model, stepper)
        references.put("gaps", shape, [prompt, stepper.first_ids, decoded], 0, loop.gaps, computed=False)
        if loop.logits.shape[0] == steps and torch.equal(decoded[:steps], run.tokens):
            inputs = [prompt, stepper.first_ids, run.tokens]
            references.put("forced", shape, inputs, 0, Trace(loop.logits, run.tokens), computed=False)
            references.put("forced", shape, inputs, 1, run, computed=False)
        return
    if stepper.tokens_per_step != 1 or decoded.shape[0] < steps or not torch.equal(decoded[:steps], run.tokens):
        return
    shape = references.shape_of(model, stepper)
    forced_inputs, gaps_inputs = [prompt, stepper.first_ids, run.tokens], [prompt, stepper.first_ids, decoded]
    if references.kept("forced", shape, forced_inputs, 0) or references.kept("gaps", shape, gaps_inputs, 0):
        return
    *gaps, logits = _token_gaps(model, stepper, decoded, keep_logits=steps)
    references.put("forced", shape, forced_inputs, 0, Trace(logits, run.tokens))
    references.put("gaps", shape, gaps_inputs, 0, tuple(gaps))


def _tie_tolerance(eager_variation: float) -> float:
    """How far below eager's best a decoded token may rank and still be a tie: TIE_TOLERANCE, or twice eager's own
    variation where that is larger."""
    return max(TIE_TOLERANCE, 2 * eager_variation)


def decoded_tokens(model, prompt, stepper, decoded, metrics) -> str | None:
    """The loop's own tokens, judged teacher-forced: fed the same history, eager must pick each of them,
    or rank it within the tie tolerance of its best: TIE_TOLERANCE, or, where eager varies more than half that
    (bs=8 and 32 on the H200), twice eager's own variation: the logit variation the lockstep measured already (in
    this job, or an earlier one of the same shape and prompt), else a second eager pass over the same history, and,
    before the run fails, RECHECKS more (the MoE's eager at bs=8 varied by 0.125 between two passes and by up to 0.25
    in other jobs: a tie of 0.28 failed a graph that matched eager bit for bit over the lockstep's 32 steps)."""
    shape, inputs = references.shape_of(model, stepper), [prompt, stepper.first_ids, decoded]

    def gaps(index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return references.reference("gaps", shape, inputs, index, lambda: _token_gaps(model, stepper, decoded))

    gap, chosen, best = gaps(0)
    tolerance, own = TIE_TOLERANCE, 0.0
    measured = metrics.get("eager_self_max_logit_diff") or references.variation(shape, inputs[:2]) or 0.0
    widened = _tie_tolerance(measured)
    if bool((gap > tolerance).any()) and bool((gap <= widened).all()):
        own, tolerance = measured, widened  # every token within what eager's variation allows
    elif bool((gap > tolerance).any()):
        if references.from_earlier_job("gaps"):  # as in exact: both passes in one cache, or it is not eager's variation
            references.drop("gaps")
            gap, chosen, best = gaps(0)

        def apart(index: int) -> float:  # the index-th pass's logits of the chosen and best tokens against the first's
            _, chosen_again, best_again = gaps(index)
            return max(traces.max_diff(chosen, chosen_again), traces.max_diff(best, best_again))

        own = _eager_variation(apart, covers=lambda variation: bool((gap <= _tie_tolerance(variation)).all()))
        tolerance = _tie_tolerance(own)
    bad = gap > tolerance
    wrong = int(bad.sum())
    metrics.update(tokens_match=float(wrong == 0), decoded_tokens_checked=float(decoded.numel()),
                   decoded_tokens_at_ties=float(((gap > 0) & ~bad).sum()), tie_tolerance=tolerance)
    if wrong:
        first_wrong = int(bad.any(dim=1).nonzero()[0, 0])
        return (f"the decoded token at step {first_wrong} (warm-up and first timed block) is not eager's choice "
                f"given the same history ({wrong} of {decoded.numel()} tokens; the largest gap "
                f"{float(gap.max()):.4g} exceeds the tie tolerance {tolerance:.4g}, eager's own variation {own:.4g})")
    return None


def _token_gaps(model, stepper, decoded, keep_logits: int = 0) -> tuple[torch.Tensor, ...]:
    """Eager fed the loop's tokens: how far below its best logit each token ranks, the token's logit and the
    best, each [steps, bs]; and, with keep_logits, the logits of that many first steps [steps, bs, vocab]. Step by
    step: [steps, bs, vocab] logits in fp32 would not fit at large bs."""
    reference, kept = traces.eager_in(model, stepper), []

    def steps():  # one step's logits at a time, each fed the loop's token after it
        for i, tokens in enumerate(decoded):
            out = reference.step()
            if i < keep_logits:
                kept.append(out.clone())
            yield out
            reference.input_ids.copy_(tokens[:, None])

    gaps = references.gaps_of(steps(), decoded)
    return (*gaps, torch.stack(kept)) if keep_logits else gaps


def unpadded_agreement(model, prompt, cfg, rows: int) -> dict[str, float]:
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
