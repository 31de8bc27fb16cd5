"""What every mode shares (harness/modes/base.py): prefill, padding rows."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.measure.job import seeded_prompt
from harness.measure.timing import run_steps
from harness.modes import base
from harness.modes.base import prefill, static_cache, pad_rows
from harness.modes.eager import EagerStepper
from tests.support import FAST, run_config
from tests.unit.kernels.support import CPU, _forced_logits, _tiny


@pytest.mark.usefixtures("fresh_model_cache")
def test_prefill_returns_one_token_per_row():
    cfg = run_config(*FAST, "device=cpu", "bs=3")
    model = models.get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    cache = static_cache(model, 3, 32, torch.device("cpu"))
    prompt = seeded_prompt(3, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        first = prefill(model, cache, prompt)
    assert first.shape == (3, 1) and int(cache.get_seq_length()) == 8




@pytest.mark.usefixtures("fresh_model_cache")
def test_padding_rows_are_added_and_real_rows_kept():
    prompt = torch.arange(6).reshape(3, 2)
    padded = pad_rows(prompt, 4)
    assert padded.shape == (4, 2) and torch.equal(padded[:3], prompt) and padded[3].sum() == 0
    assert pad_rows(prompt, 3) is prompt


@pytest.mark.usefixtures("fresh_model_cache")
def test_padded_rows_do_not_change_the_real_rows_tokens():
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=3")
    model = models.get_model(cfg.model, "fp32", "sdpa", CPU, 0).model
    prompt = seeded_prompt(3, 8, model.config.vocab_size, 0, CPU)
    with torch.inference_mode():
        exact, padded = EagerStepper(model, prompt, 64), EagerStepper(model, prompt, 64, rows=4)
        assert padded.input_ids.shape == (3, 1) and padded.static_ids.shape == (4, 1)
        for stepper in (exact, padded):
            run_steps(stepper, 6)
        assert torch.equal(exact.input_ids, padded.input_ids)


@pytest.mark.parametrize("staging_bytes, mask_elements, forward_tokens", [(4 << 30, 1 << 28, 1 << 16), (1, 1 << 12, 1)])
def test_a_prefill_of_the_valid_prefix_decodes_what_transformers_prefill_into_the_whole_cache_does(
        monkeypatch, staging_bytes, mask_elements, forward_tokens):
    """The fill that reads only the context (staged in a DynamicCache, rows in groups, the context in chunks: the
    second case forces one row a group and chunks of 128 tokens) against transformers' prefill into the static
    cache, each then decoding teacher-forced on the same tokens: the same first token, K/V, write position and
    greedy tokens, and logits equal within fp32 rounding."""
    import torch

    from harness import models
    from harness.measure.job import seeded_prompt
    from harness.modes import base
    from harness.modes.eager import EagerStepper

    monkeypatch.setattr(base, "PREFILL_STAGING_BYTES", staging_bytes)
    monkeypatch.setattr(base, "PREFILL_MASK_ELEMENTS", mask_elements)
    monkeypatch.setattr(base, "PREFILL_FORWARD_TOKENS", forward_tokens)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "model.tie_word_embeddings=false")
    model = models.get_model(cfg.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(3, 300, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        valid = EagerStepper(model, prompt, 512)
        whole = EagerStepper(model, prompt, 512, prefill=False)
        whole.first_ids = base.prefill_over_every_slot(model, whole.cache, prompt)
        whole.context_len = 300
        whole.rewind()
        assert torch.equal(valid.first_ids, whole.first_ids)
        for a, b in zip(valid.cache.layers, whole.cache.layers):
            assert int(a.cumulative_length) == int(b.cumulative_length) == 300
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
        for _ in range(16):  # teacher-forced: both fed the valid-prefix run's greedy token
            x, y = valid.step(), whole.step()
            assert torch.equal(x.argmax(-1), y.argmax(-1)) and float((x - y).abs().max()) < 1e-4
            for stepper in (valid, whole):
                stepper.input_ids.copy_(x.argmax(-1, keepdim=True))


@pytest.mark.usefixtures("fresh_model_cache")
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


@pytest.mark.usefixtures("fresh_model_cache")
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
