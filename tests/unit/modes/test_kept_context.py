"""The context a job keeps for the next (harness/modes/kept_context.py)."""
from __future__ import annotations

import pytest
import torch

from harness.measure.job import measure
from harness.modes.eager import EagerStepper
from tests.support import FAST, run_config


KEPT = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "context_len=40", "cache_len=128", "model.tie_word_embeddings=false"]


def _fresh_context(cfg, attn: str) -> list[torch.Tensor]:
    """The context K/V [rows, kv_heads, context, head_dim] per layer that `attn`'s model prefills itself, in a cache
    no job kept (one kept stays kept)."""
    from harness import models
    from harness.measure.job import seeded_prompt
    from harness.modes import kept_context

    model = models.get_model(cfg.model, "fp32", attn, torch.device("cpu"), cfg.seed).model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, torch.device("cpu"))
    kept, kept_context._kept[:] = list(kept_context._kept), []
    try:
        with torch.inference_mode():
            stepper = EagerStepper(model, prompt, cfg.cache_len)
    finally:
        kept_context._kept[:] = kept
    return [t[:, :, :cfg.context_len].clone() for layer in stepper.cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.slow
def test_the_next_job_decodes_from_the_context_the_one_before_filled_where_its_own_prefill_would_fill_the_same():
    """A sweep's jobs of one batch and context (eager under sdpa, then sdpa-gqa and triton-decode, which prefill
    through SDPA too): the first prefills and keeps its cache; each next one decodes from that context, logs that it
    did and where its time to first token comes from, and passes its checks. The kept context is, bit for bit, what
    the next job's own prefill fills. Jobs whose prefill would differ prefill: another prompt (seed), another
    batch, and attn=eager, whose prefill runs eager attention. Bugs caught: a context served to a job of another
    prompt or batch (their checks run in the same cache and would pass), the key not naming the prefill's attention."""
    from harness.modes import kept_context

    first = measure(run_config(*KEPT, "attn=sdpa"))
    assert first.failure is None and first.metrics["prefill_reused"] == 0.0 and len(kept_context._kept) == 1
    kept = [t[:, :, :40].clone() for layer in kept_context._kept[0].cache.layers for t in (layer.keys, layer.values)]
    for attn in ("sdpa-gqa", "triton-decode"):
        assert all(torch.equal(a, b) for a, b in zip(kept, _fresh_context(run_config(*KEPT), attn)))
        follower = measure(run_config(*KEPT, f"attn={attn}"))
        assert follower.failure is None and follower.metrics["verified"] == 1.0
        assert follower.metrics["prefill_reused"] == 1.0
        assert follower.mode_tags["context_from"] == run_config(*KEPT, "attn=sdpa").label
        assert follower.metrics["prefill_tokens_per_s"] == first.metrics["prefill_tokens_per_s"]
    for other in ("attn=eager", "seed=1", "bs=3"):  # each after a job of the same batch, weights and prompt but one
        measure(run_config(*KEPT))
        result = measure(run_config(*KEPT, other))
        assert result.failure is None and result.metrics["prefill_reused"] == 0.0, other
        assert "context_from" not in result.mode_tags


@pytest.mark.slow
def test_a_kept_context_serves_only_the_very_prompt_it_was_filled_from(tmp_path):
    """A checkpoint's weights are the same whatever the seed, and the seed still draws the prompt: a job of another
    seed, the same batch, context and capacity, finds a kept cache of its size, of its weights, and prefills. Bug
    caught: a kept context matched on the prompt's shape only (every check of the job runs in that same cache)."""
    from harness import models

    models._load(run_config(*KEPT).model, torch.float32, "sdpa", torch.device("cpu"), seed=0)[0].save_pretrained(
        tmp_path / "ckpt")
    checkpoint = [*KEPT, f"model.weights={tmp_path / 'ckpt'}"]
    assert measure(run_config(*checkpoint)).metrics["prefill_reused"] == 0.0
    assert measure(run_config(*checkpoint)).metrics["prefill_reused"] == 1.0
    other = measure(run_config(*checkpoint, "seed=1"))
    assert other.failure is None and other.metrics["prefill_reused"] == 0.0


@pytest.mark.slow
def test_a_kept_context_that_changed_after_its_job_is_prefilled_again_and_a_failed_or_faulted_job_keeps_none(
        monkeypatch):
    """A kept context whose slots no longer sum as they did when its job kept it (a write between two jobs) is not
    decoded from: the next job prefills, and its context is then its own prefill's. A job that failed its checks,
    or carried a test's fault (which may act in its prefill), keeps nothing. Bugs caught: a kept context taken on
    its keys alone, a failed run's cache kept."""
    from harness.modes import kept_context

    assert measure(run_config(*KEPT)).failure is None
    with torch.inference_mode():  # one slot of the context, between two jobs
        kept_context._kept[0].cache.layers[1].values[1, 0, 7, 3] += 1.0
    again = measure(run_config(*KEPT))
    assert again.failure is None and again.metrics["prefill_reused"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(
        [t[:, :, :40] for layer in kept_context._kept[0].cache.layers for t in (layer.keys, layer.values)],
        _fresh_context(run_config(*KEPT), "sdpa")))
    from harness.measure import lockstep

    with monkeypatch.context() as patch:  # a run that fails a check, with no fault in its stepper
        patch.setattr(lockstep, "exact", lambda *args: "a check's failure")
        failed = measure(run_config(*KEPT))
    assert failed.failure == "a check's failure" and failed.metrics["prefill_reused"] == 1.0 and not kept_context._kept
    assert measure(run_config(*KEPT)).metrics["prefill_reused"] == 0.0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "kv_lost")
    faulted = measure(run_config(*KEPT))
    assert faulted.failure is not None and faulted.metrics["prefill_reused"] == 0.0 and not kept_context._kept
    monkeypatch.delenv("HARNESS_INJECT_MUTATION")
    assert measure(run_config(*KEPT)).metrics["prefill_reused"] == 0.0 and len(kept_context._kept) == 1


@pytest.mark.slow
def test_a_job_asking_for_a_cache_of_another_size_frees_the_kept_one_first():
    """Only one context is kept, and never beside a cache of another size: a stepper of other rows or capacity
    frees it before allocating its own (on the H200 a kept bs=32 cache at context 32768 is 121 GB). Bug caught: a
    kept cache held until the next one is kept, beside the new job's."""
    from harness.modes import base, kept_context

    assert measure(run_config(*KEPT)).failure is None and kept_context.kept_bytes() > 0
    model = kept_context._kept[0].cache
    layer = model.layers[0]
    cache_bytes = 2 * 2 * layer.keys.numel() * 4  # 2 layers' K and V, fp32; beside them the prompt, digest, ...
    assert cache_bytes < kept_context.kept_bytes() < cache_bytes + (16 << 10)
    from harness import models

    tiny = models.get_model(run_config(*KEPT).model, "fp32", "sdpa", torch.device("cpu"), 0).model
    other = base.static_cache(tiny, 3, 64, torch.device("cpu"))
    assert other is not model and kept_context.kept_bytes() == 0 and not kept_context._kept
