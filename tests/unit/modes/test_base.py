"""What every mode shares (harness/modes/base.py): prefill, padding rows."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.measure.job import seeded_prompt
from harness.measure.timing import run_steps
from harness.modes.base import prefill, static_cache, pad_rows
from harness.modes.eager import EagerStepper
from tests.support import FAST, run_config


@pytest.mark.usefixtures("fresh_model_cache")
def test_prefill_returns_one_token_per_row():
    cfg = run_config(*FAST, "device=cpu", "bs=3")
    model = models.get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    cache = static_cache(model, 3, 32, torch.device("cpu"))
    prompt = seeded_prompt(3, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        first = prefill(model, cache, prompt)
    assert first.shape == (3, 1) and int(cache.get_seq_length()) == 8


CPU = torch.device("cpu")


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
