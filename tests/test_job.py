"""The measurement itself, in process, on the tiny model on CPU."""
from __future__ import annotations

import copy as copy_module

import pytest
import torch

from harness import models
from harness.errors import ConfigError
from harness.measure.job import JobError, measure, seeded_prompt
from harness.measure.timing import run_steps, timed_decode
from harness.measure import references
from harness.measure.context_check import VERIFY_TOKENS
from harness.measure.fidelity import INEXACT_BOUND, computed_in_fp32
from harness.measure.lockstep import RECHECKS, TIE_TOLERANCE, decoded_tokens as judge_tokens, exact as judge_logits
from harness.measure.traces import Trace, free_run as _free_run
from harness.measure.verify import verify
from harness.modes.base import prefill, static_cache
from harness.modes.eager import EagerStepper
from harness.measure.stats import step_stats
from tests.support import FAST, run_config, tiny_fp32


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def test_eager_decode_on_cpu_reports_every_number():
    result = measure(run_config(*FAST, "bs=2", "device=cpu"))
    m = result.metrics
    assert len(result.step_ms) == 8 and result.step_clock == "host"
    for key in ("mean", "median", "p90", "p99", "min", "max", "stdev", "cv"):
        assert m[f"step_ms_{key}"] >= 0
    assert m["step_ms_min"] <= m["step_ms_median"] <= m["step_ms_max"]
    assert m["tokens_per_s"] == pytest.approx(2 * 1000 / m["step_ms_median"])
    assert m["wall_ms_per_step"] >= m["step_ms_mean"]
    assert m["prefill_ms"] > 0 and m["warmup_ms"] > 0 and m["build_ms"] > 0
    assert m["prefill_tokens_per_s"] == pytest.approx(2 * 8 / m["prefill_ms"] * 1e3)
    assert m["kv_slots_valid"] == 8 + 2 + 4.5 and m["kv_slots_read"] == 64 and m["waste_factor"] > 1  # FAST: ctx 8, cache 64
    assert result.weights == "random" and result.weights_source == "seed=0 std=0.25"
    assert result.architecture["num_hidden_layers"] == 2
    assert result.environment["device"] == "cpu"
    assert result.failure is None


def test_a_sweep_reuses_the_model_it_built():
    first = measure(run_config(*FAST, "device=cpu", "bs=1"))
    second = measure(run_config(*FAST, "device=cpu", "bs=2"))
    assert not first.model_reused and second.model_reused
    assert second.metrics["build_ms"] == 0.0


def test_graphed_without_cuda_fails_with_a_clear_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(JobError, match="mode=graphed needs a CUDA GPU"):
        measure(run_config(*FAST, "mode=graphed"))


def test_seeded_random_weights_are_reproducible():
    cfg = run_config(*FAST, "device=cpu")
    a = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=3)[0]
    b = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=3)[0]
    c = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=4)[0]
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_step_stats_on_known_values():
    s = step_stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s["median"] == 3.0 and s["mean"] == 4.0 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["stdev"] == pytest.approx(3.5355339, rel=1e-6)
    assert s["cv"] == pytest.approx(3.5355339 / 4.0, rel=1e-6)
    assert s["p90"] == pytest.approx(7.6)


TINY_DIMS = ["model.vocab_size=1024", "model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
             "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.head_dim=16"]
FAMILIES = {"qwen3": ["model=tiny"], "llama": ["model=llama-3.2-1b", *TINY_DIMS],
            "qwen3_moe": ["model=qwen3-30b-a3b", *TINY_DIMS, "model.extra.num_experts=4",
                          "model.extra.num_experts_per_tok=2", "model.extra.moe_intermediate_size=32"]}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_local_checkpoint_loads_as_safetensors(tmp_path, family):
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", *FAMILIES[family])
    assert cfg.model.model_type == family
    reference = models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=11)[0]
    reference.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    assert list((tmp_path / "ckpt").glob("*.safetensors"))

    loaded = run_config(*FAST, "device=cpu", "dtype=fp32", *FAMILIES[family], f"model.weights={tmp_path / 'ckpt'}")
    result = measure(loaded)
    assert result.weights == "checkpoint" and result.failure is None
    assert result.weights_source == str((tmp_path / "ckpt").resolve())

    model = models.get_model(loaded.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    prompt = seeded_prompt(2, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        assert torch.equal(model(prompt).logits, reference(prompt).logits)


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


def test_building_a_model_leaves_its_preset_as_composed():
    # transformers writes rope_theta into the rope_scaling dict its config is given: a preset that shared the dict
    # changed under the run (an A/B's arms then "differed" in a key that neither arm set)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", *FAMILIES["llama"])
    before = copy_module.deepcopy(cfg.model.extra)
    assert "rope_scaling" in before
    models._load(cfg.model, torch.float32, "sdpa", torch.device("cpu"), seed=0)
    assert cfg.model.extra == before


def test_a_checkpoint_of_another_architecture_is_refused_not_mislabelled(tmp_path):
    tiny = run_config(*FAST, "device=cpu", "dtype=fp32")
    models._load(tiny.model, torch.float32, "sdpa", torch.device("cpu"), seed=0)[0].save_pretrained(tmp_path / "ckpt")
    as_qwen = run_config("device=cpu", f"model.weights={tmp_path / 'ckpt'}")  # model=qwen3-0.6b, 28 layers
    with pytest.raises(ConfigError, match=r"is not a qwen3-0.6b: vocab_size=1024 \(model=qwen3-0.6b has 151936\)"
                                          r".*num_hidden_layers=2 \(model=qwen3-0.6b has 28\)"):
        measure(as_qwen)


def test_a_checkpoint_without_safetensors_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "pytorch_model.bin").write_bytes(b"pickle data is never loaded")
    cfg = run_config(*FAST, "device=cpu", f"model.weights={tmp_path / 'ckpt'}")
    with pytest.raises(ConfigError, match="holds no \\*.safetensors file"):
        measure(cfg)


def test_prefill_returns_one_token_per_row():
    cfg = run_config(*FAST, "device=cpu", "bs=3")
    model = models.get_model(cfg.model, "bf16", "sdpa", torch.device("cpu"), 0).model
    cache = static_cache(model, 3, 32, torch.device("cpu"))
    prompt = seeded_prompt(3, 8, model.config.vocab_size, 0, torch.device("cpu"))
    with torch.inference_mode():
        first = prefill(model, cache, prompt)
    assert first.shape == (3, 1) and int(cache.get_seq_length()) == 8


class BiasedStepper(EagerStepper):
    """A broken mode: it always prefers token 7."""

    def step(self):
        logits = super().step().clone()
        logits[:, 7] += 1e4
        return logits


def _decoded_tokens(stepper, cfg):
    warm = run_steps(stepper, cfg.warmup)
    return torch.cat([warm, timed_decode(stepper, cfg.decode_tokens, torch.device("cpu")).tokens])


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


@pytest.mark.parametrize("noise, passes", [(1e-3, True), (5.0, False)])
def test_an_inexact_mode_is_judged_against_fp32_within_eager_own_error(noise, passes):
    checks, why = _noisy_run_verified(noise)
    assert 0 < checks["eager_fp32_max_logit_err"] < 0.5  # bf16 eager's own rounding against fp32 (tiny: ~0.2)
    assert checks["fp32_err_bound"] == pytest.approx(INEXACT_BOUND * checks["eager_fp32_max_logit_err"])
    assert (why is None) == passes, why
    if not passes:
        assert why.startswith("logit error against fp32 ")


@pytest.mark.parametrize("noise, passes", [(1e-3, True), (5.0, False)])
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


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("logits_bytes", [1 << 30, 1])  # one forward over every token; a forward per token
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


@pytest.mark.parametrize("kind, says", [
    ("kv_lost", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("rope_off_by_one", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("layer_skipped", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("newest_masked", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("stale_token", "logits differ from eager's (same kernels, 2 rows) by up to "),
])
def test_every_injected_mutation_fails_the_run_naming_what_differed(monkeypatch, kind, says):
    # untied embeddings: with tied random weights greedy decode repeats its input token, and a stale
    # token would be the right one
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false")
    clean = measure(cfg)  # its eager references are kept for the next job of the shape, as in a sweep
    assert clean.failure is None and references.hits["computed"] > 0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)
    result = measure(cfg)
    assert result.failure is not None and result.failure.startswith(says), result.failure
    assert result.mode_tags["mutation"] == kind and result.metrics["verified"] == 0.0


@pytest.mark.parametrize("mode_and_attn", [["mode=eager", "dtype=fp32"], ["mode=eager", "dtype=bf16", "attn=flex"]])
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


def test_an_unmutated_run_verifies_every_block():
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "repeats=3", "stop=repeats"))
    m = result.metrics
    assert result.failure is None and m["verified"] == 1.0 and m["tokens_match"] == 1.0
    assert len(result.step_ms) == 3 * 8 and m["repeats"] == 3.0
    assert m["step_ms_ci_low"] <= m["step_ms_median"] <= m["step_ms_ci_high"]


def test_the_physical_gpu_is_found_through_cuda_visible_devices(monkeypatch):
    from harness.measure.gpu_state import _visible_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # as SLURM binds two GPUs to a job
    assert _visible_gpu(0) == "3" and _visible_gpu(1) == "5" and _visible_gpu(2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9859b9d6-b2f2-30f8-6d9e-af659d812857")
    assert _visible_gpu(0) == "GPU-9859b9d6-b2f2-30f8-6d9e-af659d812857"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _visible_gpu(1) == "1"


def test_tuning_switches_set_in_the_environment_are_recorded(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1")
    monkeypatch.setenv("HARNESS_UNRELATED", "x")
    result = measure(run_config(*FAST, "device=cpu"))
    assert result.environment["TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"] == "1"
    assert "HARNESS_UNRELATED" not in result.environment


def test_profiling_on_the_cpu_says_it_was_skipped():
    phases = []
    result = measure(run_config(*FAST, "device=cpu", "profile=true"), on_phase=phases.append)
    assert result.mode_tags["profile"].startswith("skipped: the profiler pass times CUDA kernels")
    assert any(p.startswith("profile skipped") for p in phases) and "kernels_per_step" not in result.metrics


def _a_wrong_token():
    """A tiny fp32 model's prefilled stepper, and its loop's tokens with one wrong (step 5, row 1), as a loop
    that fed the wrong token would leave them. Call under inference_mode."""
    cfg, model, prompt = tiny_fp32("model.tie_word_embeddings=false")
    stepper = EagerStepper(model, prompt, 64)
    decoded = _decoded_tokens(stepper, cfg)
    decoded[5, 1] = (decoded[5, 1] + 1) % model.config.vocab_size
    return cfg, model, prompt, stepper, decoded


def test_a_token_the_timed_loop_got_wrong_fails_the_run():
    with torch.inference_mode():
        cfg, model, prompt, stepper, decoded = _a_wrong_token()
        checks, why = verify(model, prompt, stepper, cfg, True, decoded)
    assert why.startswith("the decoded token at step 5 (warm-up and first timed block) is not eager's choice")
    assert checks["tokens_match"] == 0.0 and checks["max_logit_diff"] == 0.0  # the lockstep alone saw nothing


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


@pytest.mark.parametrize("steady_passes", [2, 3])
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
