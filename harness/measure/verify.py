"""A run proves its decode against the computation it claims to equal, after its timed loop.

The run's stepper first decodes VERIFY_TOKENS steps from its prefilled context (more where the attention backend
reads in blocks: past the first position that starts one, verified_steps), fed the tokens its timed loop decoded
(greedily where its graph feeds itself); its logits and tokens are kept. Every reference is then fed the same tokens
(teacher-forced), so that one near-tie cannot send two decodes apart, and runs one after another in the stepper's
own cache (rewound to the context), so that a check at a long context needs no second cache and no second prefill.
A reference an earlier job of the same shape computed for the very same tokens is taken as it is (references.py): in
a sweep, graphed's check reuses eager's.
- Exact modes (eager, graphed, bucketed) run eager's own kernels with the run's attention backend. Every
  logit of every row must equal plain eager's at the same rows (a bucket's padding included), as far as
  eager reproduces itself (bit for bit where its kernels are deterministic; on the H200, SDPA over a
  1024-slot cache is not, from about the 50th step), measured again before a run fails. The loop's own
  tokens (warm-up and first timed block, kept on the device) must each be eager's choice given the same
  history, or a tie: within TIE_TOLERANCE, or twice eager's own variation over that history where it varies.
  A bucketed run's agreement with the unpadded batch is logged beside it.
- Inexact modes (Inductor's kernels) and attention backends other than `sdpa` round differently. They are
  judged against an fp32 eager decode (sdpa attention) of the same model, prompt and tokens: their largest
  logit error against fp32 may be at most INEXACT_BOUND times that of this dtype's plain eager decode (sdpa)
  against fp32, and a token may differ from fp32's only where fp32's top-2 logits are closer than twice the
  measured error. The fp32 decode starts from the run's own context K/V, upcast (no fp32 prefill), in a cache
  of its own (twice the bytes): it checks as many rows as half the free memory holds, up to FP32_TOKENS of
  context (`fp32_rows_checked`), beside the run's cache where they fit there, else after it is freed, and takes
  every step's logits from forwards over the run's tokens (teacher forcing), not a step at a time; plain eager's
  decode, the bound's unit, takes those
  rows' context K/V as they are, in a cache of its own, and decodes step by step as the run does.
- The context itself: every reference decodes from it, so it is checked against a digest taken after the
  prefill and kept apart (each slot's K/V summed per layer, `context_digest`), which must be unchanged after the timed
  blocks and the free run. A run that passed, its context as the prefill left it, hands its cache to the next job
  of the sweep (harness/modes/kept_context.py): where that job would prefill the very same context, it decodes
  from this one.
"""
from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.kernels import ATTENTION, attention_spec
from harness.modes import kept_context
from harness.modes.base import CACHE_KWARG, kv_heads_and_dim, pad_rows, prefill_chunk
from harness.modes.eager import EagerStepper
from harness.measure import layer_gate, mutations, references
from harness.measure.stats import paired_mean_interval
from harness.measure.timing import advance, calls_for, recorded_not_argmax

VERIFY_TOKENS = 32  # steps compared logit by logit
INEXACT_BOUND = 4.0  # an inexact run's error against fp32, in units of plain eager's own (docs/checks.md)
TIE_TOLERANCE = 0.0625  # 2x eager's run-to-run logit difference at cache 1024 (docs/checks.md)
RECHECKS = 2  # more eager decodes that measure eager's own variation before a run fails for exceeding it
FP32_FLOOR = 1e-5  # where eager's own error is 0 (an fp32 run), rounding of this size relative to the logits
# A run's mean KL from fp32 may exceed native eager's by at most this many times eager's own (the KL delta's 95%
# interval above it fails the run), and by at least KL_FLOOR_NATS where eager's is ~0 (an fp32 run)
KL_TOLERANCE = 1.0
# and at no single step by more than KL_STEP_TOLERANCE x eager's worst step (a fault at a block boundary touches one
# step in 128, which a mean over steps, and its bootstrap interval, can hide)
KL_STEP_TOLERANCE = 4.0
KL_FLOOR_NATS = 1e-6
FP32_TOKENS = 32768  # context tokens the fp32 reference prefills at most (rows x context_len): its prefill is slow
FORCED_LOGITS_BYTES = 1 << 30  # a teacher-forced forward's logits (rows x tokens x vocab, fp32) stay under this


@dataclass
class Trace:
    """A decode's logits at the last token of each call [calls, bs, vocab], and the tokens fed [steps, bs]."""

    logits: torch.Tensor
    tokens: torch.Tensor


@dataclass
class LoopReference:
    """Plain eager's own loop (warm-up and first timed block), kept as the reference its checks would otherwise
    decode again: an eager decode fed the loop's tokens is that very loop, the same kernels over the same history."""

    logits: torch.Tensor  # [steps, bs, vocab]: the first verified steps' logits
    gaps: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # as _token_gaps: (gap, chosen, best), each [steps, bs]


def loop_serves_as_reference(stepper, exact: bool) -> bool:
    """Whether the run's loop is plain eager itself (no other stepper, no test's mutation wrapping it)."""
    return exact and type(stepper) is EagerStepper


def loop_reference(logits: list[torch.Tensor], decoded: torch.Tensor, steps: int) -> LoopReference:
    """The loop's logits, a call each [bs, vocab], and the tokens it decoded [calls, bs]: the first `steps` logits
    stacked, and how far below each step's best logit the token fed after it ranks (0 where the loop fed its argmax;
    more where its feeding went wrong)."""
    if len(logits) != decoded.shape[0]:
        raise ValueError(f"the loop kept {len(logits)} logits for {decoded.shape[0]} decoded steps")
    return LoopReference(torch.stack(logits[:steps]), _gaps_of(logits, decoded))


def verify(model, prompt, stepper, cfg, exact: bool, decoded: torch.Tensor,
           loop: LoopReference | None = None, choices: list | None = None) -> tuple[dict, str | None]:
    """Metrics of the checks that apply, and the failure reason of the first that failed (or None).
    `decoded` [steps, bs]: the tokens of the run's warm-up and first timed block, as the loop produced them;
    `loop`: that loop's own logits, where it was plain eager (loop_serves_as_reference); `choices`: (phase, its
    calls' timing.note_choice [calls, 2, bs]) for the warm-up and every timed block, whose recorded tokens must each
    be an argmax of the logits they came from (recorded_tokens). Verification is a job's last use of the stepper's
    cache: it is freed at the end, or kept for the next job (keep_or_release)."""
    metrics, applied = {}, []
    failure = recorded_tokens(choices, metrics) if choices is not None else None
    stepper.rewind()
    failure = failure or _rewound_to_the_context(stepper, prompt.shape[1])
    steps = verified_steps(cfg.attn, prompt.shape[1], cfg.cache_len)
    run = _free_run(stepper, calls_for(stepper, steps), decoded)
    digest = context_digest(stepper)  # the context as the checks find it, once: fp32's kept reference is keyed by it
    failure = failure or _context_changed(stepper, digest, metrics)
    references.new_job()
    if exact:
        applied.append("eager")
        _one_pass_serves_both(model, prompt, stepper, run, decoded, loop)
        failure = (failure or _exact(model, prompt, stepper, run, metrics)
                   or _decoded_tokens(model, prompt, stepper, decoded, metrics))
        if stepper.rows != stepper.bs:
            metrics.update(_unpadded_agreement(model, prompt, cfg, stepper.rows))
    gate = layer_gate.check(model, stepper, cfg, exact, metrics)  # layer by layer, while the run's cache is whole
    # fp32 is fed the run's tokens, every step's: a stepper that decodes several a call must show each of them
    if (not exact or not attention_spec(cfg.attn).reference) and _every_token_shown(stepper, run):
        applied.append("fp32")
        failure = failure or _against_fp32(model, prompt, stepper, cfg, run, digest, metrics)
    behind = int(mutations.requested(cfg.mode, cfg.attn) in mutations.READ_PLAN_FAULTS)  # a test's fault: 1 behind
    if (plan := _read_plan_problem(cfg.attn, prompt.shape[1], steps, cfg.cache_len, prompt.device, metrics, behind)):
        failure = failure or plan
    failure = failure or gate  # the layer gate's reason where every check above passed
    if not applied:  # fail closed: a run that no check can judge is not verified
        failure = failure or (f"no check applies: mode={cfg.mode} computes with other kernels than eager's and decodes "
                              f"{stepper.tokens_per_step} tokens a call without showing each, so fp32's "
                              f"teacher-forced decode cannot follow it")
    metrics.update(verified=float(failure is None), checks_applied=float(len(applied)), verified_steps=float(steps))
    keep_or_release(model, prompt, stepper, failure)
    return metrics, failure


def context_fills(model, stepper) -> tuple:
    """What decides a stepper's context K/V besides its prompt: the model's weights, the attention its prefill
    runs (AttentionSpec.prefill: SDPA for every backend that decodes with its own kernels), and the cache's rows,
    capacity and dtype. Two jobs with the same, and the same prompt, prefill the very same context."""
    attn = model.config._attn_implementation
    prefill = ATTENTION[attn].prefill if attn in ATTENTION else attn  # a backend the registry does not know: its own
    return references.weights_key(model), prefill, stepper.rows, stepper.cache_len, str(stepper.cache.layers[0].keys.dtype)


def keep_or_release(model, prompt, stepper, failure: str | None) -> None:
    """Hand the run's cache to the next job of the sweep (kept_context), where the job offered it (the stepper's
    `context_offer`, set after its prefill), the run passed, no test's fault acted in it, and its context still
    sums slot by slot to what the prefill left; else free it."""
    offer = getattr(stepper, "context_offer", None)
    cache = None if isinstance(stepper, mutations.MutatedStepper) else stepper.cache
    if (offer is not None and failure is None and cache is not None and cache.layers[0].keys is not None
            and torch.equal(digest := context_digest(stepper), stepper.prefilled_context_digest)):
        fills = context_fills(model, stepper)
        kept_context.keep(kept_context.Filled(stepper.hand_over_cache(), fills, pad_rows(prompt, stepper.rows),
                                              stepper.first_ids, digest, *offer))
    stepper.release()


def verified_steps(attn: str, context_len: int, cache_len: int) -> int:
    """VERIFY_TOKENS steps from the context, or more where the attention backend reads the cache in blocks and those
    steps would decode at no block edge: then up to two steps past the first position that starts a block (flex's
    128 slots, triton-decode's 64), so that a fault at an edge (a block not read, a chunk dropped) is decoded under
    the checks at the job's own context; as far as the cache holds."""
    edge = attention_spec(attn).edge
    first_edge = -(-context_len // edge) * edge  # the first position >= the context that starts a block
    return max(VERIFY_TOKENS, min(first_edge - context_len + 3, cache_len - context_len))


def _read_plan_problem(attn: str, context_len: int, steps: int, cache_len: int, device, metrics: dict,
                       behind: int = 0) -> str | None:
    """Where the backend plans on the host which blocks a step reads, that plan must cover every valid slot at every
    verified position: a block count one short leaves the newest token unread at a block's first slot, which moves
    the logits less than bf16's own noise (one key of 1025 at context 1024, invisible to the fidelity gate).
    `behind`: a test's fault (mutations.READ_PLAN_FAULTS), the plan asked for that many positions before."""
    spec = attention_spec(attn)
    if spec.read_plan is None:
        return None  # not applied: the kernel plans its own reads (the checks above see its faults)
    for position in range(context_len, context_len + steps):
        if (slots := spec.slots_planned(position - behind, cache_len, device)) < position + 1:
            return (f"attn={attn} plans to read {slots} slots for the token at slot {position}, short of its "
                    f"{position + 1} valid ones: the newest token's block goes unread")
    metrics["read_plan_positions_checked"] = float(steps)
    return None


def recorded_tokens(choices: list, metrics: dict) -> str | None:
    """Every token the loop recorded (the warm-up's and every timed block's, the last of each call) must be an argmax
    of the logits that very call returned: its logit is compared with the call's best, both kept beside the loop
    (timing.note_choice), so no tolerance is needed (a tie passes; nothing else does). A loop that records another
    token than it decoded (its input, a stale buffer) would hand every check after it a history the run never
    decoded; where greedy decode repeats its input, or logits lie within the tie tolerance, those checks pass."""
    checked = 0
    for phase, calls in choices:
        if calls.shape[0] == 0:
            continue
        checked += calls.shape[0] * calls.shape[2]
        if (wrong := recorded_not_argmax(calls)) is not None:
            metrics.update(recorded_tokens_argmax=0.0, recorded_tokens_checked=float(checked))
            return (f"the token recorded for call {wrong[0]} of {phase} is not an argmax of the logits that call "
                    f"returned ({wrong[1]} of {calls.shape[0]} calls there): the loop recorded another token than "
                    f"it decoded")
    metrics.update(recorded_tokens_argmax=1.0, recorded_tokens_checked=float(checked))
    return None


def _every_token_shown(stepper, run: Trace) -> bool:
    """Whether the free run recorded the token of every step it decoded (a K-step graph keeps its K tokens), not
    only each call's last: a teacher-forced reference needs the whole history."""
    return run.tokens.shape[0] == run.logits.shape[0] * stepper.tokens_per_step


def _rewound_to_the_context(stepper, context_len: int) -> str | None:
    """After a rewind, every layer of the cache must write at the context's end, counted from the prompt itself
    (not from the stepper's own bookkeeping): every check below rewinds the same way, so a rewind that is off by
    a slot would move the run and its references alike, and only this count sees it."""
    positions = sorted({int(layer.cumulative_length) for layer in stepper.cache.layers})  # a sync: after timing
    if positions != [context_len]:
        return (f"after a rewind the cache writes at slot {', '.join(map(str, positions))}, not after the "
                f"{context_len} context tokens: the timed blocks after the first decoded from a wrong position")
    return None


def context_digest(stepper) -> torch.Tensor:
    """The context's K/V summed per slot in fp32, for every layer's keys and values [layers x 2, context]. The job takes
    it right after the prefill, kept apart from the cache, so that verification can tell whether anything wrote into
    the context since. Every reference decodes from that context (in the run's cache, or from a copy of it taken at
    verification), so a write into it (a rewind that clears one slot too many, an append at a wrong slot) would
    move the run and its references alike."""
    ctx = stepper.context_len
    return torch.stack([t[:, :, :ctx].sum(dim=(0, 1, 3), dtype=torch.float32)
                        for layer in stepper.cache.layers for t in (layer.keys, layer.values)])


def _context_changed(stepper, digest: torch.Tensor, metrics: dict) -> str | None:
    """After the timed blocks and the free run, the context's K/V must be what the prefill left, slot by slot: each
    slot's sum over rows, heads and dims is compared bit for bit with the one taken after the prefill (a sum of the very
    same values, in the same order). Not applied where the job took no digest (a stepper driven by a test)."""
    before = getattr(stepper, "prefilled_context_digest", None)
    if before is None:
        return None
    changed = (digest != before).nonzero()  # a sync: after timing
    metrics["context_intact"] = float(changed.numel() == 0)
    if changed.numel() == 0:
        return None
    row, slot = int(changed[0, 0]), int(changed[0, 1])
    layer, which = row // 2, ("keys", "values")[row % 2]
    return (f"the context's K/V changed after the prefill: {changed.shape[0]} slot sums differ, the first at slot {slot} "
            f"of layer {layer}'s {which}: a decode, a rewind or a check wrote before the context's end")


def _free_run(stepper, calls: int, decoded: torch.Tensor | None = None) -> Trace:
    """The run decoding again from its context, fed after each step the token its timed loop decoded there
    (`decoded`, [steps, bs]), or, where its graph feeds itself, past the loop's tokens or with none given, its own
    argmax. On the loop's path, the eager decode that gives the token check its gaps is also the lockstep's
    reference (one pass, _one_pass_serves_both), where a greedy run that one near-tie sent elsewhere (eager's own
    variation, at bs 8 and 32 on the H200) needs two; the loop's tokens were the run's own greedy choices, which
    that check judges."""
    feeds = decoded is not None and not stepper.feeds_itself and stepper.tokens_per_step == 1
    follow = min(decoded.shape[0], calls) if feeds else 0
    logits, tokens = [], []
    if follow:  # on the loop's path: fed its tokens as a reference is
        followed = _forced(stepper, decoded[:follow])
        logits, tokens = list(followed.logits), [followed.tokens]
    for _ in range(calls - follow):
        logits.append(advance(stepper).clone())  # a compiled step may overwrite its output at the next call
        tokens.append(stepper.tokens.clone())
    return Trace(torch.stack(logits), torch.cat(tokens))


def _forced(stepper, tokens: torch.Tensor, k: int = 1) -> Trace:
    """An eager stepper fed `tokens` [steps, bs] after its first token; logits at every k-th step."""
    logits = []
    for i in range(tokens.shape[0]):
        out = stepper.step()
        if i % k == k - 1:
            logits.append(out.clone())
        stepper.input_ids.copy_(tokens[i][:, None])
    return Trace(torch.stack(logits), tokens)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _exact(model, prompt, stepper, run: Trace, metrics) -> str | None:
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
                                    lambda: _forced(_eager_in(model, stepper), run.tokens, k))

    first = eager(0)
    diff, own = _max_diff(run.logits, first.logits), None
    if diff > 0:  # where the run equals eager bit for bit it passes at any variation: none is measured
        own = _variation_measured_before(shape, inputs, diff, eager, first, metrics)
        if own is None or diff > 2 * own:
            if references.from_earlier_job("forced"):
                # eager's variation is measured between decodes in one cache: an earlier job's pass against this
                # job's would count a difference of prefills as eager's variation. Decide as if none were kept.
                references.drop("forced")
                first = eager(0)
                diff = _max_diff(run.logits, first.logits)
            own = _eager_variation(lambda index: _max_diff(eager(index).logits, first.logits),
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
        own = max(_max_diff(eager(index).logits, first.logits) for index in range(1, kept))
    if (own is None or diff > 2 * own) and (earlier := references.variation(shape, inputs[:2])) is not None:
        if diff <= 2 * earlier:
            own = earlier
            metrics["eager_variation_reused"] = 1.0
    return own


def _one_pass_serves_both(model, prompt, stepper, run: Trace, decoded: torch.Tensor,
                          loop: LoopReference | None = None) -> None:
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


def _decoded_tokens(model, prompt, stepper, decoded, metrics) -> str | None:
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
        if references.from_earlier_job("gaps"):  # as in _exact: both passes in one cache, or it is not eager's variation
            references.drop("gaps")
            gap, chosen, best = gaps(0)

        def apart(index: int) -> float:  # the index-th pass's logits of the chosen and best tokens against the first's
            _, chosen_again, best_again = gaps(index)
            return max(_max_diff(chosen, chosen_again), _max_diff(best, best_again))

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
    reference, kept = _eager_in(model, stepper), []

    def steps():  # one step's logits at a time, each fed the loop's token after it
        for i, tokens in enumerate(decoded):
            out = reference.step()
            if i < keep_logits:
                kept.append(out.clone())
            yield out
            reference.input_ids.copy_(tokens[:, None])

    gaps = _gaps_of(steps(), decoded)
    return (*gaps, torch.stack(kept)) if keep_logits else gaps


def _gaps_of(step_logits, decoded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How far below each step's best logit the token decoded at it ranks, that token's logit and the best, each
    [steps, bs] in fp32, from each step's logits [bs, vocab] in turn (the whole [steps, bs, vocab] is never widened)."""
    chosen, best = [], []
    for out, tokens in zip(step_logits, decoded):
        logits = out.float()
        best.append(logits.max(dim=-1).values)
        chosen.append(logits.gather(-1, tokens[:, None])[:, 0])
    chosen_logits, best_logits = torch.stack(chosen), torch.stack(best)
    return best_logits - chosen_logits, chosen_logits, best_logits


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


def _against_fp32(model, prompt, stepper, cfg, run: Trace, sums: torch.Tensor, metrics) -> str | None:
    """The run's logits and plain eager's (this dtype, sdpa) against fp32's, all given the run's tokens, all from
    the run's prefilled context: plain eager and the fp32 decode take the run's context K/V (fp32's upcast, as the
    public studies of decode fidelity do), so that the three differ in their decode only, and no fp32 prefill of a
    long context is paid. Both decode the rows fp32 checks, and no more (at a long context, one or two of a batch
    of 32): plain eager step by step, the decode whose rounding is the bound's unit, fp32 in forwards over the
    known tokens. A kept reference serves only a job whose context K/V sum to the very same values, slot by slot
    (`sums`, context_digest's)."""
    k = stepper.tokens_per_step
    context = _context_copy(model, stepper)  # frees the run's cache
    plain = _plain_reference(model, prompt, cfg, context, run, sums, k)
    every_step = _fp32_reference(model, prompt, cfg, context, run, sums)
    context.prefix.clear()  # the context copy, freed before the comparisons
    ref, rows = every_step[k - 1::k], context.rows  # the steps whose logits a call returns
    err, own = _max_diff(run.logits[:, :rows], ref), _max_diff(plain, ref)
    bound = max(INEXACT_BOUND * own, FP32_FLOOR * float(ref.abs().max()))
    top2 = ref.topk(2, dim=-1).values
    differ = run.logits[:, :rows].argmax(-1) != ref.argmax(-1)
    metrics.update(fp32_max_logit_err=err, eager_fp32_max_logit_err=own, fp32_err_bound=bound,
                   fp32_err_vs_eager=err / own if own else float("nan"), fp32_rows_checked=float(rows),
                   fp32_token_agreement=1.0 - float(differ.float().mean()))
    fidelity = fidelity_against_fp32(ref, run.logits[:, :rows], plain)
    stepper.tags["fidelity"] = fidelity.pop("fidelity")
    metrics.update(fidelity)
    if err > bound:
        return (f"logit error against fp32 {err:.4g} exceeds the bound {bound:.4g} "
                f"({INEXACT_BOUND:g} x eager's own {own:.4g})")
    if not bool(((top2[..., 0] - top2[..., 1])[differ] <= 2 * err).all()):
        return f"a token differs from fp32's where fp32's top-2 gap exceeds twice the error ({2 * err:.4g})"
    if k > 1 and (wrong := _every_token_against_fp32(every_step, run.tokens[:, :rows], 2 * err)) is not None:
        return wrong
    if stepper.tags["fidelity"] == "lost":
        return _fidelity_lost(fidelity)
    if stepper.tags["fidelity"] == "worse":  # it passes: never silently, the line says why
        stepper.tags["fidelity_accepted"] = worse_within_tolerance(fidelity, err, bound)
    return None


def _every_token_against_fp32(every_step: torch.Tensor, tokens: torch.Tensor, tolerance: float) -> str | None:
    """A call that decodes several steps returns the last one's logits only, so the tokens before it are judged by
    fp32's logits alone: every step's token (the last one's again) must be fp32's choice given the same history, or
    rank within `tolerance` (twice the run's error) of fp32's best."""
    best = every_step.max(dim=-1).values
    gap = best - every_step.gather(-1, tokens[..., None].to(every_step.device))[..., 0]
    if bool((gap <= tolerance).all()):
        return None
    step = int((gap > tolerance).any(dim=1).nonzero()[0, 0])
    return (f"the token the run decoded at step {step} (inside a call of several) ranks {float(gap.max()):.4g} below "
            f"fp32's choice given the same history, more than twice the run's error ({tolerance:.4g})")


@dataclass
class ContextCopy:
    """The run's context K/V per layer [rows, kv_heads, context, head_dim] and first tokens, for the rows fp32
    checks: views of the run's cache, or copied before it is freed, so that as many rows as half the free memory
    holds fit."""

    prefix: list[tuple[torch.Tensor, torch.Tensor]]
    first_ids: torch.Tensor
    rows: int


def _context_copy(model, stepper) -> ContextCopy:
    """The context of the rows fp32 checks: views of the run's cache where as many rows fit beside it as without it
    (the cache then stays whole, for the next job: keep_or_release), else a copy, and the cache freed."""
    ctx, most = stepper.context_len, _fp32_rows_at_most(stepper)
    views = [(layer.keys[:most, :, :ctx], layer.values[:most, :, :ctx]) for layer in stepper.cache.layers]
    if _fp32_rows(model, stepper) == most:
        return ContextCopy(views, stepper.first_ids[:most], most)
    prefix = [(keys.clone(), values.clone()) for keys, values in views]
    views.clear()  # no view may keep the run's cache, freed below
    first_ids = stepper.first_ids[:most]
    stepper.release()
    rows = _fp32_rows(model, stepper)
    return ContextCopy([(k[:rows], v[:rows]) for k, v in prefix], first_ids[:rows], rows)


def _decode_from(model, prompt, cfg, context: ContextCopy, tokens: torch.Tensor, k: int = 1,
                 dtype: torch.dtype | None = None, step_by_step: bool = True) -> torch.Tensor:
    """An eager decode of the copied context's rows in a cache of its own, fed `tokens`; logits at every k-th step.
    step_by_step=False: every step's logits from forwards over the known tokens (_teacher_forced)."""
    reference = EagerStepper(model, prompt[:context.rows], cfg.cache_len, dtype=dtype, prefill=False)
    reference.adopt(context.prefix, context.first_ids)
    rows_tokens = tokens[:, :context.rows]
    logits = _forced(reference, rows_tokens, k).logits if step_by_step else _teacher_forced(reference, rows_tokens)
    reference.release()
    return logits


def _teacher_forced(stepper, tokens: torch.Tensor) -> torch.Tensor:
    """Every step's logits [steps, rows, vocab] of a decode fed `tokens` [steps, rows] after the stepper's first
    token, from forwards over those known tokens: each position attends to the very history a step-by-step decode
    gives it (the context, then the tokens before it: causal), so the logits are that decode's up to the rounding of
    other GEMM shapes (in fp32, a few millionths of the largest logit), at one forward's cost where steps would pay
    a step's host time each (an MoE's eager experts loop, 32 times over). In chunks whose mask and logits fit."""
    steps, rows = tokens.shape
    ids = torch.cat([stepper.first_ids, tokens[:-1].T.to(stepper.first_ids.device)], dim=1)  # [rows, steps]
    per_token = rows * stepper.model.config.vocab_size * 4
    chunk = max(1, min(prefill_chunk(rows, steps, stepper.cache_len), FORCED_LOGITS_BYTES // per_token))
    logits = []
    for start in range(0, steps, chunk):
        out = stepper.model(input_ids=ids[:, start:start + chunk], **{CACHE_KWARG: stepper.cache}, use_cache=True)
        logits.append(out.logits.transpose(0, 1))
    return torch.cat(logits)


def _plain_reference(model, prompt, cfg, context: ContextCopy, run: Trace, sums: torch.Tensor, k: int) -> torch.Tensor:
    """Plain eager (this dtype, sdpa) over the copied rows, fed the run's tokens [steps, rows, vocab], or an earlier
    job's for the same (any attention backend: plain runs sdpa from the very same context K/V)."""
    def plain_decode() -> torch.Tensor:
        with attention(model, "sdpa"):
            return _decode_from(model, prompt, cfg, context, run.tokens, k)

    shape = ("plain", references.weights_key(model), str(model.dtype), context.rows, cfg.cache_len, k)
    return references.reference("plain", shape, [prompt[:context.rows], context.first_ids, sums,
                                                 run.tokens[:, :context.rows]], 0, plain_decode)


def _fp32_reference(model, prompt, cfg, context: ContextCopy, run: Trace, sums: torch.Tensor) -> torch.Tensor:
    """The fp32 decode [steps, rows, vocab] fed the run's tokens, logits at every step (a call of several steps
    returns only its last), from the run's context K/V upcast, teacher-forced in forwards over those tokens, or an
    earlier job's for the same."""
    def fp32_decode() -> torch.Tensor:
        with computed_in_fp32(model):
            return _decode_from(model, prompt, cfg, context, run.tokens, dtype=torch.float32, step_by_step=False).float()

    rows = context.rows
    shape = ("fp32", references.weights_key(model), rows, cfg.cache_len)  # any attention: fp32 runs sdpa
    return references.reference("fp32", shape, [prompt[:rows], context.first_ids, sums, run.tokens[:, :rows]], 0,
                                fp32_decode)


def worse_within_tolerance(f: dict, err: float, bound: float) -> str:
    """One line on why a run whose fidelity is "worse" (its KL from fp32 above native eager's, the whole interval)
    passes: the excess lies within the tolerance (KL_TOLERANCE x eager's own KL from fp32: the run rounds farther from
    fp32 than eager does, by no more than eager's own distance from it), its worst step within KL_STEP_TOLERANCE x
    eager's worst, and its largest logit error within the bound. The job's tag `fidelity_accepted`, and its
    outcome line."""
    return (f"KL from fp32 {f['kl_delta_nats']:.3g} nats a token above native eager's (95% interval "
            f"{f['kl_delta_low_nats']:.3g} to {f['kl_delta_high_nats']:.3g}), within the tolerance "
            f"{f['kl_tolerance_nats']:.3g} ({KL_TOLERANCE:g} x eager's own {f['eager_kl_nats']:.3g}); worst step "
            f"{f['kl_delta_max_step_nats']:.3g} within {f['kl_step_tolerance_nats']:.3g}; largest logit error "
            f"{err:.4g} within {bound:.4g}")


def _fidelity_lost(f: dict) -> str:
    """The failure reason of a run whose fidelity is lost: its mean KL delta, or its worst step's."""
    if f["kl_delta_low_nats"] > f["kl_tolerance_nats"]:
        return (f"the run's KL from fp32 exceeds native eager's by {f['kl_delta_nats']:.3g} nats a token (95% "
                f"interval {f['kl_delta_low_nats']:.3g} to {f['kl_delta_high_nats']:.3g}), past the tolerance "
                f"{f['kl_tolerance_nats']:.3g} ({KL_TOLERANCE:g} x eager's own {f['eager_kl_nats']:.3g})")
    return (f"at one step the run's KL from fp32 exceeds native eager's by {f['kl_delta_max_step_nats']:.3g} nats a "
            f"token, past {f['kl_step_tolerance_nats']:.3g} ({KL_STEP_TOLERANCE:g} x eager's worst step, "
            f"{f['eager_kl_max_step_nats']:.3g}): a fault at a few positions (a block boundary) that the mean hides")


def fidelity_against_fp32(ref: torch.Tensor, run: torch.Tensor, plain: torch.Tensor) -> dict:
    """Fidelity as decode studies measure it, each [steps, rows, vocab] teacher-forced on the same tokens: per
    step, KL(fp32 || run) and the NLL under the run of fp32's greedy token, the same for native eager (`plain`,
    this dtype, sdpa), and their deltas (run - eager) averaged over rows, with a paired bootstrap 95% interval over
    steps. `fidelity` is "lost" where that interval lies above KL_TOLERANCE x eager's own mean KL, or where one
    step's delta passes KL_STEP_TOLERANCE x eager's worst step (each at least KL_FLOOR_NATS): a fault that touches
    a step or two (a block skipped where the position crosses it) shows there, where one largest logit error over
    all steps can hide it. Else "matched" where the interval reaches 0 or below, "worse" where it lies above 0."""
    run_kl, run_nll, eager_kl, eager_nll = [], [], [], []
    for step in range(ref.shape[0]):  # step by step: [steps, rows, vocab] in fp32, several times, would not fit
        logp = ref[step].float().log_softmax(-1)
        best = logp.argmax(-1, keepdim=True)
        for logits, kl, nll in ((run[step], run_kl, run_nll), (plain[step], eager_kl, eager_nll)):
            logq = logits.float().log_softmax(-1)
            kl.append((logp.exp() * (logp - logq)).sum(-1).double().cpu())
            nll.append(-logq.gather(-1, best)[:, 0].double().cpu())
    run_kl, run_nll, eager_kl, eager_nll = (torch.stack(x).numpy() for x in (run_kl, run_nll, eager_kl, eager_nll))
    kl_steps, nll_steps = (run_kl - eager_kl).mean(axis=1), (run_nll - eager_nll).mean(axis=1)
    (kl_low, kl_high), (nll_low, nll_high) = (paired_mean_interval(d) for d in (kl_steps, nll_steps))
    eager, eager_worst = float(eager_kl.mean()), float(eager_kl.mean(axis=1).max())
    tolerance = max(KL_TOLERANCE * eager, KL_FLOOR_NATS)
    step_tolerance = max(KL_STEP_TOLERANCE * eager_worst, KL_FLOOR_NATS)
    lost = kl_low > tolerance or float(kl_steps.max()) > step_tolerance
    verdict = "lost" if lost else "matched" if kl_low <= 0 else "worse"
    return {"kl_nats": float(run_kl.mean()), "eager_kl_nats": eager, "kl_delta_nats": float(kl_steps.mean()),
            "eager_kl_max_step_nats": eager_worst, "kl_step_tolerance_nats": step_tolerance,
            "kl_delta_low_nats": kl_low, "kl_delta_high_nats": kl_high, "kl_delta_max_step_nats": float(kl_steps.max()),
            "nll_nats": float(run_nll.mean()), "eager_nll_nats": float(eager_nll.mean()),
            "nll_delta_nats": float(nll_steps.mean()), "nll_delta_low_nats": nll_low, "nll_delta_high_nats": nll_high,
            "kl_tolerance_nats": tolerance, "fidelity": verdict}


def _eager_in(model, stepper) -> EagerStepper:
    """A plain eager stepper of the same rows, decoding in `stepper`'s cache from its prefilled context."""
    return EagerStepper(model, stepper.input_ids, stepper.cache_len, rows=stepper.rows, shared=stepper)


def _fp32_rows_at_most(stepper) -> int:
    """The rows whose context fits in FP32_TOKENS."""
    return max(1, min(stepper.bs, FP32_TOKENS // max(stepper.context_len, 1)))


def _fp32_rows(model, stepper) -> int:
    """As many of the batch's rows as an fp32 cache for them fits in half the free GPU memory, and at most
    FP32_TOKENS of context."""
    most = _fp32_rows_at_most(stepper)
    if not stepper.input_ids.is_cuda:
        return most
    torch.cuda.empty_cache()  # the run's cache, just freed
    kv_heads, head_dim = kv_heads_and_dim(model.config)
    per_row = 2 * model.config.num_hidden_layers * kv_heads * head_dim * stepper.cache_len * 4  # K and V, fp32
    return max(1, min(most, int(torch.cuda.mem_get_info()[0] / 2 // per_row)))


@contextmanager
def attention(model, name: str):
    """The model with another attention backend for the duration."""
    before = model.config._attn_implementation
    if before != name:
        model.set_attn_implementation(name)
    try:
        yield
    finally:
        if before != name:
            model.set_attn_implementation(before)


@contextmanager
def computed_in_fp32(model):
    """The model computing in fp32 from its own weights, with transformers' sdpa attention and its eager experts
    loop (the plainest kernels). Each module widens its parameters as it runs and gets the very same
    Parameter objects back after (graphs captured on them stay valid): a whole fp32 copy of a 30B model
    (122 GB) would not fit beside it."""
    hooks = [h for module in model.modules() if module._parameters
             for h in (module.register_forward_pre_hook(_widen), module.register_forward_hook(_narrow, always_call=True))]
    experts = getattr(model.config, "_experts_implementation", None)
    try:
        with attention(model, "sdpa"):
            if experts not in (None, "eager"):
                model.set_experts_implementation("eager")
            yield model
    finally:
        if experts not in (None, "eager"):
            model.set_experts_implementation(experts)
        for hook in hooks:
            hook.remove()


def _widen(module, args):
    module._narrow_parameters = dict(module._parameters)
    for name, param in module._narrow_parameters.items():
        if param is not None and param.is_floating_point():
            module._parameters[name] = param.float()  # a plain tensor for one call: F.linear & co. take it


def _narrow(module, args, output):
    module._parameters.update(module.__dict__.pop("_narrow_parameters", {}))
