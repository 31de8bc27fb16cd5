"""harness/modes/base.py: the chunked prefill."""
from __future__ import annotations

import pytest
import torch

from harness.measure.job import seeded_prompt
from harness.modes import base
from harness.modes.eager import EagerStepper
from tests.unit.kernels.support import CPU, _forced_logits, _tiny


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def test_a_long_context_is_prefilled_in_chunks_to_the_same_cache(monkeypatch):
    model = _tiny("sdpa", bs=1)
    prompt = seeded_prompt(1, 300, model.config.vocab_size, 0, CPU)
    tokens = [prompt[:, i:i + 1] for i in range(4)]
    with torch.inference_mode():
        whole = _forced_logits(EagerStepper(model, prompt, 512), tokens)
        monkeypatch.setattr(base, "PREFILL_MASK_ELEMENTS", 512 * 128)  # 128-token chunks: 128 + 128 + 44
        monkeypatch.setattr(base, "PREFILL_FORWARD_TOKENS", 256)  # the whole context is past one forward's tokens
        assert base.prefill_chunk(1, 300, 512) == 128 and base.staged_prefill_chunk(1, 300) == 128
        chunked = _forced_logits(EagerStepper(model, prompt, 512), tokens)
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()


def test_a_context_that_fits_one_forward_is_prefilled_in_one(monkeypatch):
    """One causal forward needs no mask (SDPA's flash kernel on a GPU); a chunk after the first attends through one.
    The model is called once per group of rows where the group's context fits PREFILL_FORWARD_TOKENS, and in chunks
    past it (a rule that chunked by the mask alone, or always, would call it more often)."""
    assert base.staged_prefill_chunk(1, 32768) == 32768  # the context preset's longest, one row a group: one forward
    model = _tiny("sdpa", bs=2)
    prompt = seeded_prompt(2, 300, model.config.vocab_size, 0, CPU)
    calls = []
    hook = model.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                                 with_kwargs=True)
    try:
        with torch.inference_mode():
            monkeypatch.setattr(base, "PREFILL_MASK_ELEMENTS", 2 * 300 * 128)  # the mask rule alone: 128-token chunks
            EagerStepper(model, prompt, 512)
            assert calls == [(2, 300)]
            calls.clear()
            monkeypatch.setattr(base, "PREFILL_FORWARD_TOKENS", 2 * 299)
            EagerStepper(model, prompt, 512)
            assert calls == [(2, 128), (2, 128), (2, 44)]
    finally:
        hook.remove()
