"""The decodes the checks compare, each kept as a Trace (logits and the tokens fed): the run decoding again from its
prefilled context after its timed loop (the free run), and a stepper fed given tokens after its first one (teacher
forcing: eager fed the run's tokens is the reference of the lockstep, harness/measure/lockstep.py, and of the
fp32 check, harness/measure/fidelity.py). Checks call these through the module (`traces.forced`), so that a test
that counts the reference decodes sees every one."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.modes.eager import EagerStepper
from harness.measure.timing import advance


@dataclass
class Trace:
    """A decode's logits at the last token of each call [calls, bs, vocab], and the tokens fed [steps, bs]."""

    logits: torch.Tensor
    tokens: torch.Tensor


def free_run(stepper, calls: int, decoded: torch.Tensor | None = None) -> Trace:
    """The run decoding again from its context, fed after each step the token its timed loop decoded there
    (`decoded`, [steps, bs]), or, where its graph feeds itself, past the loop's tokens or with none given, its own
    argmax. On the loop's path, the eager decode that gives the token check its gaps is also the lockstep's
    reference (one pass, lockstep.one_pass_serves_both), where a greedy run that one near-tie sent elsewhere
    (eager's own variation, at bs 8 and 32 on the H200) needs two; the loop's tokens were the run's own greedy
    choices, which that check judges."""
    feeds = decoded is not None and not stepper.feeds_itself and stepper.tokens_per_step == 1
    follow = min(decoded.shape[0], calls) if feeds else 0
    logits, tokens = [], []
    if follow:  # on the loop's path: fed its tokens as a reference is
        followed = forced(stepper, decoded[:follow])
        logits, tokens = list(followed.logits), [followed.tokens]
    for _ in range(calls - follow):
        logits.append(advance(stepper).clone())  # a compiled step may overwrite its output at the next call
        tokens.append(stepper.tokens.clone())
    return Trace(torch.stack(logits), torch.cat(tokens))


def forced(stepper, tokens: torch.Tensor, k: int = 1) -> Trace:
    """An eager stepper fed `tokens` [steps, bs] after its first token; logits at every k-th step."""
    logits = []
    for i in range(tokens.shape[0]):
        out = stepper.step()
        if i % k == k - 1:
            logits.append(out.clone())
        stepper.input_ids.copy_(tokens[i][:, None])
    return Trace(torch.stack(logits), tokens)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def eager_in(model, stepper) -> EagerStepper:
    """A plain eager stepper of the same rows, decoding in `stepper`'s cache from its prefilled context."""
    return EagerStepper(model, stepper.input_ids, stepper.cache_len, rows=stepper.rows, shared=stepper)
