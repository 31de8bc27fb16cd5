"""The layer gate (harness/measure/layer_gate.py): a run's first decode step judged layer by layer against fp32, at
LAYER_BOUND x native eager's own deviation there. Its rule on known errors; a fused run passing it with its ratio
logged; a fault of the registry inside the fused kernels (every RMSNorm's epsilon 1000x) failing the run at the layer
it enters; the hooks on transformers' layers catching a registry fault; and the runs it cannot judge saying so."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.measure import layer_gate, mutations
from harness.measure.job import measure, seeded_prompt
from harness.modes.eager import EagerStepper
from tests.support import FAST, gpu, run_config

FUSED = (*FAST, "device=cpu", "dtype=fp32", "bs=1", "mode=fused", "model.tie_word_embeddings=false")


def noisy(ref: torch.Tensor, scale: float, seed: int) -> torch.Tensor:
    """`ref` plus rounding-like noise of this size, each element its own."""
    return ref + scale * torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed))


def test_the_bound_is_twice_eager_s_deviation_and_fails_a_systematic_error_past_sqrt3_of_it():
    """Another rounding of eager's size passes at about half the bound; an error added to it (in quadrature) passes
    below sqrt(3) x eager's rounding and fails above; the ratio is per stage, against eager's at that stage."""
    ref = [torch.randn(4, 1024, generator=torch.Generator().manual_seed(s)) * (s + 1) for s in range(2)]
    eager = [noisy(r, 0.01 * (s + 1), 10 + s) for s, r in enumerate(ref)]
    same = [noisy(r, 0.01 * (s + 1), 20 + s) for s, r in enumerate(ref)]
    ratios = layer_gate.judge(same, eager, ref)[0]
    assert all(0.45 < r < 0.55 for r in ratios), ratios  # two roundings of one size: half the bound
    below = [noisy(x, 0.012 * (s + 1), 30 + s) for s, x in enumerate(same)]  # sqrt(1 + 1.2^2) = 1.56 x eager's
    above = [noisy(x, 0.025 * (s + 1), 40 + s) for s, x in enumerate(same)]  # sqrt(1 + 2.5^2) = 2.69 x eager's
    assert all(r < 1 for r in layer_gate.judge(below, eager, ref)[0])
    assert all(r > 1.2 for r in layer_gate.judge(above, eager, ref)[0])
    one_layer = [same[0], above[1]]  # only layer 1 off: only its ratio over
    ratios, deviations, bounds, units = layer_gate.judge(one_layer, eager, ref)
    assert ratios[0] < 1 < ratios[1] and bounds[1] == layer_gate.LAYER_BOUND * units[1]


def test_the_median_sees_an_error_in_every_ordinary_dimension_beside_massive_activations():
    """A real model's residual stream has a few dimensions in the hundreds, where bf16 rounds by units: a largest (or
    mean) error would be theirs and hide an error of every other dimension; the median is not."""
    ref = torch.randn(1, 1024, generator=torch.Generator().manual_seed(0))
    ref[0, :4] = 1000.0  # massive activations
    eager = noisy(ref, 0.004, 1)
    eager[0, :4] += 4.0  # bf16's rounding at 1000: half an ulp of 8
    run = noisy(eager, 0.02, 2)  # an error of 5 x eager's rounding in every dimension
    run[0, :4] = ref[0, :4] + 3.0  # the massive dimensions rounded no worse than eager's
    assert float((run - ref).abs().max()) < float((eager - ref).abs().max())  # a largest error would pass it
    assert layer_gate.judge([run], [eager], [ref])[0][0] > 2


def test_where_eager_deviates_by_nothing_the_floor_bounds_the_run():
    """An fp32 run: eager is fp32's own computation (deviation 0), so the bound is LAYER_FLOOR x the median |value|:
    fp32 rounding passes, an error of 1e-3 of the values fails, and no bound of 0 divides."""
    ref = torch.randn(2, 512, generator=torch.Generator().manual_seed(0))
    scale = float(ref.abs().median())
    assert layer_gate.judge([noisy(ref, 1e-7 * scale, 1)], [ref.clone()], [ref])[0][0] < 0.01
    assert layer_gate.judge([noisy(ref, 1e-3 * scale, 1)], [ref.clone()], [ref])[0][0] > 5
    zero = torch.zeros_like(ref)  # a stage of zeros that eager computes exactly: no bound at all
    assert layer_gate.judge([ref], [zero], [zero])[0] == [float("inf")]
    assert layer_gate.judge([zero], [zero], [zero])[0] == [0.0]


@pytest.mark.slow
def test_an_unmodified_fused_run_passes_the_gate_with_its_ratio_logged():
    """mode=fused's kernels (Triton's interpreter, fp32) judged after each of the tiny model's two layers and at the
    logits, each well inside its bound."""
    result = measure(run_config(*FUSED))
    m, tags = result.metrics, result.mode_tags
    assert result.failure is None and m["verified"] == 1.0, result.failure
    assert m["layer_gate_stages"] == 2 + 1 and m["layer_gate_rows"] == 1
    assert 0 < m["layer_gate_ratio"] < 0.5, m["layer_gate_ratio"]  # fp32 rounding against the floor
    assert tags["layer_gate"].startswith("passed: worst "), tags["layer_gate"]


def fused_stepper(kind: str | None = None):
    """A fused stepper of the tiny fp32 model, built as a job builds it (with `kind`, the registry's fault in force
    while the mode prepares its kernels, as HARNESS_INJECT_MUTATION=kind has it), prefilled; its config and model."""
    from harness.modes.fused import FusedMode

    cfg = run_config(*FUSED)
    model = models.get_model(cfg.model, "fp32", cfg.attn, torch.device("cpu"), 0).model
    prompt = seeded_prompt(1, cfg.context_len, model.config.vocab_size, 0, torch.device("cpu"))
    if kind is None:
        stepper = FusedMode().prepare(model, prompt, cfg)
    else:
        with mutations.patched(model, kind):
            stepper = mutations.MutatedStepper(FusedMode().prepare(model, prompt, cfg), kind)
    stepper.restart(prompt)
    return cfg, model, stepper


@pytest.mark.slow
def test_the_unmodified_fused_kernels_pass_the_gate_at_every_layer():
    with torch.inference_mode():
        cfg, model, stepper = fused_stepper()
        metrics = {}
        assert layer_gate.check(model, stepper, cfg, False, metrics) is None
    assert 0 < metrics["layer_gate_ratio"] < 0.5 and metrics["layer_gate_stages"] == 3, metrics
    assert stepper.tags["layer_gate"].startswith("passed: worst ")


@pytest.mark.slow
def test_the_norm_epsilon_1000x_inside_the_fused_kernels_fails_the_gate_at_layer_0(monkeypatch):
    """The registry's fault, built into the real kernels (FusedDecoder's epsilon, read by every norm they compute):
    the gate's one line names layer 0, where the fault first acts, and its numbers."""
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "fused_norm_eps_1000x")
    with torch.inference_mode():
        cfg, model, stepper = fused_stepper(mutations.requested("fused"))
        assert stepper.inner.decoder.eps == 1000 * model.config.rms_norm_eps  # in the kernels' launches
        metrics = {}
        failure = layer_gate.check(model, stepper, cfg, False, metrics)
    assert failure is not None and failure.startswith("layer gate: layer 0's output deviates from fp32 by "), failure
    assert " x its bound " in failure and "stages over" in failure
    assert stepper.tags["layer_gate"] == "failed at layer 0's output" and metrics["layer_gate_ratio"] > 5


@pytest.mark.slow
def test_the_norm_epsilon_1000x_inside_the_fused_kernels_fails_the_run(monkeypatch):
    """The same fault through a whole job: the run fails, the gate's tag naming layer 0. In fp32 (the only dtype the
    interpreter's kernels compute right) the logits' check fails it too, and its reason comes first. In bf16 the
    logits' bound (4x eager's own error) leaves room for a systematic error in every layer: the GPU test below has
    the gate fail it on Qwen3-0.6B."""
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "fused_norm_eps_1000x")
    result = measure(run_config(*FUSED))
    assert result.mode_tags["mutation"] == "fused_norm_eps_1000x"
    assert result.metrics["verified"] == 0.0 and result.failure is not None
    assert result.failure.startswith("logit error against fp32 "), result.failure
    assert result.mode_tags["layer_gate"] == "failed at layer 0's output"
    assert result.metrics["layer_gate_ratio"] > 5


def bf16_flex_stepper():
    """The tiny model in bf16 with attn=flex (an inexact backend, so the gate applies), an eager stepper prefilled
    from a seeded prompt of two rows, and the run's config."""
    cfg = run_config(*FAST, "device=cpu", "dtype=bf16", "bs=2", "mode=eager", "attn=flex", "cache_len=128")
    model = models.get_model(cfg.model, "bf16", "flex", torch.device("cpu"), 0).model
    prompt = seeded_prompt(2, cfg.context_len, model.config.vocab_size, 0, torch.device("cpu"))
    return cfg, model, EagerStepper(model, prompt, cfg.cache_len)


@pytest.mark.slow
def test_the_hooks_on_transformers_layers_judge_another_backend_in_bf16_and_catch_a_registry_fault():
    """A step that is transformers' model (eager, graphed, bucketed) with another attention backend: its layers'
    outputs read by hooks, bf16's rounding of flex's kernels inside the bound; the registry's rope_off_by_one, acting
    in the model's rotary embedding as the run's step calls it, fails at layer 0; the stepper is left rewound."""
    with torch.inference_mode():  # as a job runs
        cfg, model, stepper = bf16_flex_stepper()
        metrics = {}
        assert layer_gate.check(model, stepper, cfg, True, metrics) is None
    assert 0.2 < metrics["layer_gate_ratio"] < 1 and metrics["layer_gate_stages"] == 3
    assert stepper.tags["layer_gate"].startswith("passed")
    assert [int(layer.cumulative_length) for layer in stepper.cache.layers] == [cfg.context_len] * 2
    assert torch.equal(stepper.input_ids, stepper.first_ids)
    faulty, metrics = mutations.MutatedStepper(stepper, "rope_off_by_one"), {}
    with torch.inference_mode():
        failure = layer_gate.check(model, faulty, cfg, True, metrics)
    assert failure is not None and failure.startswith("layer gate: layer 0's output deviates"), failure
    assert metrics["layer_gate_ratio"] > 1 and stepper.tags["layer_gate"] == "failed at layer 0's output"


@pytest.mark.slow
def test_an_exact_run_says_the_gate_did_not_apply():
    """mode=eager under sdpa is eager itself, checked logit for logit: the gate says why it did not judge, and logs
    no ratio (never a pass)."""
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=1", "mode=eager"))
    assert result.failure is None
    assert result.mode_tags["layer_gate"] == ("not applied: mode=eager with attn=sdpa runs eager's own kernels, "
                                              "checked logit for logit against eager (its layers are eager's)")
    assert not any(key.startswith("layer_gate") for key in result.metrics)


@pytest.mark.slow
def test_a_compiled_step_says_the_gate_did_not_apply():
    """Inductor's step is one compiled graph whose layers' outputs are not its outputs: not applied, never judged by
    the model's own (eager) forward in its place."""
    from harness.modes.compiled import CompiledStepper

    with torch.inference_mode():
        cfg, model, eager = bf16_flex_stepper()
    cfg = run_config(*FAST, "device=cpu", "dtype=bf16", "bs=2", "mode=compiled-nograph")
    stepper = CompiledStepper(model, eager.input_ids, cfg.cache_len, "default", {})
    metrics = {}
    assert layer_gate.check(model, stepper, cfg, False, metrics) is None and metrics == {}
    assert stepper.tags["layer_gate"] == ("not applied: mode=compiled-nograph's step (CompiledStepper) runs other "
                                          "code than its model's layers (Inductor's step is one compiled graph): "
                                          "their outputs are not outputs of the code it times")


@pytest.mark.gpu
@gpu
def test_on_a_gpu_the_norm_epsilon_1000x_fails_a_bf16_fused_qwen3_run_that_passes_unmodified(monkeypatch):
    """Qwen3-0.6B at bs=1 in bf16, mode=fused captured: as it is, the run passes the gate with its margin; with every
    RMSNorm's epsilon 1000x in the kernels, the gate fails it at a layer, whether or not the logits' check does too.
    `python -m pytest -m gpu tests/unit/measure/test_layer_gate.py`."""
    qwen = ("model=qwen3-0.6b", "cache_len=256", "decode_tokens=64", "bs=1", "mode=fused", "dtype=bf16", "repeats=1")
    clean = measure(run_config(*qwen))
    print("unmodified:", clean.mode_tags.get("layer_gate"), clean.metrics.get("layer_gate_ratio"))
    assert clean.failure is None and clean.metrics["layer_gate_ratio"] <= 1, clean.failure
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "fused_norm_eps_1000x")
    faulty = measure(run_config(*qwen))
    print("fused_norm_eps_1000x:", faulty.failure)
    assert faulty.metrics["verified"] == 0.0 and faulty.mode_tags["layer_gate"].startswith("failed at "), faulty.failure
