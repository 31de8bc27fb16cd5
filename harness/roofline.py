"""Speed of light per decode step: the bytes it must move and the FLOPs it must do, against the
device's measured ceilings. floor_ms = max(bytes / bandwidth, flops / rate).

What is counted, per step of a batch of `bs` rows (B = bytes per element):
- weights: every parameter read once, except the input embedding, of which only bs rows are read;
  with tied embeddings the one matrix is read in full by lm_head.
- KV cache: a StaticCache hands SDPA all `cache_len` positions of every layer (masked, not sliced),
  so attention reads K and V in full: 2 x layers x bs x kv_heads x cache_len x head_dim x B. Where
  transformers expands K/V to the query heads with repeat_kv (eager attention, older releases, or
  SDPA under torch.compile), that copy is written and read again: (1 + 2 x n_rep) times the K/V
  bytes. attn=sdpa-gqa never expands them.
- activations: the hidden states, projections and MLP intermediates each written and read once per
  layer, and the logits written and read once (by the argmax).
- FLOPs: 2 per weight per row for every matmul (lm_head included, the embedding gather excluded),
  plus 4 x bs x heads x head_dim x cache_len per layer for QK^T and PV.
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import torch
import transformers.integrations.sdpa_attention as hf_sdpa

from harness.timing import median_call_ms

CEILINGS_FILE = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness")) / "ceilings.json"


def kv_read_factor(n_rep: int, compiled: bool, attn: str = "sdpa") -> int:
    """How many times the K/V bytes cross memory for one decode step's attention."""
    # a query of one token reshaped onto the KV heads: ours always, transformers' own in eager only
    packs_gqa = attn == "sdpa-gqa" or (attn == "sdpa" and hasattr(hf_sdpa, "pack_gqa") and not compiled)
    return 1 if n_rep == 1 or packs_gqa else 1 + 2 * n_rep


def step_cost(arch: dict, bs: int, cache_len: int, dtype_bytes: int, compiled: bool = False,
              attn: str = "sdpa") -> dict[str, float]:
    """Bytes and FLOPs of one decode step, from the architecture alone (see the module docstring)."""
    h, inter, layers = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"]
    heads, kv_heads, hd, vocab = arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"], arch["vocab_size"]
    q_dim, kv_dim = heads * hd, kv_heads * hd
    matmul_weights = layers * (h * (q_dim + 2 * kv_dim) + q_dim * h + 3 * h * inter) + vocab * h  # + lm_head
    norm_weights = layers * (2 * h + 2 * hd) + h  # input/post-attention norms, q/k norms, final norm
    # the bs embedding rows looked up: tied or not, the table is read in full only by lm_head
    weights_read = matmul_weights + norm_weights + bs * h
    kv = 2 * layers * bs * kv_dim * cache_len
    kv_read = kv * kv_read_factor(heads // kv_heads, compiled, attn)
    activations = layers * bs * (10 * h + 3 * inter + 2 * (q_dim + 2 * kv_dim)) + 2 * bs * vocab
    flops = 2 * bs * matmul_weights + layers * 4 * bs * heads * hd * cache_len
    weight_bytes, kv_bytes, act_bytes = (x * dtype_bytes for x in (weights_read, kv_read, activations))
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "activation_bytes": act_bytes,
            "step_bytes": weight_bytes + kv_bytes + act_bytes, "step_flops": float(flops)}


def floor(cost: dict[str, float], ceilings: dict[str, float]) -> dict[str, float]:
    memory_ms = cost["step_bytes"] / ceilings["copy_bytes_per_s"] * 1e3
    compute_ms = cost["step_flops"] / ceilings["bf16_flops_per_s"] * 1e3
    return {"floor_ms": max(memory_ms, compute_ms), "floor_memory_ms": memory_ms, "floor_compute_ms": compute_ms}


@functools.lru_cache(maxsize=4)
def ceilings(device: torch.device) -> dict[str, float]:
    """The device's copy bandwidth and bf16 matmul rate: measured once per GPU model and driver,
    then read from disk."""
    from harness.environment import device_index, gpu_facts

    facts = gpu_facts(device_index(device))
    key = f"{facts['gpu_name']} | driver {facts.get('gpu_driver', '?')}"
    cached = json.loads(CEILINGS_FILE.read_text()) if CEILINGS_FILE.is_file() else {}
    if key not in cached:
        cached[key] = measure_ceilings(device)
        CEILINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
        CEILINGS_FILE.write_text(json.dumps(cached, indent=2))
    return {**cached[key], "key": key}


def measure_ceilings(device: torch.device, copy_bytes: int = 2 << 30, n: int = 8192) -> dict[str, float]:
    """A 2 GiB device-to-device copy (bytes read + written) and an n³ bf16 matmul on random data."""
    ceilings = {"copy_bytes_per_s": 2 * copy_bytes / _copy_s(device, copy_bytes),
                "bf16_flops_per_s": 2 * n**3 / _matmul_s(device, n), "measured": time.strftime("%Y-%m-%d")}
    torch.cuda.empty_cache()
    return ceilings


def _copy_s(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return _median_s(lambda: dst.copy_(src))


def _matmul_s(device: torch.device, n: int) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    return _median_s(lambda: torch.mm(a, b))


def _median_s(fn, warmup: int = 3, reps: int = 10) -> float:
    for _ in range(warmup):
        fn()
    return median_call_ms(fn, reps) / 1e3
