"""mode=fused's decode step: a dense decoder layer in five kernels, then one for the final norm and lm_head, read
top to bottom in `FusedDecoder.step`.

Per layer, in launch order:
1. QKV (products.py): the residual stream (fp32; at layer 0 the embedding rows of the input ids, which it writes as
   the stream's first value), times the input norm's gain, times q|k|v's packed weights. Out: fp32 partial sums
   (one per K split) and partial sums of the input's squares, whose 1/rms the attention applies.
2. The attention (attention.py): RoPE and Qwen3's q/k norms, the new K/V appended to the cache, attention over the
   valid prefix in chunks, the chunks merged: one launch (folded), or three where its rule says.
3. O: the attention's output times o_proj, added to the residual stream in place.
4. gate/up: the residual times the MLP norm's gain times gate|up packed in pairs of column blocks, so that each
   program finishes SiLU(gate)·up (and 1/rms) for its columns.
5. down: added to the residual stream in place.
After the last layer one product computes the final norm and the logits (fp32) and advances the cache position.
Every kernel is launched with programmatic dependent launch (pdl.py), so that each is scheduled while the one before
drains, and loads its first weights before it waits for that one's results.

How each product and the attention run is planned at construction (plan.py, attention.py's rules) from the run's
fused.* switches (`options`, the run schema's FusedConfig as it applies on this device) and the knobs (`Knobs`).
On a machine without an NVIDIA GPU the kernels run in Triton's interpreter (fp32 products; tests).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
import triton

from harness.kernels.fused.attention import (_attention, _merge_ahead, _rope_append, _split_kv, attention_chunks,
                                             attention_folded, group_pad, kv_within_ahead_window, merge_block,
                                             rotary_tables)
from harness.kernels.fused.knobs import KNOBS, Knobs
from harness.kernels.fused.pdl import pdl_launch
from harness.kernels.fused.plan import (AT_WAIT, SPLITTABLE_KINDS, PlanChoice, Product, plan, plan_swiglu)
from harness.kernels.fused.products import ADD, EMBEDDING, LOGITS, PARTIALS, PLAIN, SWIGLU, launch_product
from harness.kernels.triton_decode import BLOCK_N
from harness.kernels.triton_runtime import interpreted

# a test's fault (harness/measure/mutations.py): every RMSNorm's epsilon in the step's kernels 1000x too large
NORM_EPS_FAULT = "fused_norm_eps_1000x"

# Each kind of product's weight [n, k], from a decoder layer (lm_head's from the model); gate/up pairs two
# (plan_swiglu)
PRODUCT_WEIGHTS = {
    "qkv": lambda layer: torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                                    layer.self_attn.v_proj.weight]),
    "o": lambda layer: layer.self_attn.o_proj.weight,
    "down": lambda layer: layer.mlp.down_proj.weight,
    "lm_head": lambda model: model.lm_head.weight,
}


@dataclass
class Layer:
    """One decoder layer's weights as the kernels read them."""

    attn_norm: torch.Tensor
    qkv: Product
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Product
    mlp_norm: torch.Tensor
    gate_up: Product
    down: Product


class FusedDecoder:
    """The weights packed, the buffers allocated and one decode step launched: `step()` reads the input ids
    [rows, 1] and the cache position, appends to the cache, writes the logits [rows, vocab] (fp32) and advances
    every layer's position. `options`: the run's fused.* switches as they apply here; `knobs`: the plan's numbers.
    `longest_prefix`: the most slots a step will attend to (sizes the attention's chunks and merge; any length
    still computes right); the cache's capacity where not given. `fault`: a test's fault inside the kernels
    ("fused_rope_off_by_one", "kv_append_lost", NORM_EPS_FAULT)."""

    def __init__(self, model, cache, input_ids: torch.Tensor, options, knobs: Knobs = KNOBS, fault: str | None = None,
                 longest_prefix: int | None = None, choices: dict[str, PlanChoice] | None = None):
        config, rows = model.config, input_ids.shape[0]
        self.model, self.options, self.knobs = model, options, knobs
        self.cache, self.input_ids, self.rows = cache, input_ids, rows
        self.choices = dict(choices or {})  # each kind of product's plan where not the rules' (PlanChoice)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.group_pad = group_pad(self.heads, self.kv_heads)
        self.head_dim = cache.layers[0].keys.shape[-1]
        # under NORM_EPS_FAULT every RMSNorm of the step (the input, q/k, MLP and final norms) adds 1000x its epsilon
        self.hidden, self.eps = config.hidden_size, config.rms_norm_eps * (1000 if fault == NORM_EPS_FAULT else 1)
        self.scale = model.model.layers[0].self_attn.scaling
        self.rope_shift, self.append = int(fault == "fused_rope_off_by_one"), fault != "kv_append_lost"
        with torch.no_grad():
            self.layers = [self._layer(layer) for layer in model.model.layers]
            self.embedding = model.model.embed_tokens.weight
            self.final_norm = model.model.norm.weight
            self.lm_head = self._plan("lm_head", model)
            self.cos, self.sin = rotary_tables(model, cache.layers[0].max_cache_len, cache.layers[0].keys.device)
        capacity = cache.layers[0].max_cache_len
        self.longest_prefix = min(longest_prefix or capacity, capacity)
        mlp_bytes = sum(w.numel() * w.element_size() for w in (self.layers[0].gate_up.weight,
                                                               self.layers[0].down.weight))
        self.folded = attention_folded(options, knobs, rows, self.longest_prefix, self._kv_bytes(), mlp_bytes,
                                       self.head_dim)
        self._buffers(cache.layers[0].keys)
        self.merge_block = merge_block(knobs, self.longest_prefix, self.attn_acc.shape[2])

    def _layer(self, layer) -> Layer:
        attn = layer.self_attn
        norms = [getattr(getattr(attn, name, None), "weight", None) for name in ("q_norm", "k_norm")]
        return self._o_launch(Layer(layer.input_layernorm.weight, self._plan("qkv", layer), *norms,
                                    self._plan("o", layer), layer.post_attention_layernorm.weight,
                                    self._plan("gate_up", layer), self._plan("down", layer)))

    @staticmethod
    def _o_launch(layer: Layer) -> Layer:
        """`layer` with its O product letting the gate/up after it launch at O's PDL wait where that gate/up copies
        its first tiles before its own PDL wait, so that the copies overlap O; else at O's rule (launch_point)."""
        launch = AT_WAIT if layer.gate_up.copies_first else -1
        if layer.o.launch == launch:  # the same product (a replanned decoder shares what it did not replan)
            return layer
        return replace(layer, o=replace(layer.o, launch=launch))

    def _plan(self, kind: str, source) -> Product:
        """`kind`'s product of one decoder layer (`source`; lm_head's: the model) as self.choices says, else by the
        rules."""
        choice, sizes = self.choices.get(kind), (self.rows, self.hidden)
        if kind == "gate_up":
            return plan_swiglu(source.mlp.gate_proj.weight, source.mlp.up_proj.weight, self.options, self.knobs,
                               *sizes, choice=choice)
        return plan(PRODUCT_WEIGHTS[kind](source), self.options, self.knobs, kind in SPLITTABLE_KINDS, *sizes,
                    choice=choice, kind=kind)

    def products(self) -> dict[str, Product]:
        """Each kind's product as it runs (every layer's alike): the first layer's, and lm_head."""
        first = self.layers[0]
        return dict(qkv=first.qkv, o=first.o, gate_up=first.gate_up, down=first.down, lm_head=self.lm_head)

    def replanned(self, kind: str, choice: PlanChoice) -> FusedDecoder:
        """A decoder whose `kind` products are planned as `choice` says, sharing this one's other weights, with
        buffers of its own (a step captured from each can be timed against the other's)."""
        other = copy.copy(self)
        other.choices = {**self.choices, kind: choice}
        with torch.no_grad():
            if kind == "lm_head":
                other.lm_head = other._plan(kind, self.model)
            else:
                other.layers = [other._o_launch(replace(layer, **{kind: other._plan(kind, source)}))
                                for layer, source in zip(self.layers, self.model.model.layers)]
        other._buffers(self.cache.layers[0].keys)
        return other

    def _buffers(self, like: torch.Tensor) -> None:
        rows, first = self.rows, self.layers[0]
        f32 = dict(device=like.device, dtype=torch.float32)
        self.residual = torch.zeros(rows, self.hidden, **f32)  # the residual stream, in fp32, added to in place
        self.qkv_parts = torch.zeros(first.qkv.splits, rows, first.qkv.n, **f32)
        self.squares = torch.zeros(first.qkv.splits, rows, **f32)
        self.q = torch.zeros(rows, self.heads, self.head_dim, device=like.device, dtype=like.dtype)
        self.attn_out = torch.zeros(rows, self.heads * self.head_dim, device=like.device, dtype=like.dtype)
        self.act = torch.zeros(rows, first.down.k, device=like.device, dtype=like.dtype)
        self.logits = torch.zeros(rows, self.lm_head.n, **f32)
        splits = self._attention_splits()
        self.attn_acc = torch.empty(rows, self.heads, splits, self.head_dim, **f32)
        self.attn_max, self.attn_sum = (torch.empty(rows, self.heads, splits, **f32) for _ in range(2))
        # chunks of each (row, KV head) done in the folded attention: the last merges them and sets it back to 0
        self.chunks_done = torch.zeros(rows, self.kv_heads, device=like.device, dtype=torch.int32)

    def _attention_splits(self) -> int:
        """The attention's chunks a (row, KV head) for the longest prefix the run decodes to, aimed at the folded
        kernel's programs or the three launches'."""
        knobs = self.knobs
        programs = knobs.attention_programs if self.folded else knobs.unfolded_attention_programs
        return attention_chunks(knobs, self.rows, self.kv_heads, self.longest_prefix, programs, self.head_dim)

    def _kv_bytes(self) -> int:
        """Bytes of K and V a layer's attention reads at the longest prefix."""
        keys = self.cache.layers[0].keys
        return 2 * self.rows * self.kv_heads * self.longest_prefix * self.head_dim * keys.element_size()

    def kernels_per_step(self) -> int:
        return (5 if self.folded else 7) * len(self.layers) + 1

    def step(self, after_layer=None) -> torch.Tensor:
        """One decode step; `after_layer(index, residual)`, where given, is called after each layer's last launch
        with the residual stream [rows, hidden] (fp32) as that layer left it: a check's probe (harness/measure/
        layer_gate.py), never given on a timed or captured step."""
        position = self.cache.layers[0].cumulative_length
        for index, (layer, kv) in enumerate(zip(self.layers, self.cache.layers)):
            # at layer 0 the embedding rows of the input ids are the residual stream's first value
            x, source = (self.embedding, EMBEDDING) if index == 0 else (self.residual, PLAIN)
            bump = kv.cumulative_length if index else None  # layer 0's, which every kernel reads, goes last (lm_head)
            self._product(layer.qkv, self.qkv_parts, x, input=source, gain=layer.attn_norm)
            if self.folded:
                self._attention(layer, kv, position)
            else:
                self._rope_append(layer, kv, position)
                self._attend(layer, kv, position)
            self._product(layer.o, self.residual, self.attn_out, output=ADD, bump=bump)
            self._product(layer.gate_up, self.act, self.residual, gain=layer.mlp_norm, output=SWIGLU)
            self._product(layer.down, self.residual, self.act, output=ADD)
            if after_layer is not None:
                after_layer(index, self.residual)
        self._product(self.lm_head, self.logits, self.residual, gain=self.final_norm, output=LOGITS, bump=position)
        return self.logits

    def _product(self, product: Product, out: torch.Tensor, x: torch.Tensor, input=PLAIN, gain=None,
                 output=PARTIALS, bump=None) -> None:
        """One `_matvec` launch: x (or the embedding rows of the input ids, x the table) times product's weight."""
        launch_product(product, x, out, self.rows, residual=self.residual, ids=self.input_ids, gain=gain,
                       squares=self.squares, bump=bump, eps=self.eps, input=input, output=output, pdl=self.options.pdl)

    def _launch(self) -> dict:
        return pdl_launch(self.options.pdl)

    @staticmethod
    def _head_norms(layer: Layer, absent: torch.Tensor) -> list[torch.Tensor]:
        """Qwen3's q and k RMSNorm gains as a kernel takes them; `absent` stands in for each a model lacks (Llama:
        QK_NORM off, the pointer never read)."""
        return [absent if w is None else w for w in (layer.q_norm, layer.k_norm)]

    def _rope_append(self, layer: Layer, kv, position: torch.Tensor) -> None:
        keys, values = kv.keys, kv.values
        norms = self._head_norms(layer, self.q)
        _rope_append[(self.rows, self.heads + self.kv_heads)](
            self.qkv_parts, self.squares, position, self.cos, self.sin, *norms, self.q, keys, values, self.rows,
            layer.qkv.n, self.hidden, self.eps, keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
            values.stride(1), values.stride(2), HEADS=self.heads, KV_HEADS=self.kv_heads, D=self.head_dim,
            SPLITS=layer.qkv.splits, QK_NORM=layer.q_norm is not None, ROPE_SHIFT=self.rope_shift,
            APPEND=self.append, **self._launch())

    def _attention(self, layer: Layer, kv, position: torch.Tensor) -> None:
        """RoPE, the append, attention over the valid prefix [0, position] and the merge: one launch."""
        keys, values, splits = kv.keys, kv.values, self.attn_acc.shape[2]
        norms = self._head_norms(layer, self.cos)
        ahead = self.weights_ahead(layer)
        _attention[(self.rows, self.kv_heads, splits)](
            self.qkv_parts, self.squares, position, self.cos, self.sin, *norms, keys, values, self.attn_acc,
            self.attn_max, self.attn_sum, self.chunks_done, self.attn_out, self.rows, layer.qkv.n, self.hidden,
            self.eps, self.scale, *keys.stride()[:3], *values.stride()[:3], self.attn_out.stride(0),
            *(ahead or (keys, 0, keys, 0, 0)), AHEAD=ahead is not None, HEADS=self.heads, KV_HEADS=self.kv_heads,
            GROUP_PAD=self.group_pad, D=self.head_dim, QKV_SPLITS=layer.qkv.splits, SPLITS=splits, BLOCK_N=BLOCK_N,
            QK_NORM=layer.q_norm is not None, ROPE_SHIFT=self.rope_shift, APPEND=self.append,
            IEEE=keys.dtype == torch.float32 or interpreted(), MERGE_BLOCK=self.merge_block,
            num_warps=self.knobs.folded_attention_warps, num_stages=self.knobs.folded_attention_stages,
            **self._launch())

    def weights_ahead(self, layer: Layer) -> tuple | None:
        """What the layer's attention asks L2 for (fused.weights_ahead), as its launch takes it: gate/up's weights and
        the bytes of them, down's and theirs, and the bytes a program asks for (the folded kernel's programs, or the
        three launches' merge's); None where it does not apply: off, a CPU (the bulk prefetch is inline PTX), or K/V
        at the longest prefix outside the window (kv_within_ahead_window)."""
        first, second, budget = layer.gate_up.weight, layer.down.weight, self.knobs.weights_ahead_bytes
        if (not self.options.weights_ahead or interpreted() or not kv_within_ahead_window(self.knobs, self._kv_bytes())
                or first.data_ptr() % 16 or second.data_ptr() % 16):
            return None
        bytes1 = min(first.numel() * first.element_size(), budget) // 16 * 16  # the bulk prefetch's unit
        bytes2 = min(second.numel() * second.element_size(), budget - bytes1) // 16 * 16
        programs = self.rows * (self.kv_heads * self.attn_acc.shape[2] if self.folded else self.heads)
        return first, bytes1, second, bytes2, triton.cdiv(triton.cdiv(bytes1 + bytes2, programs), 16) * 16

    def attention_plan(self) -> str:
        """The layer's attention as the run's `fused_plan` tag says: folded or three launches (and why), and what it
        asks of L2."""
        ahead = self.weights_ahead(self.layers[0])
        asked = f"{(ahead[1] + ahead[3]) / 2**20:.1f} MiB of the MLP's weights asked of L2" if ahead else ""
        if not self.folded:
            why = "fused.fold_attention=false" if not self.options.fold_attention else (
                f"bs=1 past one chunk a KV head, under {self.knobs.fold_min_kv_bytes / 2**20:.1f} MiB of K/V or "
                f"{self.knobs.fold_min_ahead_share:.0%} of the MLP's weights asked ahead")
            return f"attention: three launches ({why}{f'; {asked} by its merge' if ahead else ''})"
        return f"attention: {asked}" if ahead else "attention: no weights asked of L2"

    def _attend(self, layer: Layer, kv, position: torch.Tensor) -> None:
        """attn=triton-decode's split-KV kernel and merge over the valid prefix [0, position], the merge asking L2
        for the MLP's weights first (weights_ahead)."""
        keys, values, q, group = kv.keys, kv.values, self.q, self.heads // self.kv_heads
        splits, ahead = self.attn_acc.shape[2], self.weights_ahead(layer)
        _split_kv[(self.rows, self.kv_heads, splits)](
            q, keys, values, position, self.attn_acc, self.attn_max, self.attn_sum, self.scale, q.stride(0),
            q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1),
            values.stride(2), GROUP=group, GROUP_PAD=self.group_pad, D=self.head_dim, BLOCK_N=BLOCK_N, SPLITS=splits,
            IEEE=q.dtype == torch.float32 or interpreted(), num_warps=self.knobs.split_kv_warps,
            num_stages=self.knobs.split_kv_stages, **self._launch())
        _merge_ahead[(self.rows, self.heads)](
            self.attn_acc, self.attn_max, self.attn_sum, self.attn_out, self.attn_out.stride(0), self.head_dim,
            *(ahead or (keys, 0, keys, 0, 0)), HEADS=self.heads, D=self.head_dim, SPLITS=splits,
            AHEAD=ahead is not None, **self._launch())
