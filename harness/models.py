"""Build a model from its architecture with seeded random weights, or load a local checkpoint.

Models are cached per process, so the jobs of a sweep that share a model build it once. The sweeper groups jobs
by the model's weights, then by the context they fill, then by attention backend (harness/config/labels.py,
in_run_order): a model of other weights frees every one built before, and the variants of one set of weights that
differ in their attention backend stay built together while they take at most MODELS_KEPT_FRACTION of the GPU's
memory (three 0.6B models, 3.6 GB on a 141 GB H200), else the new one frees the others.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config.schema import ModelConfig
from harness.errors import ConfigError
from harness.kernels import attention_spec
from harness.modes import kept_context

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    weights: str  # "random" | "checkpoint" | "hub"
    source: str  # "seed=0", or the checkpoint directory / hub id
    build_ms: float
    reused: bool = False


_cache: dict[tuple, LoadedModel] = {}
MODELS_KEPT_FRACTION = 1 / 16  # of the GPU's memory: the most the attention variants of one model keep built


def get_model(cfg: ModelConfig, dtype: str, attn: str, device: torch.device, seed: int) -> LoadedModel:
    key = (repr(cfg), dtype, attn, str(device), seed if cfg.weights is None else None)
    if key in _cache:
        hit = _cache[key]
        return LoadedModel(hit.model, hit.weights, hit.source, 0.0, reused=True)
    _make_room(key)
    start = time.perf_counter()
    model, weights, source = _load(cfg, DTYPES[dtype], attn, device, seed)
    if cfg.fuse_projections:
        fuse_projections(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    loaded = LoadedModel(model.eval(), weights, source, (time.perf_counter() - start) * 1e3)
    model.harness_weights_key = _weights_of(key)  # what its weights are (not its attention): references.shape_of
    _cache[key] = loaded
    return loaded


def _weights_of(key: tuple) -> tuple:
    """A get_model key less its attention backend: what decides the model's weights."""
    return key[:2] + key[3:]


def _make_room(key: tuple) -> None:
    """Free the models built before, unless they are the same weights under other attention backends on a GPU and,
    with one more of their size, take at most MODELS_KEPT_FRACTION of its memory. A context kept by an earlier job
    (harness/modes/kept_context.py) is freed with models of other weights only: the new model's jobs can decode
    from it."""
    if any(_weights_of(other) != _weights_of(key) for other in _cache):
        release_models()
    elif _cache and torch.device(key[3]).type == "cuda":
        built = [sum(p.numel() * p.element_size() for p in hit.model.parameters()) for hit in _cache.values()]
        total = torch.cuda.get_device_properties(torch.device(key[3])).total_memory
        if sum(built) + max(built) > MODELS_KEPT_FRACTION * total:
            _free_built()
    elif _cache:
        _free_built()


def release_models() -> None:
    """Free every model built, and the context an earlier job kept (it was filled by one of them)."""
    kept_context.drop()
    _free_built()


def _free_built() -> None:
    _cache.clear()
    gc.unfreeze()  # what jobs froze after their collections (measure.job.collect_this_jobs_garbage) is collectable again
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load(cfg: ModelConfig, dtype: torch.dtype, attn: str, device: torch.device, seed: int):
    attention_spec(attn).ready(device)  # registers the backend with transformers (and compiles what it needs)
    if cfg.weights is None:
        return random_model(cfg, dtype, attn, device, seed), "random", f"seed={seed} std={init_std(cfg):.4g}"
    path = Path(cfg.weights).expanduser()
    kind = "checkpoint" if path.is_dir() else "hub"
    if kind == "checkpoint" and not any(path.glob("*.safetensors")):
        raise ConfigError(f"model.weights={cfg.weights!r} holds no *.safetensors file; "
                          "give a directory saved with save_pretrained(safe_serialization=True)")
    if kind == "hub" and (path.is_absolute() or cfg.weights.startswith(".")):
        raise ConfigError(f"model.weights={cfg.weights!r} is not a directory (nor a hub id)")
    source = str(path.resolve()) if kind == "checkpoint" else cfg.weights
    check_architecture(cfg, AutoConfig.from_pretrained(source, trust_remote_code=False))
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, attn_implementation=attn, use_safetensors=True, trust_remote_code=False,
    )
    return model.to(device), kind, source


def init_std(cfg: ModelConfig) -> float:
    """The standard deviation random weights are drawn with: 2 / sqrt(hidden_size), unless the preset's `extra`
    sets `initializer_range`. At transformers' default (0.02) a random model's residual stream stays its input
    token's embedding, and with tied embeddings greedy decode repeats that token at nearly every step (87% of
    steps for qwen3-0.6b, all of them for tiny), so a check of the loop's tokens could not tell a stale token
    from a right one; at 2 / sqrt(hidden) 4% (tiny) and none (qwen3-0.6b) of 24 steps repeat the last (2 rows, on a CPU). The
    value changes no shape, read or kernel of a step, only what the weights hold."""
    return float(cfg.extra.get("initializer_range", 2 / cfg.hidden_size ** 0.5))


def random_model(cfg: ModelConfig, dtype: torch.dtype, attn: str, device: torch.device, seed: int) -> nn.Module:
    """The architecture on the meta device (no memory, no initialisation), its storage allocated on the
    device (no host copy), then initialised once, seeded, by transformers' own initialisation (which also
    computes the rotary tables), at init_std: seconds for a 30B mixture of experts."""
    config = AutoConfig.for_model(cfg.model_type, **{**cfg.architecture(), "initializer_range": init_std(cfg)})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights()
    return model


def check_architecture(cfg: ModelConfig, found) -> None:
    """A checkpoint must hold the preset's architecture, or its runs would carry the preset's name and
    numbers for another model."""
    def value(key):  # transformers 5 keeps rope_theta among rope_parameters
        return getattr(found, key, None) if hasattr(found, key) else (getattr(found, "rope_parameters", None) or {}).get(key)

    def same(key, want):  # a dict (rope_scaling) matches where every key given matches
        got = value(key)
        return all((got or {}).get(k) == v for k, v in want.items()) if isinstance(want, dict) else got == want

    expected = {"model_type": cfg.model_type, **cfg.architecture()}
    differ = [f"{k}={value(k)} (model={cfg.name} has {v})" for k, v in expected.items() if not same(k, v)]
    if differ:
        raise ConfigError(f"model.weights={cfg.weights} is not a {cfg.name}: " + ", ".join(differ)
                          + "; pick the model preset of that checkpoint, or a new conf/model/ file for it")


class SharedInputLinear(nn.Module):
    """Linear layers that read the same input, computed as one GEMM over concatenated weights.

    Each original layer is replaced by a `SliceOf` this module. The first slice the model calls
    (q_proj, gate_proj) runs the fused GEMM; the others return their column block of its output.
    """

    def __init__(self, linears: list[nn.Linear]):
        super().__init__()
        first = linears[0]
        self.sizes = [lin.out_features for lin in linears]
        self.fused = nn.Linear(first.in_features, sum(self.sizes), bias=first.bias is not None,
                               device=first.weight.device, dtype=first.weight.dtype)
        with torch.no_grad():
            self.fused.weight.copy_(torch.cat([lin.weight for lin in linears]))
            if first.bias is not None:
                self.fused.bias.copy_(torch.cat([lin.bias for lin in linears]))
        self.outputs: tuple[torch.Tensor, ...] | None = None


class SliceOf(nn.Module):
    def __init__(self, shared: SharedInputLinear, index: int):
        super().__init__()
        self.shared, self.index = [shared], index  # a list: keep the shared module out of state_dict twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared[0]
        if self.index == 0:
            shared.outputs = shared.fused(x).split(shared.sizes, dim=-1)
        elif shared.outputs is None:
            raise RuntimeError("fused projection called out of order: the first projection must run first")
        out = shared.outputs[self.index]
        if self.index == len(shared.sizes) - 1:
            shared.outputs = None  # don't hold activations between layers
        return out


# (module attribute holding the group, projections in the order the model's forward calls them)
FUSABLE = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def fuse_projections(model: nn.Module) -> int:
    """Fuse q/k/v and gate/up in every decoder layer; returns how many groups were fused."""
    fused = 0
    for layer in model.model.layers:
        for owner_name, names in FUSABLE:
            owner = getattr(layer, owner_name)
            if not all(isinstance(getattr(owner, n, None), nn.Linear) for n in names):
                continue  # a mixture of experts has no gate/up pair to fuse
            shared = SharedInputLinear([getattr(owner, n) for n in names])
            owner.add_module(f"fused_{'_'.join(n.split('_')[0] for n in names)}", shared)
            for i, name in enumerate(names):
                setattr(owner, name, SliceOf(shared, i))
            fused += 1
    return fused
