"""What a sweep does not do twice (harness/measure/references.py): kept eager references and the variation an
earlier job measured, each with the check it must not weaken."""
from __future__ import annotations

import pytest
import torch

from harness.measure import references
from harness.measure.job import measure
from tests.support import FAST, run_config


@pytest.mark.slow
def test_the_next_job_of_a_shape_reuses_its_eager_references_and_still_checks_its_own_decode(monkeypatch):
    # the path of every mode but plain eager: one eager pass computed, kept as both references
    monkeypatch.setattr("harness.measure.references.loop_serves_as_reference", lambda stepper, exact: False)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false")
    start = references.hits["computed"]
    first = measure(cfg)
    computed = references.hits["computed"]
    hits = references.hits["hits"]
    again = measure(cfg)
    assert first.failure is None and again.failure is None and again.metrics["verified"] == 1.0
    assert references.hits["computed"] == computed and references.hits["hits"] - hits == 2  # lockstep's, tokens'
    assert computed - start == 2  # the first job: one eager pass kept as both references (equal to eager: no second pass)
    for key in ("max_logit_diff", "tokens_match", "decoded_tokens_checked", "decoded_tokens_at_ties"):
        assert again.metrics[key] == first.metrics[key], key
    other = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "seed=1", "model.tie_word_embeddings=false"))
    assert other.failure is None and references.hits["computed"] > computed  # another prompt: its own references


@pytest.mark.slow
def test_the_next_job_of_a_shape_times_blocks_as_long_as_the_kept_loop_so_that_it_decodes_no_eager_again(monkeypatch):
    # plain eager's block cut to 32 steps by its (slow) pace; the next job of the shape would time 48, and then its
    # token check would decode eager over all 50 of its tokens, where the kept loop covers 34
    shape = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "decode_tokens=48", "cache_len=128",
             "model.tie_word_embeddings=false"]
    eager = measure(run_config(*shape, "time_budget_s=0.001"))
    assert eager.failure is None and eager.metrics["block_steps"] == 32
    monkeypatch.setattr("harness.measure.references.loop_serves_as_reference", lambda stepper, exact: False)  # as graphed
    computed = references.hits["computed"]
    follower = measure(run_config(*shape))
    assert follower.failure is None and follower.metrics["block_steps"] == 32 and len(follower.step_ms) == 32
    assert follower.mode_tags["block_cut"].startswith("32 steps a block, not 48: as many as the loop of an earlier job")
    assert references.hits["computed"] == computed and follower.metrics["decoded_tokens_checked"] == 2 * 34
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "stale_token")  # the cut block still fails a fault
    assert measure(run_config(*shape)).failure.startswith("logits differ from eager's")
    monkeypatch.delenv("HARNESS_INJECT_MUTATION")
    other = measure(run_config(*shape, "seed=1"))  # another prompt: no loop kept for it, the whole block
    assert other.failure is None and other.metrics["block_steps"] == 48 and "block_cut" not in other.mode_tags


# warm-up and first block cover the 32 verified steps: plain eager's loop holds every reference its checks need
EAGER_LOOP = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "warmup=2", "decode_tokens=32",
              "model.tie_word_embeddings=false"]


@pytest.mark.slow
def test_plain_eagers_loop_is_its_own_reference_and_no_eager_step_is_taken_again(monkeypatch):
    from harness.measure import lockstep

    passes = []
    monkeypatch.setattr(lockstep, "_token_gaps", lambda *a, **kw: passes.append(1))  # the eager pass it replaces
    start = references.hits["computed"]
    first = measure(run_config(*EAGER_LOOP))
    assert first.failure is None and first.metrics["verified"] == 1.0 and first.metrics["tokens_match"] == 1.0
    assert passes == [] and references.hits["computed"] == start  # nothing decoded again: the loop was the pass
    assert first.metrics["decoded_tokens_checked"] == 2 * 34 and first.metrics["max_logit_diff"] == 0.0
    hits = references.hits["hits"]
    again = measure(run_config(*EAGER_LOOP))
    assert again.failure is None and references.hits["hits"] - hits == 2 and references.hits["computed"] == start


def test_a_plain_eager_run_that_varies_takes_its_free_run_as_the_second_pass_and_decodes_no_third():
    """Where eager varies (noise on its logits, as SDPA over a long cache does on the H200), plain eager's check needs
    a second eager decode over the loop's tokens to measure that variation: the free run, which followed them in the
    same cache, is that decode, kept as it is. The run passes within that variation, and no reference step is
    computed. Bug caught: a third decode of the same steps (10 s at bs=32, context 32768 on the H200)."""
    from harness import models

    cfg = run_config(*EAGER_LOOP)
    model = models.get_model(cfg.model, cfg.dtype.value, cfg.attn, torch.device("cpu"), cfg.seed).model
    noise = model.lm_head.register_forward_hook(lambda module, args, out: out + 0.5 * torch.rand_like(out))
    try:
        start = references.hits["computed"]
        result = measure(cfg)
    finally:
        noise.remove()
    assert result.failure is None and result.metrics["max_logit_diff"] > 0.1
    assert result.metrics["eager_self_max_logit_diff"] == result.metrics["max_logit_diff"]
    assert references.hits["computed"] == start


def test_a_kept_reference_is_used_only_for_the_very_same_inputs():
    import torch

    calls = []

    def compute():
        calls.append(1)
        return torch.full((2, 3), float(len(calls)))

    shape = ("weights", "sdpa", "torch.float32", 2, 64, 1)
    prompt, first_ids, tokens = torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), torch.arange(6).view(3, 2)
    a = references.reference("forced", shape, [prompt, first_ids, tokens], 0, compute)
    assert torch.equal(references.reference("forced", shape, [prompt, first_ids, tokens.clone()], 0, compute), a)
    changed = tokens.clone()
    changed[2, 1] += 1  # one fed token differs: the reference decodes another history
    assert float(references.reference("forced", shape, [prompt, first_ids, changed], 0, compute)[0, 0]) == 2.0
    assert float(references.reference("forced", shape[:-1] + (2,), [prompt, first_ids, changed], 0, compute)[0, 0]) == 3.0
    assert len(calls) == 3


def _a_job_that_measured_eager_varying():
    """A job whose eager varies (noise on its logits, as SDPA over a long cache does on the H200) checked a clean run:
    the model, prompt, stepper, that run, and the job's metrics (eager's measured variation among them)."""
    import torch

    from harness.measure.context_check import VERIFY_TOKENS
    from harness.measure.lockstep import exact as _exact
    from harness.measure.traces import free_run as _free_run
    from harness.modes.eager import EagerStepper
    from tests.support import tiny_fp32

    _, model, prompt = tiny_fp32()
    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        stepper.rewind()
        clean = _free_run(stepper, VERIFY_TOKENS)
        noise = model.lm_head.register_forward_hook(lambda module, args, out: out + 0.5 * torch.rand_like(out))
        references.new_job()
        earlier = {}
        assert _exact(model, prompt, stepper, clean, earlier) is None and earlier["eager_self_max_logit_diff"] > 0.1
        noise.remove()
    return model, prompt, stepper, clean, earlier


@pytest.mark.slow
def test_an_earlier_jobs_measured_variation_of_eager_serves_a_run_within_it_and_no_further():
    """Eager that varies (noise on its logits, as SDPA over a long cache does on the H200) in the job that computed
    the references: the next job's run within twice that variation passes on the kept passes alone, without an
    eager step; a run beyond it is judged again on eager decodes in its own cache (steady here), and fails."""
    import torch

    from harness.measure.lockstep import exact as _exact
    from harness.measure.traces import Trace

    model, prompt, stepper, clean, earlier = _a_job_that_measured_eager_varying()
    calls = []

    def count(module, args, out):
        calls.append(1)

    with torch.inference_mode():
        counter = model.lm_head.register_forward_hook(count)
        try:
            references.new_job()
            within = {}
            assert _exact(model, prompt, stepper, Trace(clean.logits + 0.01, clean.tokens), within) is None
            assert calls == [] and within["eager_self_max_logit_diff"] == earlier["eager_self_max_logit_diff"]
            references.new_job()
            beyond = {}
            why = _exact(model, prompt, stepper, Trace(clean.logits + 10.0, clean.tokens), beyond)
        finally:
            counter.remove()
    assert why.startswith("logits differ from eager's") and beyond["eager_self_max_logit_diff"] == 0.0 and calls


@pytest.mark.slow
def test_a_variation_an_earlier_job_measured_serves_a_run_that_fed_other_tokens_within_it_and_no_further():
    """The graphed job after eager at a long context on the H200: eager varies, the run's tokens part from eager's at
    a near-tie, so no kept decode applies; eager's variation at this shape and prompt, measured by the earlier job,
    still does. A run within twice it passes on its one eager pass (no second, no rechecks); a run beyond is judged
    on variation measured again in its own cache (steady here), and fails."""
    import torch

    from harness.measure.context_check import VERIFY_TOKENS
    from harness.measure.lockstep import exact as _exact
    from harness.measure.traces import eager_in as _eager_in, forced as _forced

    model, prompt, stepper, clean, earlier = _a_job_that_measured_eager_varying()
    passes = []
    with torch.inference_mode():
        other_tokens = (clean.tokens + 1) % model.config.vocab_size  # another history: no kept decode is for it
        other = _forced(_eager_in(model, stepper), other_tokens)
        counter = model.lm_head.register_forward_hook(lambda module, args, out: passes.append(1))
        try:
            references.new_job()
            within = {}
            other.logits += 0.01
            assert _exact(model, prompt, stepper, other, within) is None
            assert len(passes) == VERIFY_TOKENS and within["eager_variation_reused"] == 1.0  # its one pass, no second
            assert within["eager_self_max_logit_diff"] == earlier["eager_self_max_logit_diff"]
            references.new_job()
            beyond = {}
            other.logits += 10.0
            why = _exact(model, prompt, stepper, other, beyond)
        finally:
            counter.remove()
    assert why.startswith("logits differ from eager's") and beyond["eager_self_max_logit_diff"] == 0.0
    assert "eager_variation_reused" not in beyond and len(passes) > 2 * VERIFY_TOKENS


def _slot_sums(prefix) -> torch.Tensor:
    return torch.stack([t.sum(dim=(0, 1, 3), dtype=torch.float32) for keys, values in prefix for t in (keys, values)])


def test_a_kept_fp32_or_plain_reference_serves_only_the_very_same_context():
    """fp32's and plain eager's references are kept for the next job of a shape, keyed by the prompt, the first
    token, the fed tokens and the context's slot sums. Two contexts of the same prompt and tokens whose K/V differ in
    one slot: the second must get references computed from its own K/V, as a cold start computes them. Bug caught:
    the key without the slot sums (the first context's references served to a context they were not computed from)."""
    from harness.measure import fidelity, references, traces
    from harness.measure.fidelity import ContextCopy
    from harness.modes.eager import EagerStepper
    from tests.support import tiny_fp32

    cfg, model, prompt = tiny_fp32()
    with torch.inference_mode():
        run = EagerStepper(model, prompt, cfg.cache_len)
        trace = traces.free_run(run, 6)
        context = fidelity._context_copy(model, run)
        other = ContextCopy([(k.clone(), v.clone()) for k, v in context.prefix], context.first_ids, context.rows)
        other.prefix[0][0][:, :, 3] += 0.5  # layer 0's keys at slot 3

        def both(ctx: ContextCopy) -> tuple[torch.Tensor, torch.Tensor]:
            sums = _slot_sums(ctx.prefix)
            return (fidelity._plain_reference(model, prompt, cfg, ctx, trace, sums, 1),
                    fidelity._fp32_reference(model, prompt, cfg, ctx, trace, sums))

        first = both(context)
        served = both(other)
        references.forget()
        cold = both(other)
    for kept, fresh, original in zip(served, cold, first):
        assert torch.equal(kept, fresh) and not torch.equal(kept, original)
