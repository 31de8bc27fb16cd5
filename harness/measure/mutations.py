"""Test-only faults in the decode under test, to prove the verification catches subtle bugs.

HARNESS_INJECT_MUTATION=KIND wraps the mode's stepper (never the reference it is checked against) so that
every call it makes, its capture included, runs with the fault. A few act where a fault of the real code would show
and the stepper's calls cannot reach: in what the loop's own code records of a call (RECORDING_FAULTS), or in what
verification asks the attention backend's real read planner (READ_PLAN_FAULTS). It is a test hook, not a config key:
nothing a user sweeps can turn it on, and a run made with it says so in its tags.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from harness.kernels import attention_spec
from harness.modes.fused import NOT_FED

# inside mode=fused's own kernels, which patching the model's modules cannot reach: RoPE one position ahead in
# decode (prefill right), the new token's K/V never appended to the cache, (graph_steps > 1) each step's
# argmax kept as the run's token but not fed to the next step, which reads its own input again, and every RMSNorm's
# epsilon 1000x too large (a systematic error in every layer, of bf16's own size by the logits: the layer gate's)
FUSED_KERNEL_FAULTS = ("fused_rope_off_by_one", "kv_append_lost", NOT_FED, "fused_norm_eps_1000x")
# a rewind that clears the decoded slots from one slot too early: the context's last K/V zeroed in every layer, from
# the first rewind on (blocks after the first, the checks), where the free run and every reference that decodes in the
# run's cache read the same damaged context
REWIND_FAULTS = ("rewind_clears_context_end",)
# the stepper's own rewind, asked to rewind to one slot past the context: every layer then writes a slot too far after
# each rewind, and the run, eager's references and the fp32 calibration would all decode from there alike
REWIND_POSITION_FAULTS = ("rewind_one_slot_off",)
# the attention backend's read plan (its block count, made on the host) asked for the position before the one it
# plans: the plan of a token that starts a block then leaves that block unread, as a count one short does there
# (ceil(position / block) for position // block + 1). Acts in verification's check of the plan: on a CPU, flex's
# unfused decode reads every block whatever the count
READ_PLAN_FAULTS = ("read_plan_one_behind",)
# faults in what the loop records, not in what it decodes: from the prefill to the next rewind (the warm-up and first
# timed block, whose tokens the checks judge), the token the loop's own code records for a call is the one the call
# read (its input), not the argmax it fed on; verification's free run, after its rewind, records as it should
RECORDING_FAULTS = ("input_token_recorded",)
KINDS = ("kv_lost", "rope_off_by_one", "layer_skipped", "newest_masked", "stale_token", *REWIND_FAULTS,
         *REWIND_POSITION_FAULTS, *READ_PLAN_FAULTS, *RECORDING_FAULTS, *FUSED_KERNEL_FAULTS)


def requested(mode: str, attn: str | None = None) -> str | None:
    """The fault HARNESS_INJECT_MUTATION asks of a job of `mode` (and attention backend `attn`), or None; one that
    cannot act in it is refused (a fault inside mode=fused's kernels would leave another mode's run untouched, and
    passing; so would a fault in a read plan where the backend makes none on the host)."""
    kind = os.environ.get("HARNESS_INJECT_MUTATION") or None
    if kind is not None and kind not in KINDS:
        raise ValueError(f"HARNESS_INJECT_MUTATION={kind} is not one of {', '.join(KINDS)}")
    if kind in FUSED_KERNEL_FAULTS and mode != "fused":
        raise ValueError(f"HARNESS_INJECT_MUTATION={kind} acts inside mode=fused's kernels, and this job is mode={mode}")
    if kind in READ_PLAN_FAULTS and attn is not None and attention_spec(attn).read_plan is None:
        raise ValueError(f"HARNESS_INJECT_MUTATION={kind} acts in a read plan made on the host, and attn={attn} "
                         f"makes none; use attn=flex")
    return kind


@contextmanager
def patched(model, kind: str):
    """The model's forward with the fault, for the duration (the stepper-level faults patch nothing); the model's
    `harness_mutation` names it meanwhile, so that a compiled step traced with it is never kept for a clean run."""
    outer = model.__dict__.get("harness_mutation")  # where patched() is nested, the outer call's own
    model.harness_mutation = kind
    undo = ((lambda: delattr(model, "harness_mutation")) if outer is None else
            (lambda: setattr(model, "harness_mutation", outer)))
    with _restoring(undo), _patched(model, kind):
        yield


@contextmanager
def _patched(model, kind: str):
    if kind == "rope_off_by_one":
        rotary = model.model.rotary_emb
        forward = rotary.forward
        rotary.forward = lambda x, position_ids, *a, **kw: forward(x, position_ids + 1, *a, **kw)
        with _restoring(lambda: delattr(rotary, "forward")):
            yield
    elif kind == "layer_skipped":
        layer = model.model.layers[-1]
        layer.forward = lambda hidden_states, *a, **kw: hidden_states
        with _restoring(lambda: delattr(layer, "forward")):
            yield
    elif kind == "newest_masked":
        name = model.config._attn_implementation
        attend = ALL_ATTENTION_FUNCTIONS[name]
        ALL_ATTENTION_FUNCTIONS[name] = lambda m, q, k, v, mask, **kw: attend(m, q, k, v, _without_newest(mask), **kw)
        with _restoring(lambda: ALL_ATTENTION_FUNCTIONS._local_mapping.pop(name, None)):
            yield
    elif kind in FUSED_KERNEL_FAULTS:  # read by mode=fused's prepare, which builds the kernels with the fault
        model.harness_fused_fault = kind
        with _restoring(lambda: delattr(model, "harness_fused_fault")):
            yield
    else:
        yield


@contextmanager
def _restoring(undo):
    try:
        yield
    finally:
        undo()


def _without_newest(mask):
    """A decode step's boolean mask [bs, 1, 1, slots] with its last attended slot (the new token) off."""
    if mask is None or mask.dtype != torch.bool or mask.shape[-2] != 1:
        return mask
    newest = mask.shape[-1] - 1 - mask.flip(-1).int().argmax(dim=-1, keepdim=True)
    return mask.scatter(-1, newest, False)


class MutatedStepper:
    """A mode's stepper with a fault: every call through it runs under `patched`, and the stepper-level
    faults (K/V writes lost, one stale input token) act around its steps."""

    def __init__(self, inner, kind: str):
        self.inner, self.kind, self.calls = inner, kind, 0
        self.since_prefill = False  # no rewind since the last restart
        self.kv_snapshot: list[torch.Tensor] | None = None

    def __getattr__(self, name):  # bs, input_ids, metrics, tags, ... are the inner stepper's
        return getattr(self.inner, name)

    @property
    def tokens(self) -> torch.Tensor:
        """What the last call decoded, as the loop reads it to record it: under input_token_recorded, what that call
        read instead (the token before its argmax)."""
        if self.kind == "input_token_recorded" and self.calls and self.since_prefill:
            return self._previous.T.expand_as(self.inner.tokens)
        return self.inner.tokens

    def restart(self, prompt):
        with patched(self.inner.model, self.kind):
            self.inner.restart(prompt)
        self.calls, self.since_prefill = 0, True
        if self.kind == "kv_lost":  # what a graph writing into a private copy of the cache would leave
            self.kv_snapshot = [t.clone() for layer in self.inner.cache.layers for t in (layer.keys, layer.values)]

    def rewind(self):
        if self.kind == "rewind_one_slot_off":  # the stepper's own rewind, with the context one slot longer
            self.inner.context_len += 1
            try:
                self.inner.rewind()
            finally:
                self.inner.context_len -= 1
        else:
            self.inner.rewind()
        self.calls, self.since_prefill = 0, False
        if self.kind == "rewind_clears_context_end":
            last = self.inner.context_len - 1
            for layer in self.inner.cache.layers:
                layer.keys[:, :, last:].zero_()
                layer.values[:, :, last:].zero_()

    def step(self):
        self.calls += 1
        if self.kind == "stale_token" and self.calls == 2:  # the second step reads the first step's input
            self.inner.input_ids.copy_(self._previous)
        self._previous = self.inner.input_ids.clone()
        with patched(self.inner.model, self.kind):
            out = self.inner.step()
        if self.kv_snapshot is not None:
            live = [t for layer in self.inner.cache.layers for t in (layer.keys, layer.values)]
            for dst, src in zip(live, self.kv_snapshot):
                dst.copy_(src)
        return out
