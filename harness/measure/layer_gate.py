"""The layer gate: a run's first decode step judged layer by layer against fp32, at the dtype's own tolerance.

The fp32 check (fidelity.py) judges a run's logits, and its bound is INEXACT_BOUND times native eager's own error
there. That leaves room for a systematic error in one op of every layer (a fused RMSNorm's epsilon 1000x too large
passed a bf16 run of Qwen3-0.6B with "worse" fidelity): by the logits, that error is of the size of bf16's own
rounding, spread over the whole model. Layer by layer it is not.

From the run's context (rewound, its first token), one decode step is run three ways, and the residual stream is
kept after each decoder layer, and the logits after the final norm and lm_head (a stage of its own), for the first
GATE_ROWS rows:
- the run's own step, as its mode computes it: the step its graph captured or it launches (`forward()`; mode=fused's
  kernels with the residual copied after each layer, FusedStepper.forward_by_layer: a probe off the timed path),
  its decoder layers' outputs recorded by forward hooks where its step is transformers' model itself;
- native eager in the run's dtype (sdpa), in the run's cache;
- eager in fp32 (fidelity.computed_in_fp32), from the run's context K/V upcast, in a cache of its own.
A stage's deviation is the median over those rows and the hidden size of |stage - fp32's|: a median, since a few
dimensions of a real model's residual stream grow into the hundreds (its massive activations), where bf16's
rounding alone is a few units, and a mean or a largest error would be theirs.

The rule: at every stage the run's deviation may be at most LAYER_BOUND (2) times native eager's at that stage, and
at least LAYER_FLOOR times the median |fp32 value| there (an fp32 run, whose eager deviates by rounding of ~1e-7 or
not at all). Why 2: two computations in one dtype that each round their ops once deviate from fp32 by about the same
amount (the median of thousands of elements varies by a few percent between them); one that rounds twice as often
(bf16 intermediates where eager keeps fp32) by about sqrt(2) times as much; one that keeps more in fp32 (the fused
kernels' residual stream and logits) by less. A systematic error adds to the dtype's rounding in
quadrature, sqrt(e^2 + s^2), so a bound of 2 e fails every error s above sqrt(3) e, 1.7 times the dtype's own
rounding at that stage, and keeps a margin of sqrt(2) over a mode that rounds twice as often as eager. The logits'
bound of 4 x, on one largest error over the whole vocabulary and every step, admits an s of sqrt(15) e, spread over
every layer.

The gate applies where the fp32 check does (inexact modes, and backends other than `sdpa`) and the step's layers can
be seen: not under Inductor (mode=compiled, compiled-nograph), whose step is one compiled graph whose layers'
outputs are not outputs of the code it times (a second compile that returned them would judge other kernels). Where
it does not apply, the run's tag `layer_gate` says `not applied` and why, and no ratio is logged. Where it applies
it is judged in every run, and its reason is the run's where the checks before it passed (verify.py). Metrics:
`layer_gate_ratio` (the worst stage's deviation over its bound: at most 1 passes), `layer_gate_worst_layer` (that
stage: a layer's index, the layer count for the logits), `layer_gate_stages`, `layer_gate_rows`.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch

from harness.kernels import attention_spec
from harness.measure import mutations
from harness.measure.fidelity import attention, computed_in_fp32
from harness.measure.mutations import MutatedStepper
from harness.modes.base import Stepper
from harness.modes.eager import EagerStepper
from harness.modes.graphed import GraphedStepper

LAYER_BOUND = 2.0  # a stage's deviation from fp32, in units of native eager's own there (the rule above)
LAYER_FLOOR = 1e-4  # the bound's floor, relative to the median |fp32 value| at the stage (fp32 runs)
GATE_ROWS = 4  # the batch's first rows judged (fp32's context copy: K/V of the context, per row and layer)


def check(model, stepper, cfg, exact: bool, metrics: dict) -> str | None:
    """Judge the run's first decode step layer by layer (the module's rule); metrics and the `layer_gate` tag as the
    module says; the failure reason, naming the first stage over its bound, or None. The stepper is left rewound."""
    reason = not_applied(model, stepper, cfg, exact)
    if reason is not None:
        stepper.tags["layer_gate"] = f"not applied: {reason}"
        return None
    rows = min(stepper.bs, GATE_ROWS)
    run, eager, fp32 = (states(model, stepper, rows, way) for way in ("run", "eager", "fp32"))
    ratios, deviations, bounds, units = judge(run, eager, fp32)
    worst = max(range(len(ratios)), key=ratios.__getitem__)
    metrics.update(layer_gate_ratio=ratios[worst], layer_gate_worst_layer=float(worst),
                   layer_gate_stages=float(len(ratios)), layer_gate_rows=float(rows))
    over = [stage for stage, ratio in enumerate(ratios) if not ratio <= 1.0]  # NaN fails
    if not over:
        stepper.tags["layer_gate"] = f"passed: worst {stage_name(worst, len(ratios))}, {ratios[worst]:.3g} of its bound"
        return None
    first = over[0]
    stepper.tags["layer_gate"] = f"failed at {stage_name(first, len(ratios))}"
    return failure_line(first, len(over), ratios, deviations, bounds, units)


def failure_line(first: int, over: int, ratios: list, deviations: list, bounds: list, units: list) -> str:
    """The run's reason: the first stage over its bound, its deviation, bound and the bound's unit, and how many are
    over."""
    if bounds[first] == LAYER_BOUND * units[first]:
        unit = f"{LAYER_BOUND:g} x native eager's own {units[first]:.4g} there"
    else:
        unit = f"its floor, {LAYER_FLOOR:g} x the median |fp32 value| there; native eager's own {units[first]:.4g}"
    return (f"layer gate: {stage_name(first, len(ratios))} deviates from fp32 by {deviations[first]:.4g} (median), "
            f"{ratios[first]:.3g} x its bound {bounds[first]:.4g} ({unit}; {over} of {len(ratios)} stages over): a "
            f"systematic error in that layer's kernels")


def stage_name(stage: int, stages: int) -> str:
    """A stage's name in a failure or tag: a decoder layer's residual stream, or the logits (the last stage)."""
    return "the logits (final norm and lm_head)" if stage == stages - 1 else f"layer {stage}'s output"


def not_applied(model, stepper, cfg, exact: bool) -> str | None:
    """Why the gate cannot judge this run, or None where it applies."""
    if exact and attention_spec(cfg.attn).reference:
        return (f"mode={cfg.mode} with attn={cfg.attn} runs eager's own kernels, checked logit for logit against "
                f"eager (its layers are eager's)")
    if not _decoder_layers(model):
        return f"{type(model).__name__} has no model.layers whose outputs a hook can read"
    inner = _unwrapped(stepper)
    if _probe(inner) is None:
        return (f"mode={cfg.mode}'s step ({type(inner).__name__}) runs other code than its model's layers (Inductor's "
                f"step is one compiled graph): their outputs are not outputs of the code it times")
    return None


def judge(run: list[torch.Tensor], eager: list[torch.Tensor], fp32: list[torch.Tensor]):
    """Per stage: the run's deviation over its bound, the run's deviation, the bound, and eager's deviation (the
    bound's unit); each deviation the median |x - fp32| over the stage's elements."""
    ratios, deviations, bounds, units = [], [], [], []
    for ours, native, ref in zip(run, eager, fp32, strict=True):
        deviation, unit = _median_abs(ours - ref), _median_abs(native - ref)
        bound = max(LAYER_BOUND * unit, LAYER_FLOOR * _median_abs(ref))
        ratios.append(deviation / bound if bound > 0 else float("inf") if deviation > 0 else 0.0)
        deviations.append(deviation)
        bounds.append(bound)
        units.append(unit)
    return ratios, deviations, bounds, units


def _median_abs(x: torch.Tensor) -> float:
    return float(x.abs().flatten().median())


def states(model, stepper, rows: int, way: str) -> list[torch.Tensor]:
    """One decode step from the run's context, `way`: "run" (the run's own step), "eager" (native eager, this dtype,
    sdpa, in the run's cache) or "fp32"; the residual stream after each decoder layer and the logits, each
    [rows, width] in fp32. The run's stepper is rewound before and after."""
    kept: list[torch.Tensor] = []
    stepper.rewind()
    with torch.no_grad():
        if way == "run":
            fault = mutations.patched(model, stepper.kind) if isinstance(stepper, MutatedStepper) else nullcontext()
            with fault:
                logits = _probe(_unwrapped(stepper))(model, rows, kept)
        elif way == "eager":
            eager = EagerStepper(model, stepper.input_ids, stepper.cache_len, rows=stepper.rows, shared=stepper)
            with attention(model, "sdpa"), _hooked(model, rows, kept):
                logits = eager.forward()
        else:
            logits = _fp32_step(model, stepper, rows, kept)
        kept.append(logits[:rows].float().clone())
    stepper.rewind()
    return kept


def _fp32_step(model, stepper, rows: int, kept: list) -> torch.Tensor:
    """Eager in fp32 from the first rows' context K/V upcast, in a cache of one slot more than the context."""
    ctx = stepper.context_len
    prefix = [(layer.keys[:rows, :, :ctx], layer.values[:rows, :, :ctx]) for layer in stepper.cache.layers]
    ids = stepper.first_ids[:rows]
    reference = EagerStepper(model, ids, ctx + 1, dtype=torch.float32, prefill=False)
    try:
        reference.adopt(prefix, ids)
        with computed_in_fp32(model), _hooked(model, rows, kept):
            return reference.forward().float()
    finally:
        reference.release()


def _unwrapped(stepper):
    """The stepper whose step the run times: a test's fault (mutations.MutatedStepper) wraps one."""
    return stepper.inner if isinstance(stepper, MutatedStepper) else stepper


def _decoder_layers(model) -> list:
    return list(getattr(getattr(model, "model", None), "layers", None) or [])


@contextmanager
def _hooked(model, rows: int, kept: list):
    """Each decoder layer's output (the residual stream after it) at the last position, first `rows` rows, in fp32,
    appended to `kept` as the layers run."""
    def record(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        kept.append(hidden[:rows, -1].detach().float().clone())

    handles = [layer.register_forward_hook(record) for layer in _decoder_layers(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _probe(stepper) -> Callable | None:
    """How to run the stepper's own step once with its layers' outputs kept: fn(model, rows, kept) -> logits; None
    where its step is not its forward() (a compiled step). A stepper whose timed step runs forward() eagerly or
    replays a graph captured from it (eager, graphed, bucketed) is transformers' model with the run's attention
    backend: hooks see its layers; mode=fused's launches its own kernels, which copy the residual stream after each
    layer on a path of its own (forward_by_layer)."""
    by_layer = getattr(stepper, "forward_by_layer", None)
    if by_layer is not None:
        def fused(model, rows, kept):
            return by_layer(lambda index, residual: kept.append(residual[:rows].float().clone()))
        return fused
    if type(stepper).forward is Stepper.forward and type(stepper).step in (Stepper.step, GraphedStepper.step):
        def hooked(model, rows, kept):
            with _hooked(model, rows, kept):
                return stepper.forward()
        return hooked
    return None
