"""Inexact modes (Inductor's kernels) and attention backends other than `sdpa`, against an fp32 eager decode of the
same model, prompt and tokens: their largest logit error against fp32 may be at most INEXACT_BOUND times that of
this dtype's plain eager decode (sdpa) against fp32, a token may differ from fp32's only within twice that error,
and their KL from fp32 (fidelity) may exceed native eager's only within KL_TOLERANCE x eager's own. The fp32 decode
starts from the run's own context K/V, upcast (no fp32 prefill), and takes every step's logits from forwards over
the run's tokens (teacher forcing); plain eager, the bound's unit, decodes those rows step by step as the run does.
Both come from references.py where an earlier job computed them from the very same context and tokens."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from harness.modes.base import CACHE_KWARG, kv_heads_and_dim, prefill_chunk
from harness.modes.eager import EagerStepper
from harness.measure import references, traces
from harness.measure.stats import paired_mean_interval
from harness.measure.traces import Trace

INEXACT_BOUND = 4.0  # an inexact run's error against fp32, in units of plain eager's own (docs/checks.md)
FP32_FLOOR = 1e-5  # where eager's own error is 0 (an fp32 run), rounding of this size relative to the logits
# A run's mean KL from fp32 may exceed native eager's by at most this many times eager's own (the KL delta's 95%
# interval above it fails the run), and by at least KL_FLOOR_NATS where eager's is ~0 (an fp32 run)
KL_TOLERANCE = 1.0
# and at no single step by more than KL_STEP_TOLERANCE x eager's worst step (a fault at a block boundary touches one
# step in 128, which a mean over steps, and its bootstrap interval, can hide)
KL_STEP_TOLERANCE = 4.0
KL_FLOOR_NATS = 1e-6
FP32_TOKENS = 32768  # context tokens the fp32 reference prefills at most (rows x context_len): its prefill is slow
FORCED_LOGITS_BYTES = 1 << 30  # a teacher-forced forward's logits (rows x tokens x vocab, fp32) stay under this


def every_token_shown(stepper, run: Trace) -> bool:
    """Whether the free run recorded the token of every step it decoded (a K-step graph keeps its K tokens), not
    only each call's last: a teacher-forced reference needs the whole history."""
    return run.tokens.shape[0] == run.logits.shape[0] * stepper.tokens_per_step


def against_fp32(model, prompt, stepper, cfg, run: Trace, sums: torch.Tensor, metrics) -> str | None:
    """The run's logits and plain eager's (this dtype, sdpa) against fp32's, all given the run's tokens, all from
    the run's prefilled context: plain eager and the fp32 decode take the run's context K/V (fp32's upcast, as the
    public studies of decode fidelity do), so that the three differ in their decode only, and no fp32 prefill of a
    long context is paid. Both decode the rows fp32 checks, and no more (at a long context, one or two of a batch
    of 32): plain eager step by step, the decode whose rounding is the bound's unit, fp32 in forwards over the
    known tokens. A kept reference serves only a job whose context K/V sum to the very same values, slot by slot
    (`sums`, context_check.context_digest's)."""
    k = stepper.tokens_per_step
    context = _context_copy(model, stepper)  # frees the run's cache
    plain = _plain_reference(model, prompt, cfg, context, run, sums, k)
    every_step = _fp32_reference(model, prompt, cfg, context, run, sums)
    context.prefix.clear()  # the context copy, freed before the comparisons
    ref, rows = every_step[k - 1::k], context.rows  # the steps whose logits a call returns
    err, own = traces.max_diff(run.logits[:, :rows], ref), traces.max_diff(plain, ref)
    bound = max(INEXACT_BOUND * own, FP32_FLOOR * float(ref.abs().max()))
    top2 = ref.topk(2, dim=-1).values
    differ = run.logits[:, :rows].argmax(-1) != ref.argmax(-1)
    metrics.update(fp32_max_logit_err=err, eager_fp32_max_logit_err=own, fp32_err_bound=bound,
                   fp32_err_vs_eager=err / own if own else float("nan"), fp32_rows_checked=float(rows),
                   fp32_token_agreement=1.0 - float(differ.float().mean()))
    fidelity = fidelity_against_fp32(ref, run.logits[:, :rows], plain)
    stepper.tags["fidelity"] = fidelity.pop("fidelity")
    metrics.update(fidelity)
    if err > bound:
        return (f"logit error against fp32 {err:.4g} exceeds the bound {bound:.4g} "
                f"({INEXACT_BOUND:g} x eager's own {own:.4g})")
    if not bool(((top2[..., 0] - top2[..., 1])[differ] <= 2 * err).all()):
        return f"a token differs from fp32's where fp32's top-2 gap exceeds twice the error ({2 * err:.4g})"
    if k > 1 and (wrong := _every_token_against_fp32(every_step, run.tokens[:, :rows], 2 * err)) is not None:
        return wrong
    if stepper.tags["fidelity"] == "lost":
        return _fidelity_lost(fidelity)
    if stepper.tags["fidelity"] == "worse":  # it passes: never silently, the line says why
        stepper.tags["fidelity_accepted"] = worse_within_tolerance(fidelity, err, bound)
    return None


def _every_token_against_fp32(every_step: torch.Tensor, tokens: torch.Tensor, tolerance: float) -> str | None:
    """A call that decodes several steps returns the last one's logits only, so the tokens before it are judged by
    fp32's logits alone: every step's token (the last one's again) must be fp32's choice given the same history, or
    rank within `tolerance` (twice the run's error) of fp32's best."""
    best = every_step.max(dim=-1).values
    gap = best - every_step.gather(-1, tokens[..., None].to(every_step.device))[..., 0]
    if bool((gap <= tolerance).all()):
        return None
    step = int((gap > tolerance).any(dim=1).nonzero()[0, 0])
    return (f"the token the run decoded at step {step} (inside a call of several) ranks {float(gap.max()):.4g} below "
            f"fp32's choice given the same history, more than twice the run's error ({tolerance:.4g})")


@dataclass
class ContextCopy:
    """The run's context K/V per layer [rows, kv_heads, context, head_dim] and first tokens, for the rows fp32
    checks: views of the run's cache, or copied before it is freed, so that as many rows as half the free memory
    holds fit."""

    prefix: list[tuple[torch.Tensor, torch.Tensor]]
    first_ids: torch.Tensor
    rows: int


def _context_copy(model, stepper) -> ContextCopy:
    """The context of the rows fp32 checks: views of the run's cache where as many rows fit beside it as without it
    (the cache then stays whole, for the next job: keep_or_release), else a copy, and the cache freed."""
    ctx, most = stepper.context_len, _fp32_rows_at_most(stepper)
    views = [(layer.keys[:most, :, :ctx], layer.values[:most, :, :ctx]) for layer in stepper.cache.layers]
    if _fp32_rows(model, stepper) == most:
        return ContextCopy(views, stepper.first_ids[:most], most)
    prefix = [(keys.clone(), values.clone()) for keys, values in views]
    views.clear()  # no view may keep the run's cache, freed below
    first_ids = stepper.first_ids[:most]
    stepper.release()
    rows = _fp32_rows(model, stepper)
    return ContextCopy([(k[:rows], v[:rows]) for k, v in prefix], first_ids[:rows], rows)


def _decode_from(model, prompt, cfg, context: ContextCopy, tokens: torch.Tensor, k: int = 1,
                 dtype: torch.dtype | None = None, step_by_step: bool = True) -> torch.Tensor:
    """An eager decode of the copied context's rows in a cache of its own, fed `tokens`; logits at every k-th step.
    step_by_step=False: every step's logits from forwards over the known tokens (_teacher_forced)."""
    reference = EagerStepper(model, prompt[:context.rows], cfg.cache_len, dtype=dtype, prefill=False)
    reference.adopt(context.prefix, context.first_ids)
    rows_tokens = tokens[:, :context.rows]
    logits = traces.forced(reference, rows_tokens, k).logits if step_by_step else _teacher_forced(reference, rows_tokens)
    reference.release()
    return logits


def _teacher_forced(stepper, tokens: torch.Tensor) -> torch.Tensor:
    """Every step's logits [steps, rows, vocab] of a decode fed `tokens` [steps, rows] after the stepper's first
    token, from forwards over those known tokens: each position attends to the very history a step-by-step decode
    gives it (the context, then the tokens before it: causal), so the logits are that decode's up to the rounding of
    other GEMM shapes (in fp32, a few millionths of the largest logit), at one forward's cost where steps would pay
    a step's host time each (an MoE's eager experts loop, 32 times over). In chunks whose mask and logits fit."""
    steps, rows = tokens.shape
    ids = torch.cat([stepper.first_ids, tokens[:-1].T.to(stepper.first_ids.device)], dim=1)  # [rows, steps]
    per_token = rows * stepper.model.config.vocab_size * 4
    chunk = max(1, min(prefill_chunk(rows, steps, stepper.cache_len), FORCED_LOGITS_BYTES // per_token))
    logits = []
    for start in range(0, steps, chunk):
        out = stepper.model(input_ids=ids[:, start:start + chunk], **{CACHE_KWARG: stepper.cache}, use_cache=True)
        logits.append(out.logits.transpose(0, 1))
    return torch.cat(logits)


def _plain_reference(model, prompt, cfg, context: ContextCopy, run: Trace, sums: torch.Tensor, k: int) -> torch.Tensor:
    """Plain eager (this dtype, sdpa) over the copied rows, fed the run's tokens [steps, rows, vocab], or an earlier
    job's for the same (any attention backend: plain runs sdpa from the very same context K/V)."""
    def plain_decode() -> torch.Tensor:
        with attention(model, "sdpa"):
            return _decode_from(model, prompt, cfg, context, run.tokens, k)

    shape = ("plain", references.weights_key(model), str(model.dtype), context.rows, cfg.cache_len, k)
    return references.reference("plain", shape, [prompt[:context.rows], context.first_ids, sums,
                                                 run.tokens[:, :context.rows]], 0, plain_decode)


def _fp32_reference(model, prompt, cfg, context: ContextCopy, run: Trace, sums: torch.Tensor) -> torch.Tensor:
    """The fp32 decode [steps, rows, vocab] fed the run's tokens, logits at every step (a call of several steps
    returns only its last), from the run's context K/V upcast, teacher-forced in forwards over those tokens, or an
    earlier job's for the same."""
    def fp32_decode() -> torch.Tensor:
        with computed_in_fp32(model):
            return _decode_from(model, prompt, cfg, context, run.tokens, dtype=torch.float32, step_by_step=False).float()

    rows = context.rows
    shape = ("fp32", references.weights_key(model), rows, cfg.cache_len)  # any attention: fp32 runs sdpa
    return references.reference("fp32", shape, [prompt[:rows], context.first_ids, sums, run.tokens[:, :rows]], 0,
                                fp32_decode)


def worse_within_tolerance(f: dict, err: float, bound: float) -> str:
    """One line on why a run whose fidelity is "worse" (its KL from fp32 above native eager's, the whole interval)
    passes: the excess lies within the tolerance (KL_TOLERANCE x eager's own KL from fp32: the run rounds farther from
    fp32 than eager does, by no more than eager's own distance from it), its worst step within KL_STEP_TOLERANCE x
    eager's worst, and its largest logit error within the bound. The job's tag `fidelity_accepted`, and its
    outcome line."""
    return (f"KL from fp32 {f['kl_delta_nats']:.3g} nats a token above native eager's (95% interval "
            f"{f['kl_delta_low_nats']:.3g} to {f['kl_delta_high_nats']:.3g}), within the tolerance "
            f"{f['kl_tolerance_nats']:.3g} ({KL_TOLERANCE:g} x eager's own {f['eager_kl_nats']:.3g}); worst step "
            f"{f['kl_delta_max_step_nats']:.3g} within {f['kl_step_tolerance_nats']:.3g}; largest logit error "
            f"{err:.4g} within {bound:.4g}")


def _fidelity_lost(f: dict) -> str:
    """The failure reason of a run whose fidelity is lost: its mean KL delta, or its worst step's."""
    if f["kl_delta_low_nats"] > f["kl_tolerance_nats"]:
        return (f"the run's KL from fp32 exceeds native eager's by {f['kl_delta_nats']:.3g} nats a token (95% "
                f"interval {f['kl_delta_low_nats']:.3g} to {f['kl_delta_high_nats']:.3g}), past the tolerance "
                f"{f['kl_tolerance_nats']:.3g} ({KL_TOLERANCE:g} x eager's own {f['eager_kl_nats']:.3g})")
    return (f"at one step the run's KL from fp32 exceeds native eager's by {f['kl_delta_max_step_nats']:.3g} nats a "
            f"token, past {f['kl_step_tolerance_nats']:.3g} ({KL_STEP_TOLERANCE:g} x eager's worst step, "
            f"{f['eager_kl_max_step_nats']:.3g}): a fault at a few positions (a block boundary) that the mean hides")


def fidelity_against_fp32(ref: torch.Tensor, run: torch.Tensor, plain: torch.Tensor) -> dict:
    """Fidelity as decode studies measure it, each [steps, rows, vocab] teacher-forced on the same tokens: per
    step, KL(fp32 || run) and the NLL under the run of fp32's greedy token, the same for native eager (`plain`,
    this dtype, sdpa), and their deltas (run - eager) averaged over rows, with a paired bootstrap 95% interval over
    steps. `fidelity` is "lost" where that interval lies above KL_TOLERANCE x eager's own mean KL, or where one
    step's delta passes KL_STEP_TOLERANCE x eager's worst step (each at least KL_FLOOR_NATS): a fault that touches
    a step or two (a block skipped where the position crosses it) shows there, where one largest logit error over
    all steps can hide it. Else "matched" where the interval reaches 0 or below, "worse" where it lies above 0."""
    run_kl, run_nll, eager_kl, eager_nll = [], [], [], []
    for step in range(ref.shape[0]):  # step by step: [steps, rows, vocab] in fp32, several times, would not fit
        logp = ref[step].float().log_softmax(-1)
        best = logp.argmax(-1, keepdim=True)
        for logits, kl, nll in ((run[step], run_kl, run_nll), (plain[step], eager_kl, eager_nll)):
            logq = logits.float().log_softmax(-1)
            kl.append((logp.exp() * (logp - logq)).sum(-1).double().cpu())
            nll.append(-logq.gather(-1, best)[:, 0].double().cpu())
    run_kl, run_nll, eager_kl, eager_nll = (torch.stack(x).numpy() for x in (run_kl, run_nll, eager_kl, eager_nll))
    kl_steps, nll_steps = (run_kl - eager_kl).mean(axis=1), (run_nll - eager_nll).mean(axis=1)
    (kl_low, kl_high), (nll_low, nll_high) = (paired_mean_interval(d) for d in (kl_steps, nll_steps))
    eager, eager_worst = float(eager_kl.mean()), float(eager_kl.mean(axis=1).max())
    tolerance = max(KL_TOLERANCE * eager, KL_FLOOR_NATS)
    step_tolerance = max(KL_STEP_TOLERANCE * eager_worst, KL_FLOOR_NATS)
    lost = kl_low > tolerance or float(kl_steps.max()) > step_tolerance
    verdict = "lost" if lost else "matched" if kl_low <= 0 else "worse"
    return {"kl_nats": float(run_kl.mean()), "eager_kl_nats": eager, "kl_delta_nats": float(kl_steps.mean()),
            "eager_kl_max_step_nats": eager_worst, "kl_step_tolerance_nats": step_tolerance,
            "kl_delta_low_nats": kl_low, "kl_delta_high_nats": kl_high, "kl_delta_max_step_nats": float(kl_steps.max()),
            "nll_nats": float(run_nll.mean()), "eager_nll_nats": float(eager_nll.mean()),
            "nll_delta_nats": float(nll_steps.mean()), "nll_delta_low_nats": nll_low, "nll_delta_high_nats": nll_high,
            "kl_tolerance_nats": tolerance, "fidelity": verdict}


def _fp32_rows_at_most(stepper) -> int:
    """The rows whose context fits in FP32_TOKENS."""
    return max(1, min(stepper.bs, FP32_TOKENS // max(stepper.context_len, 1)))


def _fp32_rows(model, stepper) -> int:
    """As many of the batch's rows as an fp32 cache for them fits in half the free GPU memory, and at most
    FP32_TOKENS of context."""
    most = _fp32_rows_at_most(stepper)
    if not stepper.input_ids.is_cuda:
        return most
    torch.cuda.empty_cache()  # the run's cache, just freed
    kv_heads, head_dim = kv_heads_and_dim(model.config)
    per_row = 2 * model.config.num_hidden_layers * kv_heads * head_dim * stepper.cache_len * 4  # K and V, fp32
    return max(1, min(most, int(torch.cuda.mem_get_info()[0] / 2 // per_row)))


@contextmanager
def attention(model, name: str):
    """The model with another attention backend for the duration."""
    before = model.config._attn_implementation
    if before != name:
        model.set_attn_implementation(name)
    try:
        yield
    finally:
        if before != name:
            model.set_attn_implementation(before)


@contextmanager
def computed_in_fp32(model):
    """The model computing in fp32 from its own weights, with transformers' sdpa attention and its eager experts
    loop (the plainest kernels). Each module widens its parameters as it runs and gets the very same
    Parameter objects back after (graphs captured on them stay valid): a whole fp32 copy of a 30B model
    (122 GB) would not fit beside it."""
    hooks = [h for module in model.modules() if module._parameters
             for h in (module.register_forward_pre_hook(_widen), module.register_forward_hook(_narrow, always_call=True))]
    experts = getattr(model.config, "_experts_implementation", None)
    try:
        with attention(model, "sdpa"):
            if experts not in (None, "eager"):
                model.set_experts_implementation("eager")
            yield model
    finally:
        if experts not in (None, "eager"):
            model.set_experts_implementation(experts)
        for hook in hooks:
            hook.remove()


def _widen(module, args):
    module._narrow_parameters = dict(module._parameters)
    for name, param in module._narrow_parameters.items():
        if param is not None and param.is_floating_point():
            module._parameters[name] = param.float()  # a plain tensor for one call: F.linear & co. take it


def _narrow(module, args, output):
    module._parameters.update(module.__dict__.pop("_narrow_parameters", {}))
