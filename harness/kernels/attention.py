"""Decode attention backends, registered with transformers' AttentionInterface (`attn=NAME`), so the model
stays transformers' own model. Prefill (more than one query token) keeps transformers' SDPA path in all.
Each backend's `use_*(device)` is its setup in the registry (harness/kernels/__init__.py), called before a
model is built with it.

- `sdpa`: transformers' path, untouched: with a static cache it passes a mask, so K/V are expanded to the
  query heads by repeat_kv and SDPA attends over every slot of the cache, valid or empty.
- `sdpa-gqa`: SDPA on the KV heads, no expansion (GQA_DECODE picks the faster of two ways, measured in
  docs/context.md); still every slot of the cache, masked.
- `sdpa-nocudnn`: transformers' path, its decode steps with torch's SDPA held off cuDNN's attention kernel, whose
  results vary from call to call on the H200 at bs 8 and 32: the memory-efficient kernel runs instead (flash refuses
  the mask), and eager reproduces itself bit for bit, so a graph's check needs one eager pass, not two to four.
- `flex`: flex_attention with a block mask cut at the query's position, so it reads only the valid
  prefix. The position stays on the device (the step's position_ids), so a step has no host sync and can be
  captured in a CUDA graph. On a GPU it runs compiled (Inductor's flex-decoding kernel); on a CPU it runs
  flex's unfused reference, which is slow but exact enough for tests.
- `triton-decode`: a split-KV decode kernel in Triton (harness/kernels/triton_decode.py): reads only the valid
  prefix, cut into chunks that fill the GPU even at bs=1, in two launches a layer. On a CPU it runs in
  Triton's interpreter (tests).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from harness.errors import ConfigError
from harness.kernels import FLEX_BLOCK
from harness.kernels.triton_runtime import interpreted as triton_interpreted, interpreter_ready


def enable_gqa_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """A decode step's SDPA with `enable_gqa=True`: the query heads of a group read their KV head in place."""
    if query.shape[2] != 1 or getattr(module, "num_key_value_groups", 1) == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def packed_rows_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """A decode step's SDPA on the KV heads: the one-token queries of a group become rows of their KV head
    ([bs, heads, 1, d] -> [bs, kv_heads, groups, d]), as the engines' decode kernels pack them."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    bs, heads, _, dim = query.shape
    rows = query.reshape(bs, heads // groups, groups, dim)  # the mask ([bs, 1, 1, slots]) broadcasts
    out = F.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(bs, heads, 1, dim).transpose(1, 2).contiguous(), None  # as SDPA's: [bs, 1, heads, d]


GQA_DECODE = enable_gqa_attention  # attn=sdpa-gqa: the faster of the two on the H200 (docs/context.md)

# torch's SDPA kernels whose forward gives the same bits every call: all but cuDNN's (benchmarks/eager_variation.py
# on the H200: cuDNN's passes 0.22-0.36 apart over the same tokens, the memory-efficient kernel's and math's 0)
REPRODUCIBLE_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_without_cudnn(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers' SDPA attention, a decode step's held to REPRODUCIBLE_SDPA. A prefill runs as dispatched: every
    pass of a check decodes from the one context it filled, and that context serves the `sdpa` jobs too."""
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    with sdpa_kernel(REPRODUCIBLE_SDPA):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def decode_block_mask(position, slots: int, device):
    """flex's block mask for one query token at slot `position` (a 0-d tensor on the device) over `slots` slots:
    the blocks up to and including the position's own (position // FLEX_BLOCK + 1 of them) are read, and the
    mask_mod, offset by the position, cuts the last one (without that offset the query would sit at slot 0 and
    attend to nothing but it)."""
    blocks = torch.arange(slots // FLEX_BLOCK, device=device, dtype=torch.int32).view(1, 1, 1, -1)
    valid_blocks = (position // FLEX_BLOCK + 1).to(torch.int32).view(1, 1, 1)
    return BlockMask.from_kv_blocks(valid_blocks, blocks, BLOCK_SIZE=FLEX_BLOCK, seq_lengths=(1, slots),
                                    mask_mod=lambda b, h, q, kv: kv <= position + q, compute_q_blocks=False)


def flex_slots_planned(position: int, slots: int, device) -> int:
    """The slots flex's block mask reads for the query at `position` (whole blocks: up to 127 past it are cut by
    the mask_mod, not left unread)."""
    mask = decode_block_mask(torch.tensor(position, device=device), slots, device)
    return int(mask.kv_num_blocks.flatten()[0]) * FLEX_BLOCK


def flex_decode(query, key, value, position, scale):
    """One query token per row at slot `position` over key.shape[2] slots: only the valid blocks are read."""
    block_mask = decode_block_mask(position, key.shape[2], key.device)
    return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)


def _reference_flex_decode(*args):
    with warnings.catch_warnings():  # "called without torch.compile": on purpose, see flex_attention_forward
        warnings.simplefilter("ignore", UserWarning)
        return flex_decode(*args)


flex_attention = BlockMask = flex_decode_op = None  # set by use_flex()


def use_sdpa_gqa(device: torch.device) -> None:
    AttentionInterface.register("sdpa-gqa", lambda *a, **kw: GQA_DECODE(*a, **kw))
    AttentionMaskInterface.register("sdpa-gqa", sdpa_mask)


def use_sdpa_nocudnn(device: torch.device) -> None:
    AttentionInterface.register("sdpa-nocudnn", sdpa_without_cudnn)
    AttentionMaskInterface.register("sdpa-nocudnn", sdpa_mask)


def use_flex(device: torch.device) -> None:
    """Import flex and register its compiled decode op, once, when a model is built with attn=flex: the import
    costs seconds (torch._dynamo) that no other backend should pay, and a registration during a compile's
    tracing would fail. The op is opaque, so that a model compiled around it (mode=compiled) calls flex's own
    compiled kernel instead of fusing the mask_mod's position into its template (Inductor 2.11 then emits
    Triton that does not compile: "XBLOCK is not defined"). Inside a CUDA graph it is captured like any kernel."""
    global flex_attention, BlockMask, flex_decode_op
    AttentionInterface.register("flex", flex_attention_forward)
    AttentionMaskInterface.register("flex", prefill_only_mask)
    if flex_decode_op is not None:
        return
    from torch.nn.attention import flex_attention as flex

    flex_attention, BlockMask = flex.flex_attention, flex.BlockMask
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)  # a kernel per shape
    flex_decode_op = _decode_op("flex_decode", torch.compile(flex_decode, fullgraph=True, dynamic=False))


def _decode_op(name: str, kernel):
    """`kernel(query, key, value, position, scale)` as an opaque op: a model compiled around it calls it as it
    is, and a CUDA graph captures it like any kernel."""
    @torch.library.custom_op(f"harness::{name}", mutates_args=())
    def op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, position: torch.Tensor,
           scale: float) -> torch.Tensor:
        return kernel(query, key, value, position, scale).contiguous()

    @op.register_fake
    def _(query, key, value, position, scale):
        return query.new_empty(query.shape)

    return op


def _prefill_or(decode):
    """An attention function: prefill (more than one query token) by transformers' SDPA, a decode step by
    decode(query, key, value, position, scale), which cuts the cache at the position itself."""
    def forward(module, query, key, value, attention_mask, scaling=None, position_ids=None, **kwargs):
        if query.shape[2] != 1:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return decode(query, key, value, position_ids[0, 0], scale).transpose(1, 2).contiguous(), None

    return forward


def _flex_step(query, key, value, position, scale):
    if key.shape[2] % FLEX_BLOCK:
        raise ValueError(f"attn=flex needs cache_len in whole blocks of {FLEX_BLOCK} slots, not {key.shape[2]}")
    # Inductor's CPU flex needs a C++ toolchain and minutes: on a CPU, flex's reference is enough (tests)
    return (flex_decode_op if query.is_cuda else _reference_flex_decode)(query, key, value, position, scale)


flex_attention_forward = _prefill_or(_flex_step)


triton_decode_op = None  # set by use_triton_decode()


def use_triton_decode(device: torch.device) -> None:
    """Register the Triton decode kernel as an opaque op (compiled modes call it as it is), once. Triton runs
    on a CUDA GPU, or on a CPU in its interpreter where the machine has no NVIDIA GPU (triton_runtime.py)."""
    global triton_decode_op
    AttentionInterface.register("triton-decode", triton_decode_forward)
    AttentionMaskInterface.register("triton-decode", prefill_only_mask)
    interpreted = triton_interpreted()
    if (device.type == "cuda") == interpreted:
        raise ConfigError(f"attn=triton-decode cannot run on {device} here: " + (
            "TRITON_INTERPRET=1 is set, and Triton's interpreter runs on a CPU only" if interpreted else
            "Triton runs on a CUDA GPU, and on a CPU only in its interpreter, on a machine without a GPU"))
    if interpreted and not interpreter_ready():
        raise ConfigError("attn=triton-decode on a CPU needs Triton's interpreter from the start of the process: "
                          "triton was imported before TRITON_INTERPRET=1 was set (run through `harness`, or set it)")
    if triton_decode_op is not None:
        return
    try:
        from harness.kernels.triton_decode import triton_decode  # noqa: PLC0415
    except ImportError as err:
        raise ConfigError(f"attn=triton-decode needs Triton ({err}): pip install triton, or use attn=flex") from err
    triton_decode_op = _decode_op("triton_decode", triton_decode)


triton_decode_forward = _prefill_or(lambda *args: triton_decode_op(*args))  # the op, once use_triton_decode() set it


def prefill_only_mask(*args, q_length: int, **kwargs):
    """flex and triton-decode cut the cache at the position themselves: a decode step needs no mask, prefill
    SDPA's."""
    return None if q_length == 1 else sdpa_mask(*args, q_length=q_length, **kwargs)

