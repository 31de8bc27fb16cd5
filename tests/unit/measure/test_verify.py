"""Verification (harness/measure/verify.py). Checks that fail closed: each test reaches a plausible bug through the
real code's inputs or the harness's mutation registry (harness/measure/mutations.py), never a copy of the code in
the test, and sees the run fail; the same test passes the run without the fault."""
from __future__ import annotations

import copy as copy_module
import sys

import pytest
import torch

from harness import models
from harness.measure import mutations, references
from harness.measure.context_check import VERIFY_TOKENS
from harness.measure.fidelity import INEXACT_BOUND, computed_in_fp32
from harness.measure.job import measure, seeded_prompt
from harness.measure.lockstep import RECHECKS, TIE_TOLERANCE, decoded_tokens as judge_tokens, exact as judge_logits
from harness.measure.timing import run_steps, timed_decode
from harness.measure.traces import Trace, free_run as _free_run
from harness.measure.verify import verify
from harness.modes import MODES, ModeSpec
from harness.modes.base import DecodeMode, Stepper
from harness.modes.eager import EagerStepper
from tests.support import FAMILIES, FAST, run_config, tiny_fp32


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_a_rewind_one_slot_off_fails_the_run(monkeypatch):
    """K/V written one slot too far after every rewind: the run, eager's references and the fp32 calibration
    would all be rewound alike; the write position, counted from the prompt, is not. The real Stepper.rewind runs in
    both jobs: as it is (the run must pass), and asked through the mutation registry to rewind one slot past the
    context (the run must fail, naming the slot)."""
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "repeats=2")
    clean = measure(cfg)
    assert clean.failure is None and clean.metrics["verified"] == 1.0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "rewind_one_slot_off")
    result = measure(cfg)
    assert result.failure is not None and result.metrics["verified"] == 0.0
    assert result.failure.startswith("after a rewind the cache writes at slot 9, not after the 8 context tokens")


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_a_loop_that_records_its_input_token_not_its_argmax_fails_the_run(monkeypatch):
    """Every token the loop records (warm-up and every timed block) is checked against the logits its call returned.
    A loop that records what a call read instead of the argmax it fed on, put in the loop's own recording through the
    mutation registry: on the untied tiny model a timed loop with this very fault passed every other check."""
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "decode_tokens=16", "model.tie_word_embeddings=false")
    clean = measure(cfg)
    assert clean.failure is None and clean.metrics["recorded_tokens_argmax"] == 1.0
    assert clean.metrics["recorded_tokens_checked"] == (2 + 16) * 2  # each call of the warm-up and the block, each row
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "input_token_recorded")
    result = measure(cfg)
    assert result.metrics["verified"] == 0.0 and result.metrics["recorded_tokens_argmax"] == 0.0
    assert result.failure.startswith("the token recorded for call 0 of the warm-up is not an argmax of the logits "
                                     "that call returned"), result.failure


class TwoTokenStepper(Stepper):
    """Two greedy steps a call, argmax and feeding inside (as a K-step graph does)."""

    tokens_per_step, feeds_itself = 2, True

    def step(self):
        rows = []
        for _ in range(2):
            logits = self.forward()[: self.bs]
            self.input_ids.copy_(logits.argmax(dim=-1, keepdim=True))
            rows.append(self.input_ids[:, 0].clone())
        self.tokens = torch.stack(rows)
        return logits


class LastTokenOnlyStepper(TwoTokenStepper):
    """Two steps a call that show only the last step's token: the first step's is lost to every check."""

    def step(self):
        logits = super().step()
        self.tokens = self.tokens[-1:]
        return logits


class RunnerUpFirstStepper(TwoTokenStepper):
    """Two steps a call whose first step feeds its second-best token (an argmax inside the graph gone wrong),
    shown as it is: every call's returned logits follow their history, only the tokens inside a call are wrong."""

    def step(self):
        rows = []
        for index in range(2):
            logits = self.forward()[: self.bs]
            self.input_ids.copy_(logits.topk(2 - index, dim=-1).indices[:, -1:])
            rows.append(self.input_ids[:, 0].clone())
        self.tokens = torch.stack(rows)
        return logits


def inexact_two_token_mode(monkeypatch, stepper: type) -> str:
    """A throwaway mode=inexact-two (other kernels than eager's, two tokens a call) whose stepper is `stepper`."""
    class InexactTwoTokenMode(DecodeMode):
        name, exact = "inexact-two", False

        def prepare(self, model, prompt, cfg):
            return stepper(model, prompt, cfg.cache_len, prefill=False)

    monkeypatch.setattr(sys.modules[__name__], "InexactTwoTokenMode", InexactTwoTokenMode, raising=False)
    monkeypatch.setitem(MODES, "inexact-two", ModeSpec("inexact-two", f"{__name__}:InexactTwoTokenMode", graph_steps=True))
    return "mode=inexact-two"


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_run_no_check_applies_to_is_failed_not_verified(monkeypatch):
    mode = inexact_two_token_mode(monkeypatch, LastTokenOnlyStepper)
    result = measure(run_config(*FAST, mode, "device=cpu", "dtype=fp32"))
    assert result.metrics["verified"] == 0.0 and result.metrics["checks_applied"] == 0.0
    assert result.failure.startswith("no check applies: mode=inexact-two computes with other kernels")


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_an_inexact_mode_of_two_tokens_a_call_is_judged_against_fp32_step_by_step(monkeypatch):
    mode = inexact_two_token_mode(monkeypatch, TwoTokenStepper)
    result = measure(run_config(*FAST, mode, "device=cpu", "dtype=fp32", "model.tie_word_embeddings=false"))
    assert result.failure is None and result.metrics["verified"] == 1.0
    assert result.metrics["checks_applied"] == 1.0 and result.metrics["fp32_max_logit_err"] < 1e-3


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_wrong_token_inside_a_call_of_two_steps_fails_the_run(monkeypatch):
    mode = inexact_two_token_mode(monkeypatch, RunnerUpFirstStepper)
    result = measure(run_config(*FAST, mode, "device=cpu", "dtype=fp32", "model.tie_word_embeddings=false"))
    assert result.metrics["verified"] == 0.0
    assert result.failure.startswith("the token the run decoded at step 0 (inside a call of several) ranks ")


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_model_cache")
def test_every_applicable_check_is_counted():
    plain = measure(run_config(*FAST, "device=cpu", "dtype=fp32")).metrics  # eager's, sdpa: the reference kernels
    flex = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "attn=flex", "cache_len=128")).metrics
    assert (plain["checks_applied"], plain["verified"]) == (1.0, 1.0) and "fp32_max_logit_err" not in plain
    assert (flex["checks_applied"], flex["verified"]) == (2.0, 1.0) and "fp32_max_logit_err" in flex
    # flex's read plan checked at every verified position; sdpa has none to check (not applied, not passed)
    assert flex["read_plan_positions_checked"] == flex["verified_steps"] and "read_plan_positions_checked" not in plain


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("context", [8, 128])
def test_flex_planning_one_block_short_fails_the_run(monkeypatch, context):
    """flex's block count one short where the position is a multiple of 128. On a CPU flex's unfused path reads
    every block whatever the count, so the logits stay right and only the check of its read plan sees the fault:
    at context 8 the verified window reaches slot 128, at context 128 it starts there. The real planner
    (decode_block_mask) runs: as it is, the run passes with its plan checked at slot 128; asked through the mutation
    registry for the position before (ceil(position / 128) blocks: one short at a block's first slot, the same
    count elsewhere), the run fails there."""
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "attn=flex", f"context_len={context}", "cache_len=256")
    if context == 128:  # (at context 8 test_every_applicable_check_is_counted runs the clean job across slot 128)
        clean = measure(cfg)
        assert clean.failure is None and clean.metrics["read_plan_positions_checked"] == clean.metrics["verified_steps"]
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "read_plan_one_behind")
    result = measure(cfg)
    assert result.metrics["verified"] == 0.0
    assert result.failure.startswith("attn=flex plans to read 128 slots for the token at slot 128, short of its 129 "
                                     "valid ones"), result.failure
    with pytest.raises(ValueError, match="attn=sdpa makes none; use attn=flex"):  # where it could not act: refused
        mutations.requested("eager", "sdpa")


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("family", [*FAMILIES, "qwen3 fused"])
def test_the_fp32_reference_equals_a_whole_fp32_copy_and_leaves_the_weights_in_place(family):
    overrides = FAMILIES.get(family, ["model=tiny", "model.fuse_projections=true"])
    cfg = run_config(*FAST, "device=cpu", "dtype=bf16", *overrides)
    model = models._load(cfg.model, torch.bfloat16, "sdpa", torch.device("cpu"), seed=11)[0]
    if cfg.model.fuse_projections:
        assert models.fuse_projections(model) == 2 * cfg.model.num_hidden_layers
    before = {name: (param, param.clone()) for name, param in model.named_parameters()}
    prompt = seeded_prompt(2, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        copy = copy_module.deepcopy(model).float()
        if family == "qwen3_moe":
            copy.set_experts_implementation("eager")
        with computed_in_fp32(model):
            widened = model(prompt).logits
        assert widened.dtype == torch.float32 and torch.equal(widened, copy(prompt).logits)
        assert model.config._attn_implementation == "sdpa" and model(prompt).logits.dtype == torch.bfloat16
    for name, param in model.named_parameters():
        assert param is before[name][0] and torch.equal(param, before[name][1]), name


class BiasedStepper(EagerStepper):
    """A broken mode: it always prefers token 7."""

    def step(self):
        logits = super().step().clone()
        logits[:, 7] += 1e4
        return logits


def _decoded_tokens(stepper, cfg):
    warm = run_steps(stepper, cfg.warmup)
    return torch.cat([warm, timed_decode(stepper, cfg.decode_tokens, torch.device("cpu")).tokens])


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_verification_catches_a_mode_whose_logits_differ():
    cfg, model, prompt = tiny_fp32()
    with torch.inference_mode():
        plain = EagerStepper(model, prompt, 64)
        same, ok = verify(model, prompt, plain, cfg, True, _decoded_tokens(plain, cfg))
        biased = BiasedStepper(model, prompt, 64)
        broken, why = verify(model, prompt, biased, cfg, True, _decoded_tokens(biased, cfg))
    # equal bit for bit: it passes at any variation of eager's, and none is measured
    assert ok is None and same["max_logit_diff"] == 0.0 and "eager_self_max_logit_diff" not in same
    assert same["tokens_match"] == 1.0 and same["decoded_tokens_checked"] == (2 + 8) * 2 and same["verified"] == 1.0
    assert why.startswith("logits differ from eager's (same kernels, 2 rows) by up to 1e+04 over 32 steps, "
                          "where eager differs from itself by 0")
    assert broken["verified"] == 0.0


class NoisyStepper(EagerStepper):
    """An inexact mode: eager plus noise of a given size on every logit."""

    noise = 0.0

    def step(self):
        logits = super().step()
        return logits + self.noise * torch.randn_like(logits.float()).to(logits.dtype)


def _noisy_run_verified(noise: float) -> tuple[dict, str | None]:
    """An inexact mode of the tiny model in bf16 at bs=4 (eager plus `noise` on every logit), verified."""
    cfg = run_config(*FAST, "device=cpu", "bs=4", "dtype=bf16")
    model = models.get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(4, 8, model.config.vocab_size, 0, torch.device("cpu"))
    stepper = NoisyStepper(model, prompt, 64)
    stepper.noise = noise
    with torch.inference_mode():
        return verify(model, prompt, stepper, cfg, False, torch.empty(0))


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("noise, passes", [(1e-3, True), (5.0, False)])
def test_an_inexact_mode_is_judged_against_fp32_within_eager_own_error(noise, passes):
    checks, why = _noisy_run_verified(noise)
    assert 0 < checks["eager_fp32_max_logit_err"] < 0.5  # bf16 eager's own rounding against fp32 (tiny: ~0.2)
    assert checks["fp32_err_bound"] == pytest.approx(INEXACT_BOUND * checks["eager_fp32_max_logit_err"])
    assert (why is None) == passes, why
    if not passes:
        assert why.startswith("logit error against fp32 ")


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("noise, passes", [(1e-3, True), (5.0, False)])
@pytest.mark.slow
def test_plain_eager_and_fp32_decode_only_the_rows_fp32_checks(monkeypatch, noise, passes):
    # at a long context fp32 checks one or two rows of a batch: plain eager, the bound's unit, decodes those rows
    # from the run's context K/V in a cache of their own, not every row of the batch in the run's cache
    from harness.measure import fidelity, traces

    monkeypatch.setattr(fidelity, "FP32_TOKENS", 16)  # 16 tokens of context 8: two rows of the batch of four
    decoded_rows = []
    forced, teacher_forced = traces.forced, fidelity._teacher_forced
    monkeypatch.setattr(traces, "forced", lambda stepper, tokens, k=1: (
        decoded_rows.append(("steps", stepper.rows, stepper.cache.layers[0].keys.dtype)), forced(stepper, tokens, k))[1])
    monkeypatch.setattr(fidelity, "_teacher_forced", lambda stepper, tokens: (
        decoded_rows.append(("forwards", stepper.rows, stepper.cache.layers[0].keys.dtype)),
        teacher_forced(stepper, tokens))[1])
    checks, why = _noisy_run_verified(noise)
    # plain eager step by step (the rounding the bound is in units of), then fp32 teacher-forced: two rows each
    assert decoded_rows == [("steps", 2, torch.bfloat16), ("forwards", 2, torch.float32)]
    assert checks["fp32_rows_checked"] == 2 and 0 < checks["eager_fp32_max_logit_err"] < 0.5
    assert (why is None) == passes, why


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("logits_bytes", [1 << 30, 1])  # one forward over every token; a forward per token
@pytest.mark.slow
def test_the_teacher_forced_fp32_reference_is_the_step_by_step_decode(monkeypatch, family, logits_bytes):
    # fp32's logits come from forwards over the run's known tokens: each position must see the history a decode
    # step gives it (the first token, then the tokens fed before it), whatever the chunks, in every family
    from harness.measure import fidelity

    monkeypatch.setattr(fidelity, "FORCED_LOGITS_BYTES", logits_bytes)
    cfg = run_config(*FAST, "device=cpu", "dtype=bf16", "bs=3", "context_len=12", "cache_len=64",
                     "model.tie_word_embeddings=false", *FAMILIES[family])
    model = models._load(cfg.model, torch.bfloat16, "sdpa", torch.device("cpu"), seed=3)[0]
    prompt = seeded_prompt(3, 12, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        run = EagerStepper(model, prompt, 64)
        tokens = _free_run(run, 20).tokens
        context = fidelity._context_copy(model, run)
        with computed_in_fp32(model):
            step_by_step, forwards = (fidelity._decode_from(model, prompt, cfg, context, tokens,
                                                                 dtype=torch.float32, step_by_step=by_steps)
                                      for by_steps in (True, False))
    assert forwards.shape == step_by_step.shape == (20, 3, model.config.vocab_size)
    # fp32 rounding of other GEMM shapes, a millionth of the logits; a history off by one token moves them by ~1
    assert float((forwards - step_by_step).abs().max()) < 1e-5 * float(step_by_step.abs().max())


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("mode_and_attn", [["mode=eager", "dtype=fp32"],
                                           pytest.param(["mode=eager", "dtype=bf16", "attn=flex"], marks=pytest.mark.slow)])
def test_a_rewind_that_clears_the_context_end_fails_only_through_the_context_digest(monkeypatch, mode_and_attn):
    # at a long context, the context's last K/V zeroed by every rewind moves the logits little, and the free run and
    # every reference decode from that same damaged context (the fp32 one from a copy of it): only the context's
    # digest, taken after the prefill and kept apart, sees it
    from harness.measure import context_check

    cfg = run_config(*FAST, "device=cpu", "bs=2", "context_len=1000", "cache_len=1280",
                     "model.tie_word_embeddings=false", *mode_and_attn)
    clean = measure(cfg)
    assert clean.failure is None and clean.metrics["context_intact"] == 1.0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "rewind_clears_context_end")
    result = measure(cfg)
    assert result.failure == ("the context's K/V changed after the prefill: 4 slot sums differ, the first at slot 999 "
                              "of layer 0's keys: a decode, a rewind or a check wrote before the context's end")
    assert result.metrics["context_intact"] == 0.0 and result.metrics["verified"] == 0.0
    monkeypatch.setattr(context_check, "context_changed", lambda stepper, digest, metrics: None)
    assert measure(cfg).failure is None  # what the checks before it let through


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_an_unmutated_run_verifies_every_block():
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "repeats=3", "stop=repeats"))
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0 and m["tokens_match"] == 1.0
    assert len(result.step_ms) == 3 * 8 and m["repeats"] == 3.0
    assert m["step_ms_ci_low"] <= m["step_ms_median"] <= m["step_ms_ci_high"]


def _a_wrong_token():
    """A tiny fp32 model's prefilled stepper, and its loop's tokens with one wrong (step 5, row 1), as a loop
    that fed the wrong token would leave them. Call under inference_mode."""
    cfg, model, prompt = tiny_fp32("model.tie_word_embeddings=false")
    stepper = EagerStepper(model, prompt, 64)
    decoded = _decoded_tokens(stepper, cfg)
    decoded[5, 1] = (decoded[5, 1] + 1) % model.config.vocab_size
    return cfg, model, prompt, stepper, decoded


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_token_the_timed_loop_got_wrong_fails_the_run():
    with torch.inference_mode():
        cfg, model, prompt, stepper, decoded = _a_wrong_token()
        checks, why = verify(model, prompt, stepper, cfg, True, decoded)
    assert why.startswith("the decoded token at step 5 (warm-up and first timed block) is not eager's choice")
    assert checks["tokens_match"] == 0.0 and checks["max_logit_diff"] == 0.0  # the lockstep alone saw nothing


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_tie_is_judged_against_the_variation_eager_shows_on_the_same_history():
    """Where eager's own logits vary from pass to pass (kernels that are not deterministic), a token within
    twice that variation of eager's best is a tie; where they do not, the fixed tolerance stands."""
    with torch.inference_mode():
        _, model, prompt, stepper, decoded = _a_wrong_token()
        steady = {}
        assert judge_tokens(model, prompt, stepper, decoded, steady).startswith("the decoded token at step 5")
        noise = model.lm_head.register_forward_hook(lambda mod, args, out: out + 50 * torch.rand_like(out))
        references.forget()  # the hook changes eager's logits where the kept references' keys cannot see it
        varying = {}
        try:
            why = judge_tokens(model, prompt, stepper, decoded, varying)
        finally:
            noise.remove()
    assert steady["tie_tolerance"] == TIE_TOLERANCE and steady["tokens_match"] == 0.0
    assert why is None and varying["tokens_match"] == 1.0 and 50 < varying["tie_tolerance"] <= 200


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_token_fails_for_ranking_below_eager_only_after_eager_is_measured_again():
    """The token check, as the lockstep: eager that agrees with itself over the loop's history twice but varies on
    the third pass (the MoE's eager at bs=8 on the H200) makes a token near eager's best a tie, not a failure."""
    calls = []

    def third_pass_varies(module, args, out):
        calls.append(1)
        return out + (50 * torch.rand_like(out) if len(calls) > 2 * steps else 0)

    with torch.inference_mode():
        _, model, prompt, stepper, decoded = _a_wrong_token()
        steps = decoded.shape[0]
        references.forget()
        hook = model.lm_head.register_forward_hook(third_pass_varies)
        varying = {}
        try:
            why = judge_tokens(model, prompt, stepper, decoded, varying)
        finally:
            hook.remove()
    assert len(calls) == 3 * steps  # the loop's history decoded three times, the third varying
    assert why is None and varying["tokens_match"] == 1.0 and 50 < varying["tie_tolerance"] <= 200


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("steady_passes", [2, 3])
@pytest.mark.slow
def test_a_run_fails_for_differing_from_eager_only_after_eager_is_measured_again(steady_passes):
    """Eager that agrees with itself over its first `steady_passes` passes and varies after (kernels that vary now
    and then): a run off by less than twice that variation passes, the rechecks stopping at the pass that showed
    it; with eager steady, the same run fails."""
    cfg, model, prompt = tiny_fp32()
    calls = []

    def later_passes_vary(module, args, out):
        calls.append(1)
        return out + (torch.rand_like(out) if len(calls) > steady_passes * VERIFY_TOKENS else 0)

    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        stepper.rewind()
        clean = _free_run(stepper, VERIFY_TOKENS)
        run = Trace(clean.logits + 0.01, clean.tokens)  # off by 0.01 everywhere
        steady = {}
        assert "where eager differs from itself by 0" in judge_logits(model, prompt, stepper, run, steady)
        hook = model.lm_head.register_forward_hook(later_passes_vary)
        references.forget()  # the hook changes eager's logits where the kept references' keys cannot see it
        varying = {}
        try:
            why = judge_logits(model, prompt, stepper, run, varying)
        finally:
            hook.remove()
    assert steady_passes < 2 + RECHECKS and len(calls) == (steady_passes + 1) * VERIFY_TOKENS  # rechecks to the variation
    assert why is None and 0.5 < varying["eager_self_max_logit_diff"] <= 1.0 and varying["max_logit_diff"] <= 0.02


class OneStepOffStepper(EagerStepper):
    """An inexact mode wrong at one step only, by a shift of every logit that stays within the 4x max-logit bound
    (as a decode that skips the newest token's block where the position crosses 128 is)."""

    calls = 0

    def step(self):
        logits = super().step()
        self.calls += 1
        if self.calls == 5:  # the free run's 5th step (warm-up and loop steps are not judged against fp32)
            logits = logits + (0.08 * torch.randn_like(logits.float())).to(logits.dtype)
        return logits


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_fault_at_one_step_within_the_max_logit_bound_fails_on_its_kl():
    cfg = run_config(*FAST, "device=cpu", "bs=4", "dtype=bf16")
    model = models.get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(4, 8, model.config.vocab_size, 0, torch.device("cpu"))
    torch.manual_seed(0)
    with torch.inference_mode():
        checks, why = verify(model, prompt, OneStepOffStepper(model, prompt, 64), cfg, False, torch.empty(0))
        clean, ok = verify(model, prompt, EagerStepper(model, prompt, 64), cfg, False, torch.empty(0))
    assert checks["fp32_max_logit_err"] <= checks["fp32_err_bound"]  # the max-logit backstop alone passes it
    assert why is not None and why.startswith("at one step the run's KL from fp32 exceeds native eager's"), why
    assert checks["kl_delta_max_step_nats"] > checks["kl_step_tolerance_nats"]
    # native eager judged as a run: its deltas are 0, its fidelity matched
    assert ok is None and clean["kl_delta_nats"] == 0.0 and clean["kl_delta_max_step_nats"] == 0.0


class SlightlyNoisyStepper(EagerStepper):
    """An inexact mode a little farther from fp32 than eager at every step (noise of 0.01 on every logit): its KL
    delta's whole interval lies above 0, within the tolerance."""

    def step(self):
        logits = super().step()
        return logits + (0.01 * torch.randn_like(logits.float())).to(logits.dtype)


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_worse_fidelity_passes_only_with_a_line_that_says_why():
    """"worse" (the KL from fp32 above native eager's, the whole interval, within the tolerance) never passes
    silently: the run's tag `fidelity_accepted` and its outcome line say by how much and within what. A run that
    matched eager carries no such line. Bug caught: a "worse" run passing with nothing said (the verdict a tag that
    no run acts on)."""
    from types import SimpleNamespace

    from harness.cli.runner import outcome

    cfg = run_config(*FAST, "device=cpu", "bs=4", "dtype=bf16")
    model = models.get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(4, 8, model.config.vocab_size, 0, torch.device("cpu"))
    torch.manual_seed(0)
    with torch.inference_mode():
        noisy, plain = SlightlyNoisyStepper(model, prompt, 64), EagerStepper(model, prompt, 64)
        checks, why = verify(model, prompt, noisy, cfg, False, torch.empty(0))
        clean, ok = verify(model, prompt, plain, cfg, False, torch.empty(0))
    assert why is None and noisy.tags["fidelity"] == "worse"
    assert 0 < checks["kl_delta_low_nats"] <= checks["kl_tolerance_nats"]
    line = noisy.tags["fidelity_accepted"]
    assert line.startswith(f"KL from fp32 {checks['kl_delta_nats']:.3g} nats a token above native eager's (95% "
                           f"interval {checks['kl_delta_low_nats']:.3g} to ") and "\n" not in line
    assert f"within the tolerance {checks['kl_tolerance_nats']:.3g}" in line
    finished = {"step_ms_median": 1.0, "wall_ms_per_step": 1.5}
    said = outcome(SimpleNamespace(status="FINISHED", metrics=finished, mode_tags=noisy.tags))
    assert said == f"done, median 1.000 ms/step, 1.500 ms/step wall; fidelity worse than eager's, accepted: {line}"
    assert ok is None and plain.tags["fidelity"] == "matched" and "fidelity_accepted" not in plain.tags
    assert outcome(SimpleNamespace(status="FINISHED", metrics=finished, mode_tags=plain.tags)).endswith("ms/step wall")


# warm-up and first block cover the 32 verified steps: plain eager's loop holds every reference its checks need
EAGER_LOOP = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "warmup=2", "decode_tokens=32",
              "model.tie_word_embeddings=false"]


def _runner_up_at(decoded: torch.Tensor, logits: list[torch.Tensor], step: int, row: int) -> torch.Tensor:
    """The loop's tokens with one row's token at `step` swapped for that step's runner-up: the path a greedy decode
    takes where eager's own variation flips a near-tie (cuDNN's attention at bs 8 and 32 on the H200)."""
    flipped = decoded.clone()
    flipped[step, row] = logits[step][row].topk(2).indices[1]
    return flipped


def test_the_free_run_follows_the_loops_tokens_and_a_graph_that_feeds_itself_its_own():
    from harness.measure.timing import run_steps
    from harness.measure.traces import forced as _forced, free_run as _free_run

    _, model, prompt = tiny_fp32()
    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        kept = []
        loop = _runner_up_at(run_steps(stepper, 12, kept), kept, step=3, row=1)  # no greedy decode takes it
        stepper.rewind()
        run = _free_run(stepper, 16, loop)
        assert torch.equal(run.tokens[:12], loop) and not torch.equal(run.tokens[3:4], kept[3].argmax(-1)[None])
        assert torch.equal(run.tokens[12:], run.logits[12:].argmax(-1))  # past the loop's tokens: its own argmax
        stepper.rewind()
        forced = _forced(EagerStepper(model, prompt, 64, shared=stepper), run.tokens)  # eager fed the same history
        assert torch.equal(run.logits, forced.logits)
        stepper.rewind()
        stepper.feeds_itself = True  # a K-step graph feeds itself: nothing is written over its feeding
        assert not torch.equal(_free_run(stepper, 12, loop).tokens, loop)


def test_a_run_whose_greedy_path_would_leave_the_loops_is_checked_in_one_eager_pass(monkeypatch):
    """The lockstep's reference is eager fed the free run's tokens, and the token check's is eager fed the loop's:
    one pass where the two are the same tokens. A greedy free run left the loop's path wherever eager's variation
    flipped a near-tie in the loop, and paid a second pass; following the loop's tokens, it pays none, and the
    loop's odd token is still judged by the token check (which, before failing it, measures eager's variation
    over the loop's history in 1 + RECHECKS more passes)."""
    from harness.measure import context_check, lockstep, traces, verify
    from harness.measure.timing import run_steps

    class Run(EagerStepper):  # a mode's stepper: not plain eager, so its loop is not its own reference
        pass

    cfg, model, prompt = tiny_fp32()
    forced, gaps = [], []  # forced: eager's lockstep decodes (the free run, fed the loop's tokens, runs on the Run)
    real_forced, real_gaps = traces.forced, lockstep._token_gaps
    monkeypatch.setattr(traces, "forced", lambda stepper, *a, **kw: (type(stepper) is EagerStepper and forced.append(1))
                        or real_forced(stepper, *a, **kw))
    monkeypatch.setattr(lockstep, "_token_gaps", lambda *a, **kw: gaps.append(1) or real_gaps(*a, **kw))
    with torch.inference_mode():
        stepper = Run(model, prompt, cfg.cache_len)
        kept = []
        decoded = _runner_up_at(run_steps(stepper, context_check.VERIFY_TOKENS + 2, kept), kept, step=3, row=1)
        references.new_job()
        metrics, failure = verify.verify(model, prompt, stepper, cfg, True, decoded)
    assert forced == [] and metrics["max_logit_diff"] == 0.0  # the lockstep's reference: the token check's pass
    assert failure.startswith("the decoded token at step 3 ") and metrics["tokens_match"] == 0.0
    assert len(gaps) == 2 + lockstep.RECHECKS  # that pass, and more over the same history to measure eager's variation


@pytest.mark.slow
def test_a_loop_that_feeds_other_than_its_argmax_fails_against_its_own_logits(monkeypatch):
    """The loop's logits are the reference only for the tokens fed after them: a loop that feeds the runner-up
    (a plausible off-by-one in feeding) fails. The check of every recorded token against its call's own logits sees
    it first, at the warm-up's first call (the checks of the fed tokens' gaps, called without it, are tested above)."""
    from harness.measure import timing

    def runner_up(stepper, logits):
        stepper.input_ids.copy_(logits.topk(2, dim=-1).indices[:, 1:])

    monkeypatch.setattr(timing, "feed_argmax", runner_up)
    result = measure(run_config(*EAGER_LOOP))
    assert result.failure.startswith("the token recorded for call 0 of the warm-up is not an argmax of the logits")
    assert result.metrics["recorded_tokens_argmax"] == 0.0 and result.metrics["verified"] == 0.0


@pytest.mark.slow
def test_the_token_check_takes_the_variation_the_lockstep_measured_before_decoding_a_second_pass():
    """A loop token that ranks below eager's best by more than TIE_TOLERANCE but within twice the logit variation the
    lockstep measured passes as a tie without a second eager pass; with no variation measured, the second pass and
    the rechecks (steady here) find none, and the same token fails."""
    import torch

    from harness.measure.lockstep import RECHECKS, TIE_TOLERANCE, decoded_tokens as _decoded_tokens
    from harness.measure.traces import free_run as _free_run
    from harness.modes.eager import EagerStepper
    from tests.support import tiny_fp32

    _, model, prompt = tiny_fp32()
    passes = []
    with torch.inference_mode():
        stepper = EagerStepper(model, prompt, 64)
        stepper.rewind()
        run = _free_run(stepper, 24)
        top2 = run.logits[-1].topk(2, dim=-1)
        row = int((top2.values[:, 0] - top2.values[:, 1]).argmax())
        gap = float(top2.values[row, 0] - top2.values[row, 1])
        assert gap > TIE_TOLERANCE
        decoded = run.tokens.clone()
        decoded[-1, row] = top2.indices[row, 1]  # the last step's runner-up: the history before it is eager's own
        counter = model.lm_head.register_forward_hook(lambda module, args, out: passes.append(1))
        try:
            references.new_job()
            varied = {"eager_self_max_logit_diff": gap / 2 + 1e-3}
            assert _decoded_tokens(model, prompt, stepper, decoded, varied) is None
            assert len(passes) == 24 and varied["tie_tolerance"] == 2 * varied["eager_self_max_logit_diff"]
            references.new_job()
            references.forget()
            steady = {}
            why = _decoded_tokens(model, prompt, stepper, decoded, steady)
        finally:
            counter.remove()
    assert why.startswith("the decoded token at step 23 ") and len(passes) == 24 + (2 + RECHECKS) * 24
