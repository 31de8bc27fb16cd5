"""A mode proves its decode: its greedy tokens (and logits) against plain eager calls of the same model."""
from __future__ import annotations

import torch

from harness.modes.base import Stepper
from harness.modes.eager import EagerStepper
from harness.timing import advance

VERIFY_TOKENS = 32  # graph modes must reproduce eager's first 32 greedy tokens
VERIFY_LOGIT_ROWS = 8  # rows whose logits are kept for the max |difference| (rows are independent)
INEXACT_LOGIT_TOLERANCE = 0.05  # an inexact mode's logits may differ by this fraction of their scale


def verify_tokens(model, prompt: torch.Tensor, stepper: Stepper, cache_len: int, n: int, exact: bool = True) -> dict:
    """Compare n greedy tokens of the mode's stepper with those of plain eager calls.

    Exact modes decode freely and must reproduce eager's tokens. Inexact ones (compiled: other
    kernels, other rounding) are fed eager's tokens at every step, so that one near-tie flip does not
    derail the rest; a differing token is tolerated only where eager's top-2 logits are closer than
    twice the largest logit difference measured (a tie that rounding can flip).
    """
    reference = EagerStepper(model, prompt, cache_len)
    eager_tokens, eager_logits, eager_gaps = _greedy(reference, n)
    del reference  # its cache
    stepper.restart(prompt)
    tokens, logits, _ = _greedy(stepper, n, forced=None if exact else eager_tokens)
    differs = tokens != eager_tokens
    steps = sorted(set(logits) & set(eager_logits))
    delta = float(torch.stack([(logits[i].float() - eager_logits[i].float()).abs().max() for i in steps]).max())
    scale = float(torch.stack([eager_logits[i].float().abs().max() for i in steps]).max())
    if exact:
        ok = not bool(differs.any())
    else:
        ok = bool((eager_gaps[differs] <= 2 * delta).all()) and delta <= INEXACT_LOGIT_TOLERANCE * scale
    mismatch = differs.any(dim=1).nonzero()
    return {
        "match": ok,
        "token_agreement": float((~differs).float().mean()),
        "first_mismatch": int(mismatch[0]) if mismatch.numel() else None,
        "max_logit_diff": delta,
    }


def _greedy(stepper: Stepper, n: int, forced: torch.Tensor | None = None):
    """n greedy tokens [n, bs]; the logits of the first rows at every step that exposes them; and the
    gap between the top-2 logits of every row [n, bs]. With `forced`, those tokens are fed instead."""
    tokens = torch.empty(n, stepper.bs, dtype=torch.long, device=stepper.input_ids.device)
    gaps = torch.empty(n, stepper.bs, device=stepper.input_ids.device)
    logits, done = {}, 0
    while done < n:
        out = advance(stepper)
        k = min(stepper.tokens_per_step, n - done)
        tokens[done:done + k].copy_(stepper.tokens[:k])
        if k == stepper.tokens_per_step:
            logits[done + k - 1] = out[:VERIFY_LOGIT_ROWS].clone()
            top2 = out.float().topk(2, dim=-1).values
            gaps[done + k - 1].copy_(top2[:, 0] - top2[:, 1])
        if forced is not None:
            stepper.input_ids.copy_(forced[done][:, None])
        done += k
    return tokens, logits, gaps
