"""Build a model from its architecture with seeded random weights, or load a local checkpoint.

Models are cached per process, so the jobs of a sweep that share a model build it once; the
sweeper orders jobs by model, so one slot is enough and a new model frees the last one.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config import ConfigError, ModelConfig

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    weights: str  # "random" | "checkpoint" | "hub"
    source: str  # "seed=0", or the checkpoint directory / hub id
    build_ms: float
    reused: bool = False


_cache: dict[tuple, LoadedModel] = {}


def get_model(cfg: ModelConfig, dtype: str, attn: str, device: torch.device, seed: int) -> LoadedModel:
    key = (repr(cfg), dtype, attn, str(device), seed if cfg.weights is None else None)
    if key in _cache:
        hit = _cache[key]
        return LoadedModel(hit.model, hit.weights, hit.source, 0.0, reused=True)
    release_models()
    start = time.perf_counter()
    model, weights, source = _load(cfg, DTYPES[dtype], attn, device, seed)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    loaded = LoadedModel(model.eval(), weights, source, (time.perf_counter() - start) * 1e3)
    _cache[key] = loaded
    return loaded


def release_models() -> None:
    _cache.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load(cfg: ModelConfig, dtype: torch.dtype, attn: str, device: torch.device, seed: int):
    if cfg.weights is None:
        config = AutoConfig.for_model(cfg.model_type, **cfg.architecture())
        torch.manual_seed(seed)
        with torch.device(device):  # initialise in place: no host copy of 0.6B parameters
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
        return model, "random", f"seed={seed}"
    path = Path(cfg.weights).expanduser()
    kind = "checkpoint" if path.is_dir() else "hub"
    if kind == "checkpoint" and not any(path.glob("*.safetensors")):
        raise ConfigError(f"model.weights={cfg.weights!r} holds no *.safetensors file; "
                          "give a directory saved with save_pretrained(safe_serialization=True)")
    if kind == "hub" and (path.is_absolute() or cfg.weights.startswith(".")):
        raise ConfigError(f"model.weights={cfg.weights!r} is not a directory (nor a hub id)")
    source = str(path.resolve()) if kind == "checkpoint" else cfg.weights
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, attn_implementation=attn, use_safetensors=True, trust_remote_code=False,
    )
    return model.to(device), kind, source
