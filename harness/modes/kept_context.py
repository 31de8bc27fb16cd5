"""The prefilled context a sweep's next job decodes from, where its prefill would compute the very same K/V again.

A sweep's jobs run in one process (Hydra's basic launcher), grouped by model and then by the context they fill
(harness/config/labels.py, in_run_order). At a long context the jobs of one batch and context (eager and graphed
under sdpa, graphed under sdpa-gqa and flex) would each prefill the same K/V: 12 s a job at bs=32 and context 32768
on the H200. So a job whose context is intact at its end keeps its cache here, on the GPU, and the next job's
stepper takes it where it asks for a cache of the very same size (`cache_for`, from the stepper's constructor: a
captured graph holds the cache's addresses, so the cache itself must be the one kept, not a copy). That job then
decodes from the kept context where everything that decides its K/V is the same (`Filled.fills`), else it prefills
into the taken cache as into a new one. One context is kept at most, between two jobs: a job that asks for a cache
of another size frees it first.

What a context is kept with and judged by (its digest, the conditions to keep one) is the measurement's:
harness/measure/job.py (`adopt_or_prefill`) and harness/measure/context_check.py (`keep_or_release`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import StaticCache


@dataclass
class Filled:
    """A cache, filled by one job's prefill, with what decided its context's K/V."""

    cache: StaticCache
    # What decides the context's K/V besides the prompt: the model's weights (get_model's key), the attention its
    # prefill runs (AttentionSpec.prefill), and the cache's rows, capacity and dtype
    fills: tuple
    prompt: torch.Tensor  # the rows' prompt [rows, context] the prefill read (padded rows included)
    first_ids: torch.Tensor  # [rows, 1]: the prefill's greedy token, the first a decode reads
    digest: torch.Tensor  # the context as verification found it at the job's end (context_digest's sums)
    prefill_tokens_per_s: float  # the prefill that filled it: the time to first token its adopters log
    filled_by: str  # the label of the job whose prefill it was

    @property
    def context_len(self) -> int:
        return self.prompt.shape[1]

    def serves(self, fills: tuple, prompt: torch.Tensor) -> bool:
        """Whether a prefill with these `fills` of this (padded) prompt would compute this very context."""
        return self.fills == fills and self.prompt.device == prompt.device and torch.equal(self.prompt, prompt)


_kept: list[Filled] = []  # at most one, from a job's end to the next one's stepper
_taken: list[Filled] = []  # at most one: the taken cache's context, until its stepper prefills


def keep(filled: Filled) -> None:
    """Keep a job's filled cache for the next job (the one kept before, if any, is freed)."""
    drop()
    _kept.append(filled)


def cache_for(layers: int, shape: tuple[int, int, int, int], dtype: torch.dtype,
              device: torch.device) -> StaticCache | None:
    """The kept cache, where it has these layers of K/V of this shape [rows, kv_heads, cache_len, head_dim], dtype
    and device: taken (no longer kept), its write position at the end of its context, so that a capture's warm-up
    steps write after the context, not over it. Else None, and a kept cache of another size is freed first, so that
    the caller's fits beside no other."""
    _taken.clear()  # a stepper built before this one took the cache and did not prefill: it is that stepper's alone
    if not _kept:
        return None
    filled = _kept[0]
    keys = filled.cache.layers[0].keys
    if (keys is None or len(filled.cache.layers) != layers or tuple(keys.shape) != tuple(shape)
            or keys.dtype != dtype or keys.device != torch.device(device)):
        drop()
        return None
    _kept.clear()
    set_write_position(filled.cache, filled.context_len)
    _taken.append(filled)
    return filled.cache


def set_write_position(cache: StaticCache, position: int) -> None:
    """Every layer's write position (transformers' `cumulative_length`, a device tensor): the slot the next step's
    K/V go to. No host sync."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(position)


def taken_with(cache: StaticCache) -> Filled | None:
    """The context the cache held when a stepper took it (once: a second ask, after a prefill, gets None)."""
    return _taken.pop() if _taken and _taken[0].cache is cache else None


def forget_taken() -> None:
    """A job's end: a taken cache's context that no prefill asked for is not held for anyone."""
    _taken.clear()


def kept_bytes() -> int:
    """The device memory the kept context holds (its cache, prompt, first token and digest), as the caching allocator
    counts it (each storage rounded up to its 512-byte blocks): the jobs' memory probes leave it out."""
    storages = {}
    for filled in _kept:
        tensors = [t for layer in filled.cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        for t in (*tensors, filled.prompt, filled.first_ids, filled.digest):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(-(-size // 512) * 512 for size in storages.values())


def drop() -> None:
    """Free the kept cache, and forget any taken one's context (the process's models were released, a test
    wants a cold start, or a job asks for a cache of another size)."""
    _kept.clear()
    _taken.clear()
