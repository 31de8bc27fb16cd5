"""Eager reference decodes, computed once per shape and kept for the next job of a sweep that needs them.

A sweep's jobs of one shape (model, dtype, attention backend, rows, cache length, prompt) differ in mode only, and
every exact mode is checked against the same eager decodes: teacher-forced on the run's tokens, so that where two
runs decoded the same tokens (as eager's very kernels do), the reference of one is the reference of the other. The
jobs of a sweep run in one process (Hydra's basic launcher), one after another, so the last shape's references are
kept, on the host (a job gives its GPU memory back), and a job asking with anything different (another shape, other
tokens, another first token) computes its own and replaces them. The keys are compared in full, never by hash.

A reference from another job is no weaker than one computed in the run's own cache: it decodes the same prompt
after another job's prefill, so a prefill of the run's own that went wrong shows, where a reference sharing the
run's cache would share the fault. Where the run decodes from the context that other job filled (handed over with
its cache: harness/modes/kept_context.py), it ran no prefill of its own, and both decode from that one context,
which the hand-over checks (the prompt and what else decides it, and its slot sums).

A job asks for all of this through one object, JobReferences: before its timed loop, the list plain eager's own loop
keeps its logits in (that loop is its own check's reference, LoopReference) and how far a loop an earlier job kept
reaches; after its first timed block, to keep that loop; at verification, the loop and the context it offers.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Callable

import torch

from harness.modes.eager import EagerStepper

_MODEL_TOKEN = "_harness_reference_token"  # a model object's own id: id() is reused once an object is freed


@dataclass
class _Entry:
    shape: tuple
    inputs: list[torch.Tensor]  # the prompt, first token and fed tokens, on the host, compared element by element
    passes: list = field(default_factory=list)  # the reference's decodes so far (a recheck adds one)
    jobs: list[int] = field(default_factory=list)  # the job that computed each pass


_kept: dict[str, _Entry] = {}  # one entry per kind of reference: the last shape's
hits = {"hits": 0, "computed": 0}  # counts since the process started (tests and the job's metrics read them)
_job = [0]  # the job now verifying, counted from the process's start


def new_job() -> None:
    """A job's verification starts: what was kept so far is an earlier job's."""
    _job[0] += 1


def shape_of(model: torch.nn.Module, stepper, k: int = 1) -> tuple:
    """What, besides its inputs, decides a reference's logits: the model's weights (the key get_model built them
    from; else the object itself), its attention backend and dtype, the rows and capacity of the cache, and the
    tokens a call decodes (its logits are kept at every k-th step)."""
    return weights_key(model), model.config._attn_implementation, str(model.dtype), stepper.rows, stepper.cache_len, k


def weights_key(model: torch.nn.Module) -> str:
    """The key get_model built the model's weights from, else a token of the model object itself."""
    weights = getattr(model, "harness_weights_key", None)
    if weights is None:
        weights = getattr(model, _MODEL_TOKEN, None) or secrets.token_hex(8)
        setattr(model, _MODEL_TOKEN, weights)
    return weights


def reference(kind: str, shape: tuple, inputs: list[torch.Tensor], index: int, compute: Callable[[], object]):
    """The `index`-th decode of this kind of reference for these inputs: kept if a job computed it for the very
    same shape and inputs, else `compute()`d now (its tensors kept on the host)."""
    entry = _entry(kind, shape, inputs)
    if index < len(entry.passes):
        hits["hits"] += 1
        return _to(entry.passes[index], inputs[0].device)
    result = compute()
    _add(entry, index, result)
    return result


def kept(kind: str, shape: tuple, inputs: list[torch.Tensor], index: int) -> bool:
    """Whether the `index`-th decode for these inputs is kept (without counting a hit)."""
    entry = _matching(kind, shape, _host(inputs))
    return entry is not None and index < len(entry.passes)


def kept_length(kind: str, shape: tuple, leading: list[torch.Tensor]) -> int | None:
    """How many tokens the kept reference of this kind was fed (its last input's length), where its shape and its
    leading inputs (the prompt, the first token) are these: the length a decode's tokens need for it to serve."""
    entry = _matching(kind, shape, _host(leading), leading_only=True)
    return entry.inputs[-1].shape[0] if entry is not None and entry.passes else None


def put(kind: str, shape: tuple, inputs: list[torch.Tensor], index: int, result, computed: bool = True) -> None:
    """Keep a decode computed for these inputs by other means (one pass that served two references), or, with
    computed=False, one the verification did not compute at all (plain eager's own timed loop)."""
    _add(_entry(kind, shape, inputs), index, result, computed)


def from_earlier_job(kind: str) -> bool:
    """Whether a kept pass of this kind was computed by an earlier job (in its own cache, after its own prefill)."""
    entry = _kept.get(kind)
    return entry is not None and any(job != _job[0] for job in entry.jobs)


def passes_of_one_earlier_job(kind: str) -> int:
    """How many passes of this kind are kept, where one earlier job computed them all (else 0)."""
    entry = _kept.get(kind)
    if entry is None or not entry.jobs or len(set(entry.jobs)) != 1 or entry.jobs[0] == _job[0]:
        return 0
    return len(entry.passes)


def _entry(kind: str, shape: tuple, inputs: list[torch.Tensor]) -> _Entry:
    """The kept entry of this kind for this shape and these inputs, a fresh one (replacing it) where it is not."""
    host = _host(inputs)
    entry = _matching(kind, shape, host)
    if entry is None:
        entry = _kept[kind] = _Entry(shape, host)
    return entry


def _matching(kind: str, shape: tuple, host: list[torch.Tensor], leading_only: bool = False) -> _Entry | None:
    """The kept entry of this kind where its shape and its inputs are these (host tensors; with leading_only, its
    first len(host) inputs), else None."""
    entry = _kept.get(kind)
    if entry is None or entry.shape != shape:
        return None
    theirs = entry.inputs[:len(host)] if leading_only else entry.inputs
    return entry if _same(theirs, host) else None


def _add(entry: _Entry, index: int, result, computed: bool = True) -> None:
    hits["computed"] += int(computed)
    if index == len(entry.passes):
        entry.passes.append(_to(result, torch.device("cpu")))
        entry.jobs.append(_job[0])


def _host(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().cpu() for t in inputs]


def note_variation(shape: tuple, inputs: list[torch.Tensor], logits_diff: float) -> None:
    """Eager's own variation (the largest logit difference between two of its decodes in one cache) measured for this
    shape and prompt: the kernels' nondeterminism at this shape, whatever tokens were fed. The largest is kept."""
    entry = _entry("variation", shape, inputs)
    entry.passes = [max(entry.passes + [logits_diff])]
    entry.jobs = [_job[0]]


def variation(shape: tuple, inputs: list[torch.Tensor]) -> float | None:
    """Eager's variation an earlier job measured for this shape and prompt, or None."""
    entry = _matching("variation", shape, _host(inputs))
    return entry.passes[0] if entry is not None and entry.passes else None


def drop(kind: str) -> None:
    """Drop the kept reference of one kind: the next ask computes it in the asking job's cache."""
    _kept.pop(kind, None)


def forget() -> None:
    """Drop every kept reference (the process's models were released, or a test wants a cold start)."""
    _kept.clear()


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def _to(value, device: torch.device):
    """A tensor, or a dataclass or tuple of tensors, moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return type(value)(**{k: _to(v, device) for k, v in vars(value).items()})


@dataclass
class LoopReference:
    """Plain eager's own loop (warm-up and first timed block), kept as the reference its checks would otherwise
    decode again: an eager decode fed the loop's tokens is that very loop, the same kernels over the same history."""

    logits: torch.Tensor  # [steps, bs, vocab]: the first verified steps' logits
    # as lockstep's token gaps: (gap, chosen, best), each [steps, bs]
    gaps: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def loop_serves_as_reference(stepper, exact: bool) -> bool:
    """Whether the run's loop is plain eager itself (no other stepper, no test's mutation wrapping it)."""
    return exact and type(stepper) is EagerStepper


def loop_reference(logits: list[torch.Tensor], decoded: torch.Tensor, steps: int) -> LoopReference:
    """The loop's logits, a call each [bs, vocab], and the tokens it decoded [calls, bs]: the first `steps` logits
    stacked, and how far below each step's best logit the token fed after it ranks (0 where the loop fed its argmax;
    more where its feeding went wrong)."""
    if len(logits) != decoded.shape[0]:
        raise ValueError(f"the loop kept {len(logits)} logits for {decoded.shape[0]} decoded steps")
    return LoopReference(torch.stack(logits[:steps]), gaps_of(logits, decoded))


def gaps_of(step_logits, decoded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How far below each step's best logit the token decoded at it ranks, that token's logit and the best, each
    [steps, bs] in fp32, from each step's logits [bs, vocab] in turn (the whole [steps, bs, vocab] is never widened)."""
    chosen, best = [], []
    for out, tokens in zip(step_logits, decoded):
        logits = out.float()
        best.append(logits.max(dim=-1).values)
        chosen.append(logits.gather(-1, tokens[:, None])[:, 0])
    chosen_logits, best_logits = torch.stack(chosen), torch.stack(best)
    return best_logits - chosen_logits, chosen_logits, best_logits


class JobReferences:
    """What one job takes from the jobs before it and leaves to the next, asked for around its timed loop, so that
    the loop itself knows nothing of it:
    - before timing: `loop_logits`, the list the warm-up and the first timed block append each call's logits to where
      the loop is plain eager's own (else None), and `kept_loop_steps`, how far an earlier job's kept loop reaches,
      which a block decodes as far as, so that the kept reference serves this job's check;
    - after the first timed block, outside its clock: `keep_loop`, which turns those logits into `loop`, the
      LoopReference the lockstep takes instead of decoding eager again;
    - at verification: `loop`, and `context_offer`, what the job hands the next one with its cache where the check
      keeps it (context_check.keep_or_release)."""

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, stepper, exact: bool, steps_checked: int,
                 context_offer: tuple[float, str] | None = None):
        self.model, self.prompt, self.stepper, self.exact = model, prompt, stepper, exact
        self.steps_checked = steps_checked  # the steps verification decodes from the context (verified_steps)
        self.context_offer = context_offer  # (the prefill's tokens a second, the label of the job whose prefill)
        self.loop_logits: list[torch.Tensor] | None = [] if loop_serves_as_reference(stepper, exact) else None
        self.loop: LoopReference | None = None

    def kept_loop_steps(self, warm_steps: int) -> int | None:
        """The steps past the warm-up of the loop an earlier job of this shape, prompt and first token left as the
        token check's reference (plain eager's own loop, in a sweep), where this run's check is eager's (an exact
        mode)."""
        if not self.exact:
            return None
        kept = kept_length("gaps", shape_of(self.model, self.stepper), [self.prompt, self.stepper.first_ids])
        return None if kept is None else kept - warm_steps

    def keep_loop(self, decoded: torch.Tensor) -> None:
        """After the first timed block: the logits the warm-up and that block kept, and the tokens they decoded
        [steps, bs], become the loop's reference; the list is emptied (the reference holds what it needs)."""
        if self.loop_logits is None:
            return
        self.loop = loop_reference(self.loop_logits, decoded, self.steps_checked)
        self.loop_logits.clear()
