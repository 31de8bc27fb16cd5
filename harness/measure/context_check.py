"""What every check of a run stands on, checked apart from the references: the context the prefill left (its
digest, taken after the prefill and found intact after the loop; the cache handed to the next job only then), the
cache's write position after a rewind, the positions verification decodes and the blocks a backend plans to read
there, and the tokens the loop recorded (each an argmax of the logits its call returned)."""
from __future__ import annotations

import torch

from harness.kernels import ATTENTION, attention_spec
from harness.modes import kept_context
from harness.modes.base import pad_rows
from harness.measure import mutations, references
from harness.measure.timing import recorded_not_argmax, write_positions

VERIFY_TOKENS = 32  # steps compared logit by logit


def verified_steps(attn: str, context_len: int, cache_len: int) -> int:
    """VERIFY_TOKENS steps from the context, or more where the attention backend reads the cache in blocks and those
    steps would decode at no block edge: then up to two steps past the first position that starts a block (flex's
    128 slots, triton-decode's 64), so that a fault at an edge (a block not read, a chunk dropped) is decoded under
    the checks at the job's own context; as far as the cache holds."""
    edge = attention_spec(attn).edge
    first_edge = -(-context_len // edge) * edge  # the first position >= the context that starts a block
    return max(VERIFY_TOKENS, min(first_edge - context_len + 3, cache_len - context_len))


def rewound_to_the_context(stepper, context_len: int) -> str | None:
    """After a rewind, every layer of the cache must write at the context's end, counted from the prompt itself
    (not from the stepper's own bookkeeping): every check below rewinds the same way, so a rewind that is off by
    a slot would move the run and its references alike, and only this count sees it."""
    positions = write_positions(stepper)  # a sync: after timing
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


def context_changed(stepper, digest: torch.Tensor, metrics: dict) -> str | None:
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


def read_plan_problem(attn: str, context_len: int, steps: int, cache_len: int, device, metrics: dict,
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


def context_fills(model, stepper) -> tuple:
    """What decides a stepper's context K/V besides its prompt: the model's weights, the attention its prefill
    runs (AttentionSpec.prefill: SDPA for every backend that decodes with its own kernels), and the cache's rows,
    capacity and dtype. Two jobs with the same, and the same prompt, prefill the very same context."""
    attn = model.config._attn_implementation
    prefill = ATTENTION[attn].prefill if attn in ATTENTION else attn  # a backend the registry does not know: its own
    return references.weights_key(model), prefill, stepper.rows, stepper.cache_len, str(stepper.cache.layers[0].keys.dtype)


def keep_or_release(model, prompt, stepper, failure: str | None,
                    offer: tuple[float, str] | None = None) -> None:
    """Hand the run's cache to the next job of the sweep (kept_context), where the job offered it (`offer`: the
    prefill's tokens a second and whose prefill it was, references.JobReferences.context_offer), the run passed, no
    test's fault acted in it, and its context still sums slot by slot to what the prefill left; else free it."""
    cache = None if isinstance(stepper, mutations.MutatedStepper) else stepper.cache
    if (offer is not None and failure is None and cache is not None and cache.layers[0].keys is not None
            and torch.equal(digest := context_digest(stepper), stepper.prefilled_context_digest)):
        fills = context_fills(model, stepper)
        kept_context.keep(kept_context.Filled(stepper.hand_over_cache(), fills, pad_rows(prompt, stepper.rows),
                                              stepper.first_ids, digest, *offer))
    stepper.release()
