"""The attention-backend registry: every decode attention backend by name, with what the rest of the harness
must know of it (how it reads the KV cache, for the roofline; whether it computes what the reference computes,
for verification; the cache granularity it needs, for the schema).

Importing this module imports no torch, like the mode registry: the schema validates `attn=` against it. A job
calls a backend's `setup` (its "module:function", given the device) before it builds a model, which registers
the backend with transformers' AttentionInterface. Adding a backend is one module under harness/kernels/ plus
one `register(AttentionSpec(...))` line below.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.registry import Registry, load

# How a backend reads the KV cache in a decode step, for the bytes it moves (harness/measure/roofline.py)
EVERY_SLOT_REPEATED = "every slot, K/V expanded to the query heads"  # repeat_kv: read once, n_rep copies written and read
EVERY_SLOT = "every slot, on the KV heads"
VALID_PREFIX = "the valid prefix, on the KV heads"  # in whole `block`s of slots


@dataclass(frozen=True)
class AttentionSpec:
    name: str
    kv_read: str  # one of the three above
    # "module:function(device)" that readies the backend (imports, registers it with transformers), or None
    setup: str | None = None
    block: int = 1  # the slots a valid-prefix backend reads at a time: cache_len must be whole blocks where > 1
    cache_in_blocks: bool = False  # cache_len must be a multiple of `block`
    # Slots between the positions at which its reads change shape (a new block or KV chunk begins): verification
    # decodes across at least one such position (harness/measure/context_check.py, verified_steps)
    edge: int = 1
    # Computes decode attention as the reference does (transformers' sdpa, whose fp32 run is verification's
    # reference): a run's logits then compare bit for bit with eager's. Any other backend is also judged
    # against fp32.
    reference: bool = False
    # "module:function(position, slots, device) -> int": how many of a cache's first slots its read plan (block
    # count) covers for the query at `position`, where the plan is made on the host; verification checks it covers
    # every valid slot. None where the plan is made inside the kernel (the check is then not applied)
    read_plan: str | None = None
    # The attention a prefill (more than one query token) runs: the backends that decode with their own kernels
    # prefill through transformers' SDPA and its mask (harness/kernels/attention.py, _prefill_or), so one context
    # K/V serves each of them, and the next job of a sweep may decode from the one an earlier job filled
    # (harness/modes/kept_context.py)
    prefill: str = "sdpa"

    def slots_planned(self, position: int, slots: int, device) -> int | None:
        """How many first slots its read plan covers for the query at `position`; None where it has no host plan."""
        return None if self.read_plan is None else load(self.read_plan)(position, slots, device)

    def ready(self, device) -> None:
        if self.setup is not None:
            load(self.setup)(device)


ATTENTION = Registry("attn")
register, attention_spec = ATTENTION.register, ATTENTION.spec


FLEX_BLOCK = 128  # slots per block of flex's block mask: the granularity at which attn=flex skips the cache
TRITON_DECODE_BLOCK = 64  # slots per step of triton-decode's loop (its BLOCK_N): its chunks are whole such blocks

register(AttentionSpec("sdpa", EVERY_SLOT_REPEATED, reference=True))
register(AttentionSpec("sdpa-gqa", EVERY_SLOT, setup="harness.kernels.attention:use_sdpa_gqa"))
# transformers' sdpa with torch's dispatch held off cuDNN's attention at decode: the same computation (its fp32
# run, the reference's, never took cuDNN's kernel), one that reproduces itself bit for bit
register(AttentionSpec("sdpa-nocudnn", EVERY_SLOT_REPEATED, setup="harness.kernels.attention:use_sdpa_nocudnn",
                       reference=True))
register(AttentionSpec("flex", VALID_PREFIX, setup="harness.kernels.attention:use_flex", block=FLEX_BLOCK,
                       cache_in_blocks=True, edge=FLEX_BLOCK, read_plan="harness.kernels.attention:flex_slots_planned"))
register(AttentionSpec("triton-decode", VALID_PREFIX, setup="harness.kernels.attention:use_triton_decode",
                       edge=TRITON_DECODE_BLOCK))
register(AttentionSpec("eager", EVERY_SLOT_REPEATED, prefill="eager"))
