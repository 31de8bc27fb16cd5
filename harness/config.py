"""The run schema: every key the harness knows is defined here, validated in __post_init__.

Hydra composes `conf/` on top of these dataclasses (registered in the ConfigStore below), so a
wrong type or an unknown enum value is caught by Hydra itself. Checks that relate several keys
(cache_len against prompt + warmup + decode) run when the composed config becomes a RunConfig.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """Bad input, reported as one line naming the value and what would be valid."""


class Mode(Enum):
    eager = "eager"
    graphed = "graphed"


class DType(Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class Attn(Enum):
    sdpa = "sdpa"
    eager = "eager"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class ModelConfig:
    """A decoder-only architecture (transformers `model_type`) plus where its weights come from."""

    name: str = MISSING
    model_type: str = "qwen3"
    vocab_size: int = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    # A local checkpoint directory (config.json + *.safetensors) or a hub id; None = seeded random weights.
    weights: Optional[str] = None

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, key)
            _require(value >= 1, f"model.{key}={value} is invalid: it must be a positive integer")
        _require(self.num_attention_heads % self.num_key_value_heads == 0,
                 f"model.num_attention_heads={self.num_attention_heads} must be a multiple of "
                 f"model.num_key_value_heads={self.num_key_value_heads}")

    def architecture(self) -> dict[str, Any]:
        """The keyword arguments of the transformers config class."""
        return {k: v for k, v in self.__dict__.items() if k not in ("name", "model_type", "weights")}


@dataclass
class TrackingConfig:
    # None: $MLFLOW_TRACKING_URI if set, else the embedded SQLite store under ./mlruns
    uri: Optional[str] = None
    experiment: str = "harness"


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    bs: int = 1
    cache_len: int = 256
    mode: Mode = Mode.eager
    prompt_len: int = 16
    decode_tokens: int = 128
    warmup: int = 10
    dtype: DType = DType.bf16
    attn: Attn = Attn.sdpa
    device: str = "auto"
    seed: int = 0
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        _require(self.bs >= 1, f"bs={self.bs} is invalid: the batch size must be >= 1")
        _require(self.prompt_len >= 1, f"prompt_len={self.prompt_len} is invalid: it must be >= 1")
        _require(self.decode_tokens >= 2,
                 f"decode_tokens={self.decode_tokens} is invalid: it must be >= 2 (statistics need two steps)")
        _require(self.warmup >= 1, f"warmup={self.warmup} is invalid: it must be >= 1 (capture needs a warm model)")
        needed = self.prompt_len + self.warmup + self.decode_tokens
        _require(self.cache_len >= needed,
                 f"cache_len={self.cache_len} is too short: prompt_len ({self.prompt_len}) + warmup "
                 f"({self.warmup}) + decode_tokens ({self.decode_tokens}) = {needed} tokens must fit; "
                 f"use cache_len>={needed}")
        _require(bool(_DEVICE.match(self.device)),
                 f"device={self.device!r} is invalid: use auto, cpu, cuda or cuda:N")

    @property
    def label(self) -> str:
        return run_label(self.model.name, self.bs, self.cache_len, self.mode.value)


def run_label(model: Any, bs: Any, cache_len: Any, mode: Any) -> str:
    """The human-readable run name, e.g. `qwen3-0.6b bs=4 cache=1024 graphed`."""
    return f"{model} bs={bs} cache={cache_len} {mode}"


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Validate a composed (or saved) config against the schema. Unknown keys are rejected."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
        return OmegaConf.to_object(merged)  # runs every __post_init__
    except ConfigError:
        raise
    except Exception as err:  # OmegaConf wraps exceptions raised in __post_init__
        cause = err.__cause__ if isinstance(err.__cause__, ConfigError) else None
        raise ConfigError(str(cause or err).splitlines()[0]) from err


def register() -> None:
    # `model` is typed through RunConfig.model, so the model/*.yaml files need no schema of their own.
    ConfigStore.instance().store(name="schema", node=RunConfig)


register()
