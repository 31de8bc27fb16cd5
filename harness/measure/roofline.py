"""Speed of light per decode step: the bytes it must move and the FLOPs it must do, against the device's
measured ceilings. floor_ms = max(useful bytes / bandwidth, useful FLOPs / rate); efficiency = floor_ms /
the measured median, for every mode and attention backend alike.

Useful work, per step of `bs` rows (B = bytes per element), at the mean position of the timed steps (each block
times from `warmup` steps after the context, whatever graph_steps: RunConfig.first_timed_position):
- weights: every parameter read once, except the input embedding, of which only bs rows are read; with
  tied embeddings the one matrix is read in full by lm_head.
- KV cache: the valid positions only (the context, the warm-up and the steps decoded so far, the new
  token included), K and V read once, plus the new token's K and V written once:
  2 x layers x bs x kv_heads x head_dim x (valid + 1) x B. Empty slots of the cache are not work.
- activations: the hidden states, projections and MLP intermediates each written and read once per layer,
  and the logits written and read once (by the argmax).
- FLOPs: 2 per weight per row for every matmul (lm_head included, the embedding gather excluded), plus
  4 x bs x heads x head_dim x valid per layer for QK^T and PV.

What the chosen implementation reads is logged beside it (`implementation_bytes`, `waste_factor` =
implementation / useful), as its entry in the attention-backend registry (harness/kernels/__init__.py) says:
every slot of the cache with K/V expanded to the query heads by repeat_kv (`sdpa`, `eager`: read once,
written and read n_rep times: 1 + 2 x n_rep); every slot once (`sdpa-gqa`); or the valid prefix in whole
blocks (`flex`: 128 slots; `triton-decode`: to the slot). A bucketed run also computes its padding rows.
"""
from __future__ import annotations

import functools
import json
import math
import time

import torch

from harness.cache import cache_root
from harness.clock import median_call_ms
from harness.kernels import EVERY_SLOT, EVERY_SLOT_REPEATED, VALID_PREFIX, attention_spec


def _shape(arch: dict) -> tuple[int, ...]:
    return (arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"], arch["num_attention_heads"],
            arch["num_key_value_heads"], arch["head_dim"], arch["vocab_size"])


def experts_touched(arch: dict, rows: int) -> float:
    """Experts a step of `rows` rows reads, expected under uniform routing: E x (1 - (1 - k/E)^rows)."""
    experts, k = arch["num_experts"], arch["num_experts_per_tok"]
    return experts * (1 - (1 - k / experts) ** rows)


def _dense(arch: dict, rows: int) -> tuple[float, int, int]:
    """Elements of weights read, of activations moved, and matmul weights each row multiplies by, for a step
    of `rows` rows. A mixture of experts reads its router and the experts its rows touch; a row multiplies
    by its k experts."""
    h, inter, layers, heads, kv_heads, hd, vocab = _shape(arch)
    q_dim, kv_dim = heads * hd, kv_heads * hd
    attention = layers * (h * (q_dim + 2 * kv_dim) + q_dim * h) + vocab * h  # + lm_head
    if arch.get("num_experts"):
        inter, expert = arch["num_experts_per_tok"] * arch["moe_intermediate_size"], 3 * h * arch["moe_intermediate_size"]
        mlp_read, mlp_per_row = layers * (h * arch["num_experts"] + experts_touched(arch, rows) * expert), \
            layers * (h * arch["num_experts"] + arch["num_experts_per_tok"] * expert)
    else:
        mlp_read = mlp_per_row = layers * 3 * h * inter
    norm_weights = layers * (2 * h + 2 * hd) + h  # input/post-attention norms, q/k norms, final norm
    weights = attention + mlp_read + norm_weights + rows * h  # the rows' embedding lookups
    activations = layers * rows * (10 * h + 3 * inter + 2 * (q_dim + 2 * kv_dim)) + 2 * rows * vocab
    return weights, activations, attention + mlp_per_row


def _kv_per_slot(arch: dict) -> int:
    """Elements of K and V of one slot of one row, over all layers."""
    return 2 * arch["num_hidden_layers"] * arch["num_key_value_heads"] * arch["head_dim"]


def step_cost(arch: dict, bs: int, valid_slots: float, dtype_bytes: int) -> dict[str, float]:
    """Useful bytes and FLOPs of one decode step of bs rows attending to `valid_slots` positions."""
    weights, activations, matmul_weights = _dense(arch, bs)
    kv = _kv_per_slot(arch) * bs * (valid_slots + 1)
    flops = 2 * bs * matmul_weights + arch["num_hidden_layers"] * 4 * bs * arch["num_attention_heads"] \
        * arch["head_dim"] * valid_slots
    weight_bytes, kv_bytes, act_bytes = (x * dtype_bytes for x in (weights, kv, activations))
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "activation_bytes": act_bytes,
            "step_bytes": weight_bytes + kv_bytes + act_bytes, "step_flops": float(flops), "kv_slots_valid": valid_slots}


def kv_read_factor(n_rep: int, attn: str) -> int:
    """How many times an implementation's K/V bytes cross memory: repeat_kv reads them, writes n_rep copies
    and attention reads those; a backend on the KV heads reads them as they are."""
    return 1 + 2 * n_rep if n_rep > 1 and attention_spec(attn).kv_read == EVERY_SLOT_REPEATED else 1


def slots_read(attn: str, cache_len: int, positions: range) -> float:
    """Cache slots an implementation reads per step, averaged over the steps at `positions`."""
    spec = attention_spec(attn)
    if spec.kv_read in (EVERY_SLOT, EVERY_SLOT_REPEATED):
        return float(cache_len)
    if spec.kv_read != VALID_PREFIX:
        raise ValueError(f"attn={attn}: the roofline does not know how it reads the cache ({spec.kv_read!r})")
    return sum(math.ceil((p + 1) / spec.block) * spec.block for p in positions) / len(positions)


def implementation_bytes(arch: dict, rows: int, attn: str, cache_len: int, positions: range, dtype_bytes: int) -> float:
    """Bytes one step of this implementation moves: `rows` rows (a bucket's padding included)."""
    weights, activations, _ = _dense(arch, rows)
    n_rep = arch["num_attention_heads"] // arch["num_key_value_heads"]
    kv = _kv_per_slot(arch) * rows * (slots_read(attn, cache_len, positions) * kv_read_factor(n_rep, attn) + 1)
    return float((weights + kv + activations) * dtype_bytes)


def floor(cost: dict[str, float], ceilings: dict[str, float]) -> dict[str, float]:
    memory_ms = cost["step_bytes"] / ceilings["copy_bytes_per_s"] * 1e3
    compute_ms = cost["step_flops"] / ceilings["bf16_flops_per_s"] * 1e3
    return {"floor_ms": max(memory_ms, compute_ms), "floor_memory_ms": memory_ms, "floor_compute_ms": compute_ms}


@functools.lru_cache(maxsize=4)
def ceilings(device: torch.device) -> dict[str, float]:
    """The device's copy bandwidth and bf16 matmul rate: measured once per GPU model and driver,
    then read from disk."""
    from harness.clock import device_index
    from harness.measure.gpu_state import gpu_facts

    facts = gpu_facts(device_index(device))
    key = f"{facts['gpu_name']} | driver {facts.get('gpu_driver', '?')}"
    saved = cache_root() / "ceilings.json"
    cached = json.loads(saved.read_text()) if saved.is_file() else {}
    if key not in cached:
        cached[key] = measure_ceilings(device)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(cached, indent=2))
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
