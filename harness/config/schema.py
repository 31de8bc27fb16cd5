"""The run schema: every key the harness knows is defined here, validated in __post_init__.

Hydra composes `conf/` on top of these dataclasses (registered in the ConfigStore below), so a
wrong type or an unknown enum value is caught by Hydra itself. Checks that relate several keys
(cache_len against context + warmup + decode) run when the composed config becomes a RunConfig.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import secrets
import typing
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from harness.kernels import ATTENTION
from harness.modes import MODES
from harness.config.fused import FUSED_SWITCHES, FusedConfig
from harness.config.labels import INDUCTOR, LABEL_KEYS, run_label
from harness.errors import ConfigError
from harness.record import flatten


class DType(Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


# The numeric keys' bounds: the least value, ">=" or ">" it, what the message calls the key, and why
BOUNDS = {"bs": (1, ">=", "the batch size", ""), "context_len": (1, ">=", "it", ""),
          "decode_tokens": (2, ">=", "it", "statistics need two steps"),
          "repeats": (1, ">=", "it", "timed blocks per job"),
          "target_ci_pct": (0, ">", "it", "a percentage"), "time_budget_s": (0, ">", "it", "seconds"),
          "profile_steps": (1, ">=", "it", ""), "cpu_threads": (1, ">=", "it", "torch's intra-op threads"),
          "warmup": (1, ">=", "it", "capture needs a warm model")}
STOP_RULES = ("adaptive", "repeats")  # when a job's timing stops (RunConfig.stop)
CACHE_BLOCK = 256  # a derived cache_len is rounded up to this many slots (a multiple of every backend's block)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class ModelConfig:
    """A decoder-only architecture (transformers `model_type`) plus where its weights come from.
    The architecture has no defaults here: each preset in conf/model/ states all of it."""

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    # Other keys of the model's config.json that its architecture needs (rope_scaling, mixture-of-experts
    # sizes), passed to the transformers config as they are.
    extra: Dict[str, Any] = field(default_factory=dict)
    # A local checkpoint directory (config.json + *.safetensors) or a hub id; None = seeded random weights.
    weights: Optional[str] = None
    # Merge q/k/v into one linear and gate/up into one: fewer, larger GEMMs per layer, same outputs.
    fuse_projections: bool = False

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, key)
            _require(value >= 1, f"model.{key}={value} is invalid: it must be a positive integer")
        _require(self.num_attention_heads % self.num_key_value_heads == 0,
                 f"model.num_attention_heads={self.num_attention_heads} must be a multiple of "
                 f"model.num_key_value_heads={self.num_key_value_heads}")

    def architecture(self) -> dict[str, Any]:
        """The keyword arguments of the transformers config class; `extra`'s dicts copied, since transformers writes
        into them (rope_theta into rope_scaling), and the preset must stay as composed."""
        return {**{k: v for k, v in self.__dict__.items()
                   if k not in ("name", "model_type", "weights", "fuse_projections", "extra")},
                **copy.deepcopy(self.extra)}


FUSED_FAMILIES = ("llama", "qwen3")  # the model types whose dense decoder layer mode=fused computes


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
    # Tokens a (chunked) prefill puts in the KV cache before decode starts: the context decode attends to.
    context_len: int = 16
    # The static cache's capacity in slots; None: context_len + warmup + decode_tokens (+ profile_steps),
    # rounded up to CACHE_BLOCK. A larger value measures what capacity costs, not context.
    cache_len: Optional[int] = None
    mode: str = "eager"  # a name in harness.modes.MODES
    decode_tokens: int = 128
    repeats: int = 3  # timed blocks of decode_tokens (at most, under stop=adaptive), each after a rewind and warm-up
    # When timing stops. "adaptive": once the median's 95% interval is within ±target_ci_pct after MIN_BLOCKS blocks,
    # or before a block that would take the job's timed decode past time_budget_s (host-bound eager stops there), or
    # at `repeats` blocks; where one block of decode_tokens would alone pass time_budget_s at the warm-up's pace (a
    # slow GPU-bound step), a block decodes what the budget holds, at least 32 steps (`block_steps`, tag
    # `block_cut`). "repeats": after exactly `repeats` blocks of decode_tokens. The run logs which rule stopped it
    # (`stopped_by`).
    stop: str = "adaptive"
    target_ci_pct: float = 0.5
    time_budget_s: float = 5.0
    warmup: int = 10
    dtype: DType = DType.bf16
    attn: str = "sdpa"  # a name in the attention-backend registry, harness.kernels.ATTENTION
    device: str = "auto"
    # torch's intra-op threads, set before the job builds anything: one, as torch.utils.benchmark's Timer takes,
    # since a CPU step of small kernels spread over threads that other work preempts times the preemption
    cpu_threads: int = 1
    seed: int = 0
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # mode=bucketed's capture sizes
    graph_steps: int = 1  # decode steps per graph replay; >1 captures argmax and feeding too
    compile_mode: Optional[str] = None  # torch.compile mode for the compiled modes; None: the mode's default
    # torch._inductor.config options for the compiled modes, over compile_mode's own: +inductor.KEY=VALUE
    inductor: Dict[str, Any] = field(default_factory=dict)
    # The compiled modes: compile one decoder layer and stamp its code out for every layer of the model
    # (torch.compiler.nested_compile_region), so that compile time no longer grows with depth; Inductor then fuses
    # nothing across a layer's edge (what that costs a step: docs/time-to-answer.md). Other modes ignore it.
    compile_regions: bool = False
    fused: FusedConfig = field(default_factory=FusedConfig)  # mode=fused's switches
    resume: bool = False  # skip a job whose identical config already has a FINISHED run in the store
    profile: bool = False  # after the timed steps, profile a few more (kernels, busy/idle, trace)
    profile_steps: int = 8
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        _require(self.mode in MODES, f"mode={self.mode} is invalid: use one of {', '.join(MODES)}")
        _require(self.attn in ATTENTION, f"attn={self.attn} is invalid: use one of {', '.join(ATTENTION)}")
        _require(self.stop in STOP_RULES, f"stop={self.stop} is invalid: use one of {', '.join(STOP_RULES)}")
        for key, (least, sign, subject, why) in BOUNDS.items():
            value = getattr(self, key)
            _require(value > least if sign == ">" else value >= least,
                     f"{key}={value} is invalid: {subject} must be {sign} {least}" + (f" ({why})" if why else ""))
        self._check_graph_options()
        needed = self.slots_needed()
        if self.cache_len is None:
            self.cache_len = round_up(needed, CACHE_BLOCK)
        k = self.graph_steps
        _require(self.cache_len >= needed,
                 f"cache_len={self.cache_len} is too short: context_len ({self.context_len}) + warmup "
                 f"({self.warmup}) + decode_tokens ({self.decode_tokens})"
                 + (f" + profile_steps ({self.profile_steps})" if self.profile else "")
                 + (f", decode in whole replays of graph_steps={k}," if k > 1 else "")
                 + f" = {needed} tokens must fit; use cache_len>={needed}, or leave it out (cache_len=null)")
        block = ATTENTION[self.attn].block
        _require(not ATTENTION[self.attn].cache_in_blocks or self.cache_len % block == 0,
                 f"cache_len={self.cache_len} is invalid with attn={self.attn}: it reads the cache in blocks of {block} "
                 f"slots; use a multiple of {block} (e.g. {round_up(self.cache_len, block)}), or leave it out")
        _require(needed <= self.model.max_position_embeddings,
                 f"context_len={self.context_len} is too long for model={self.model.name}: with warm-up and decode "
                 f"the positions reach {needed}, past its max_position_embeddings={self.model.max_position_embeddings}")
        _require(bool(_DEVICE.match(self.device)),
                 f"device={self.device!r} is invalid: use auto, cpu, cuda or cuda:N")

    def _check_graph_options(self) -> None:
        b = list(self.buckets)
        _require(len(b) > 0, "buckets=[] is invalid: give at least one batch size, e.g. buckets=[1,2,4,8]")
        _require(all(x >= 1 for x in b), f"buckets={b} is invalid: every bucket must be >= 1")
        _require(all(x < y for x, y in zip(b, b[1:])),
                 f"buckets={b} is invalid: list them in increasing order without repeats, e.g. {sorted(set(b))}")
        _require(self.graph_steps >= 1, f"graph_steps={self.graph_steps} is invalid: it must be >= 1")
        stepped = [m.name for m in MODES.values() if m.graph_steps]
        _require(self.graph_steps == 1 or MODES[self.mode].graph_steps,
                 f"graph_steps={self.graph_steps} applies to mode={' or mode='.join(stepped)} only, "
                 f"not mode={self.mode}")
        if self.compile_mode is not None:
            allowed = MODES[self.mode].compile_modes
            _require(self.compile_mode in allowed,
                     f"compile_mode={self.compile_mode} is invalid for mode={self.mode}: "
                     + (f"use one of {', '.join(allowed)}" if allowed else "only the compiled modes take it"))
        # a mode that compiles nothing runs as if compile_regions were false, so that a preset sweeping modes can set it
        # for its compiled jobs and leave the others' labels and config hashes as they are
        self.compile_regions = self.compile_regions and bool(MODES[self.mode].compile_modes)
        self._check_inductor_options()
        self._check_fused()

    def _check_fused(self) -> None:
        """mode=fused computes decode attention by attn=triton-decode's kernel (the default sdpa becomes it) and
        covers dense Llama and Qwen3 layers: another model is refused here, before anything is built."""
        own = MODES[self.mode].attention
        if own is not None:
            self.attn = own if self.attn == "sdpa" else self.attn
            _require(self.attn == own, f"attn={self.attn} is invalid with mode={self.mode}: its kernels compute "
                                       f"decode attention as attn={own} does; leave attn out or use attn={own}")
        if self.mode != "fused":
            changed = [f"fused.{k}" for k, v in dataclasses.asdict(self.fused).items()
                       if getattr(FusedConfig(), k) != v]
            _require(not changed, f"{', '.join(changed)} applies to mode=fused only, not mode={self.mode}")
            return
        model = self.model
        _require(model.model_type in FUSED_FAMILIES and not model.extra.get("num_experts"),
                 f"model={model.name} (model_type={model.model_type}) is not covered by mode=fused: it computes "
                 f"dense {' and '.join(FUSED_FAMILIES)} decoder layers; use mode=compiled for this model")
        _require(not model.fuse_projections, "model.fuse_projections=true is invalid with mode=fused: "
                                              "it packs its projections itself; leave it out")

    def _check_inductor_options(self) -> None:
        # `+inductor.triton.cudagraphs=false` composes as {triton: {cudagraphs: false}}: Inductor's name is dotted
        self.inductor = flatten(dict(self.inductor))
        if not self.inductor:
            return
        first = next(iter(self.inductor))
        _require(bool(MODES[self.mode].compile_modes),
                 f"inductor.{first} applies to the compiled modes only (mode=compiled or compiled-nograph), "
                 f"not mode={self.mode}")
        _require("triton.cudagraphs" not in self.inductor,
                 "inductor.triton.cudagraphs is the mode's choice: use mode=compiled (Inductor's kernels replayed from "
                 "CUDA graphs) or mode=compiled-nograph (launched one by one)")
        from torch._inductor import config as inductor_config  # only here: importing Inductor takes a while

        known = inductor_config.get_config_copy()
        for key, value in self.inductor.items():
            _require(key in known, f"inductor.{key} is not an option of torch._inductor.config in this torch; "
                                   f"options are named as in torch/_inductor/config.py, e.g. inductor.epilogue_fusion")
            wanted = inductor_config.get_type(key)
            # the check torch.compile makes on its options (generic types, e.g. Optional[int], it cannot check)
            _require(typing.get_origin(wanted) is not None or isinstance(value, wanted),
                     f"inductor.{key}={value!r} is invalid: torch._inductor.config.{key} takes a "
                     f"{getattr(wanted, '__name__', wanted)}, e.g. inductor.{key}={known[key]!r}")

    def derived(self) -> dict[str, Any]:
        """The keys the schema decides from others, as it decided them: cache_len where unset, and compile_regions
        (false in a mode that compiles nothing): a run records these, so that its label, config hash and rerun say
        what ran."""
        return {"cache_len": self.cache_len, "compile_regions": self.compile_regions}

    def kv_cache_bytes(self) -> int:
        """Bytes of the job's static KV cache: K and V of every layer, row and slot."""
        m = self.model
        item = 4 if self.dtype == DType.fp32 else 2
        return 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * self.cache_len * self.bs * item

    def slots_needed(self) -> int:
        """Cache slots a job fills: the context, warm-up and decode (timed_slots), then the profiler's steps in
        whole replays of graph_steps tokens."""
        return self.context_len + self.timed_slots() \
            + (round_up(self.profile_steps, self.graph_steps) if self.profile else 0)

    def first_timed_position(self) -> int:
        """The slot of the first timed step's token in every block: `warmup` steps after the context, whatever
        graph_steps (the timed window's rule: harness/measure/timing.py, to_the_window)."""
        return self.context_len + self.warmup

    def timed_slots(self) -> int:
        """Slots past the context that warm-up and decode fill: the warm-up's whole replays of graph_steps tokens
        from the context, and each timed block's whole replays from `warmup` steps after it (first_timed_position),
        whichever reach further (the block, as it has at least one replay)."""
        k = self.graph_steps
        return max(round_up(self.warmup, k), self.warmup + round_up(self.decode_tokens, k))

    @property
    def label(self) -> str:
        return run_label({**{key: attrgetter(key)(self) for key in (*LABEL_KEYS, *FUSED_SWITCHES)},
                          **{f"{INDUCTOR}{key}": value for key, value in self.inductor.items()}})


# Keys that say where a run is stored or how it is scheduled, not what it measures.
NOT_IDENTITY = ("tracking", "resume", "profile", "profile_steps")


def schema_defaults(node: type | None = None, prefix: str = "") -> dict[str, Any]:
    """Every key of the schema that has a default, dotted, with its default as a resolved config holds it
    (enums by value); the model's architecture keys have none (each preset states them)."""
    node = node or RunConfig
    out, hints = {}, typing.get_type_hints(node)
    for f in dataclasses.fields(node):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(schema_defaults(hints[f.name], f"{prefix}{f.name}."))
            continue
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value is not dataclasses.MISSING and value != MISSING:
            out[f"{prefix}{f.name}"] = getattr(value, "value", value)
    return out


def identity(config: dict, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a job measures, as dotted keys: its resolved config less where it is stored and how it is scheduled,
    and less every key at its schema default, so that a key added later with a default leaves the identity (and
    the hash) of every run stored before it as it was. An empty dict (`model.extra`, `inductor`) adds nothing."""
    defaults = schema_defaults() if defaults is None else defaults
    flat = flatten({k: v for k, v in config.items() if k not in NOT_IDENTITY})
    return {k: v for k, v in flat.items() if k not in defaults or defaults[k] != v}


def config_hash(config: dict, defaults: dict[str, Any] | None = None) -> str:
    """A job's identity as a short hash (the store's `harness.config_hash`, which resume and rerun match)."""
    return hashlib.sha256(json.dumps(identity(config, defaults), sort_keys=True, default=str).encode()).hexdigest()[:16]


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
GROUPS = ("model", "experiment")  # config groups a command line may select (`+experiment=` adds one)


def register() -> None:
    # `model` is typed through RunConfig.model, so the model/*.yaml files need no schema of their own.
    ConfigStore.instance().store(name="schema", node=RunConfig)
    # A suffix that keeps apart the folders of sweeps started in the same second (Hydra caches it per
    # sweep, as it does `now`, so every job of one sweep reads the same folder).
    OmegaConf.register_new_resolver("harness_uid", lambda: secrets.token_hex(3), use_cache=True, replace=True)


register()
