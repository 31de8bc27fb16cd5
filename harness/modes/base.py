"""The one interface every decode mode implements.

A mode's `prepare(model, prompt, cfg)` builds its Stepper and readies it (capture, compile). A stepper owns
its StaticCache (allocated in its constructor, outside any graph pool) and the input buffer the next step
reads (`input_ids`, [bs, 1]). `restart(prompt)` empties the cache and prefills the context; `rewind()` puts
it back where that prefill left it (the context's K/V stay in place: decode writes only after them), so
repeats and checks need no second prefill; `rewind_to(steps, ids)` puts it where a decode of `steps` steps
from the context left it (the timed window's start, after a warm-up of whole K-step calls that went past it).
`step()` decodes `tokens_per_step` tokens and returns the last one's logits [bs, vocab]. Unless the stepper
`feeds_itself` (argmax and feeding inside its graph), the caller writes the argmax back into `input_ids`.
"""
from __future__ import annotations

import inspect
from typing import ClassVar

import torch
from transformers import DynamicCache, StaticCache
from transformers.masking_utils import create_causal_mask

from harness.modes import kept_context

# The keyword that hands a model its KV cache: `cache` in the transformers releases that deprecate
# `past_key_values` (5.23 on; it goes in 5.40), `past_key_values` before (5.17 on the H200). The models of
# every family and the masking functions took the rename in one release, so one signature tells.
CACHE_KWARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"

# A prefill chunk's mask (rows x chunk x cache slots) stays under this: where SDPA falls back to its math
# kernel (fp32, the verification's reference), the scores take heads x 4 bytes per element of it.
PREFILL_MASK_ELEMENTS = 1 << 28


def prefill_chunk(rows: int, context_len: int, cache_len: int) -> int:
    """Tokens per prefill chunk: the whole context where its attention mask fits, else whole blocks of 128."""
    fits = PREFILL_MASK_ELEMENTS // (rows * cache_len)
    return context_len if fits >= context_len else max(128, fits // 128 * 128)


# A prefill stages a group of rows' K/V in a DynamicCache before copying them into the static cache: the group's
# staged K/V stay under this many bytes (one row at a time where a row's alone is more).
PREFILL_STAGING_BYTES = 4 << 30
# A group's whole context goes through the model in one forward where it holds at most this many tokens (rows x
# context): one causal forward needs no mask (SDPA's flash kernel, which reads the context once per block of
# queries), where a second chunk attends through a mask over the chunks before it (SDPA's memory-efficient kernel,
# reading that mask too). At this many tokens the activations stay within a few GB for the models here.
PREFILL_FORWARD_TOKENS = 1 << 16


def staged_prefill_chunk(rows: int, context_len: int) -> int:
    """Tokens per forward of a staged prefill (its cache holds the context so far and nothing more): the whole
    context where the group's fits in PREFILL_FORWARD_TOKENS, else chunks whose masks fit (prefill_chunk)."""
    if rows * context_len <= PREFILL_FORWARD_TOKENS:
        return context_len
    return min(prefill_chunk(rows, context_len, context_len), max(128, PREFILL_FORWARD_TOKENS // rows // 128 * 128))


def prefill(model: torch.nn.Module, cache, prompt: torch.Tensor) -> torch.Tensor:
    """Eager prefill of the whole prompt that reads only the valid prefix; returns the first greedy token [rows, 1].
    Each group of rows runs through the model with a DynamicCache, which holds the context so far and nothing
    more (causal attention over it, without a mask over the static cache's empty slots: SDPA's fused kernels),
    the whole context in one forward where it fits (no mask at all), else in chunks; its K/V are then copied into
    the static cache's first slots, and the cache's write position set after them, as a prefill into the static
    cache leaves it."""
    rows, context_len = prompt.shape
    layer = cache.layers[0]
    row_bytes = 2 * len(cache.layers) * layer.keys[0, :, :context_len].numel() * layer.keys.element_size()
    group = max(1, min(rows, PREFILL_STAGING_BYTES // max(row_bytes, 1)))
    chunk = staged_prefill_chunk(group, context_len)
    first = []
    for top in range(0, rows, group):
        staged = DynamicCache(config=model.config)
        for start in range(0, context_len, chunk):
            out = model(input_ids=prompt[top:top + group, start:start + chunk], **{CACHE_KWARG: staged},
                        use_cache=True, logits_to_keep=1)
        for target, source in zip(cache.layers, staged.layers):
            if source.keys is None:  # a layer that wrote nothing (a test's fault skips one): its slots stay empty
                continue
            target.keys[top:top + group, :, :context_len].copy_(source.keys)
            target.values[top:top + group, :, :context_len].copy_(source.values)
        first.append(out.logits[:, -1, :].argmax(dim=-1, keepdim=True))
        del staged, out
    kept_context.set_write_position(cache, context_len)
    return torch.cat(first)


def prefill_over_every_slot(model: torch.nn.Module, cache, prompt: torch.Tensor) -> torch.Tensor:
    """transformers' own prefill into the static cache (SDPA over every slot of it, masked), in chunks where it is
    long: what `prefill` must equal, token for token (tests/unit/modes/test_base.py)."""
    chunk = prefill_chunk(prompt.shape[0], prompt.shape[1], cache.layers[0].max_cache_len)
    for start in range(0, prompt.shape[1], chunk):
        out = model(input_ids=prompt[:, start:start + chunk], **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :].argmax(dim=-1, keepdim=True)


def forward_step(model: torch.nn.Module, cache, input_ids: torch.Tensor) -> torch.Tensor:
    """One decode step; the StaticCache advances its own device-side position."""
    return model(input_ids=input_ids, **{CACHE_KWARG: cache}, use_cache=True).logits[:, -1, :]


def pad_rows(prompt: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad a batch up to `rows` with token-0 rows, whose outputs are discarded."""
    missing = rows - prompt.shape[0]
    return prompt if missing == 0 else torch.cat([prompt, prompt.new_zeros(missing, prompt.shape[1])])


def kv_heads_and_dim(config) -> tuple[int, int]:
    """The K/V heads a cache holds per layer, and their size."""
    return config.num_key_value_heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def static_cache(model: torch.nn.Module, rows: int, cache_len: int, device: torch.device,
                 dtype: torch.dtype | None = None) -> StaticCache:
    """A StaticCache with its K/V allocated now, so that no graph pool ever holds it; in the model's dtype
    unless told (an fp32 reference of a bf16 model). The cache an earlier job kept, where it has this size
    (harness/modes/kept_context.py): the job may then decode from its context instead of prefilling it again."""
    kv_heads, head_dim = kv_heads_and_dim(model.config)
    shape = (rows, kv_heads, cache_len, head_dim)
    if (kept := kept_context.cache_for(model.config.num_hidden_layers, shape, dtype or model.dtype, device)) is not None:
        return kept
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    cache.early_initialization(rows, kv_heads, head_dim, dtype or model.dtype, device)
    return cache


class CaptureError(RuntimeError):
    """A mode that cannot run this model (its step cannot be captured): the run's recorded reason."""


class Stepper:
    graph_bytes: int = 0  # memory held by the stepper's graphs
    tokens_per_step: int = 1
    feeds_itself: bool = False

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, cache_len: int, rows: int | None = None,
                 shared: Stepper | None = None, prefill: bool = True, dtype: torch.dtype | None = None):
        """`shared`: a prefilled stepper of the same rows whose cache this one decodes in (a reference).
        `prefill=False`: the caller prefills later (a mode's job prefills once, after its capture).
        `dtype`: the cache's, where the model computes in another than its parameters' (verify's fp32)."""
        self.model, self.bs, self.cache_len = model, prompt.shape[0], cache_len
        self.rows = rows or self.bs  # a bucketed stepper runs more rows than the batch has
        self.cache = shared.cache if shared else static_cache(model, self.rows, cache_len, prompt.device, dtype)
        self.context_len, self.first_ids = (shared.context_len, shared.first_ids) if shared else (0, None)
        self.static_ids = torch.zeros(self.rows, 1, dtype=torch.long, device=prompt.device)
        self.input_ids = self.static_ids if self.rows == self.bs else self.static_ids[: self.bs]
        self.tokens = self.input_ids.T  # [tokens_per_step, bs]: what the last step produced
        self.metrics: dict[str, float] = {}  # mode-specific numbers, merged into the run's metrics
        self.tags: dict[str, str] = {}
        if shared:
            self.rewind()
        elif prefill:
            self.restart(prompt)

    def restart(self, prompt: torch.Tensor) -> None:
        self.cache.reset()
        self.first_ids = prefill(self.model, self.cache, pad_rows(prompt, self.rows))
        self.context_len = prompt.shape[1]
        self.static_ids.copy_(self.first_ids)

    def adopt(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], first_ids: torch.Tensor) -> None:
        """Decode from a context another stepper prefilled, as restart() would leave it: its K/V per layer
        [rows, kv_heads, context, head_dim], cast to this cache's dtype, in the first slots, and its first token."""
        self.cache.reset()
        for layer, (keys, values) in zip(self.cache.layers, prefix):
            layer.keys[:, :, :keys.shape[2]].copy_(keys)
            layer.values[:, :, :values.shape[2]].copy_(values)
        self.context_len, self.first_ids = prefix[0][0].shape[2], first_ids.clone()
        self.rewind()

    def rewind(self) -> None:
        """Back to the state the last prefill left: the same context, the same first token (no host sync)."""
        kept_context.set_write_position(self.cache, self.context_len)
        self.static_ids.copy_(self.first_ids)

    def rewind_to(self, steps: int, ids: torch.Tensor) -> None:
        """Back to where a greedy decode of `steps` steps from the context left it, after a decode that went past
        (the K/V of those steps stay in place): the write position `steps` slots after the context, and `ids` [bs],
        the token that decode would feed its next step, as the next input (no host sync)."""
        kept_context.set_write_position(self.cache, self.context_len + steps)
        self.input_ids.copy_(ids[:, None])

    def release(self) -> None:
        """Free the cache (a stepper that will not step again), so that a check can allocate its own; a cache
        handed to the next job (hand_over_cache) stays whole."""
        for layer in self.cache.layers if self.cache is not None else ():
            layer.keys = layer.values = None

    def hand_over_cache(self) -> StaticCache:
        """The stepper's cache, whole, for another owner (the next job: harness/modes/kept_context.py); release()
        then frees everything of the stepper's but it."""
        cache, self.cache = self.cache, None
        return cache

    def forward(self) -> torch.Tensor:
        """One eager decode step of every row the stepper holds."""
        return forward_step(self.model, self.cache, self.static_ids)

    def step(self) -> torch.Tensor:
        return self.forward()[: self.bs]


class DecodeMode:
    name: ClassVar[str]
    needs_cuda: ClassVar[bool] = False
    # Every run proves its decode (harness/measure/verify.py). Exact modes run eager's very kernels, so their logits
    # must equal eager's bit for bit; inexact ones (other kernels, other rounding) are judged against fp32.
    exact: ClassVar[bool] = True
    prepare_phase: ClassVar[str] = "capture"  # what prepare() does, for the progress line

    def check(self, device: torch.device) -> str | None:
        """Why this mode cannot run here, or None."""
        if self.needs_cuda and device.type != "cuda":
            return (f"mode={self.name} needs a CUDA GPU and this job runs on {device} "
                    f"(torch.cuda.is_available() is {torch.cuda.is_available()}); use mode=eager here")
        return None

    def prepare(self, model: torch.nn.Module, prompt: torch.Tensor, cfg) -> Stepper:
        raise NotImplementedError
