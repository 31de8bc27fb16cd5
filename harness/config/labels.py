"""A run's name from its config: one function for every place that shows runs (labels, tables, reports)."""
from __future__ import annotations

from typing import Any, Mapping

from harness.config.fused import FUSED_SWITCHES  # each named in a run's label where it differs from its default
from harness.modes import MODES

# The keys that name a run's variant, dotted as in a run's MLflow params
VARIANT_KEYS = ("mode", "graph_steps", "model.fuse_projections", "attn", "compile_mode", "compile_regions")
LABEL_KEYS = ("model.name", "bs", "context_len", "cache_len", *VARIANT_KEYS)
INDUCTOR = "inductor."  # the prefix of a run's Inductor options (`inductor.epilogue_fusion`), each named in full
_UNSET = ("None", "null", "?")  # a key that is absent, null, or unknown ("?") leaves its default


def shown_key(override_key: str) -> str:
    """A command line's key as a label names it: `+inductor.x` is `inductor.x`, `model` (a preset) `model.name`."""
    key = override_key.lstrip("+~")
    return "model.name" if key == "model" else key


# The keys that decide which model object a job builds: a sweep runs the jobs of one value of them together
MODEL_KEYS = ("model", "dtype", "attn", "device", "seed")
# The keys that decide the context a job prefills, with the model's weights (every key above but `attn`: each
# backend but eager prefills through SDPA): a sweep runs the jobs of one value of them together, so that a job
# can decode from the context the one before it filled (harness/modes/kept_context.py)
CONTEXT_KEYS = ("bs", "context_len", "cache_len", "prompt_len")


def in_run_order(jobs: list[list[str]]) -> list[list[str]]:
    """A sweep's jobs (each a list of `key=value` overrides) in the order the harness sweeper runs them: grouped by
    the overrides that decide the model's weights (sorted, so a process builds each set of weights once), within
    them by those that decide the context a job fills, then by attention backend (each group where the grid first
    has it), and in the grid's order within one: the jobs that prefill the same context run one after another."""
    def values(job: list[str], keys: tuple[str, ...]) -> tuple:
        return tuple(o for o in job if o.split("=", 1)[0].lstrip("+~").split(".")[0] in keys)

    first_seen: dict[tuple, int] = {}
    for job in jobs:
        for keys in (CONTEXT_KEYS, ("attn",)):
            first_seen.setdefault(values(job, keys), len(first_seen))
    weights = tuple(k for k in MODEL_KEYS if k != "attn")
    return sorted(jobs, key=lambda job: (values(job, weights), first_seen[values(job, CONTEXT_KEYS)],
                                         first_seen[values(job, ("attn",))]))


def varying_keys(jobs: list[list[str]]) -> list[str]:
    """The keys whose values differ between the jobs of a sweep (each job a list of `key=value` overrides)."""
    values: dict[str, set] = {}
    for job in jobs:
        for override in job:
            key, _, value = override.partition("=")
            values.setdefault(shown_key(key), set()).add(value)
    return sorted(k for k, v in values.items() if len(v) > 1)


def _extra(flat: Mapping[str, Any], varying) -> list[tuple[str, str]]:
    """(key, `key=value`) for each varying key that the label does not show otherwise (dtype, seed, ...)."""
    shown = (*LABEL_KEYS,)
    return [(k, f"{k}={getattr(flat.get(k), 'value', flat.get(k))}") for k in varying
            if k not in shown and k not in FUSED_SWITCHES and not k.startswith(INDUCTOR) and k in flat]


def _variant_parts(flat: Mapping[str, Any], varying=()) -> list[tuple[str, str]]:
    """run_variant's words, each with the key it shows."""
    mode, steps, fused, attn, compile_mode, regions = (str(getattr(v, "value", v)) for v in map(flat.get, VARIANT_KEYS))
    own_attention = MODES[mode].attention if mode in MODES else None  # mode=fused's is triton-decode, always
    extras = [("graph_steps", f"steps={steps}" if steps not in (*_UNSET, "1") else ""),
              ("compile_mode", compile_mode if compile_mode not in _UNSET else ""),
              ("compile_regions", "regional" if regions.lower() == "true" else ""),
              ("model.fuse_projections", "fused" if fused.lower() == "true" else ""),
              ("attn", attn if attn not in (*_UNSET, "sdpa", own_attention) else ""),
              *((key, f"{key.split('.')[1]}={'off' if default else 'on'}") for key, default in FUSED_SWITCHES.items()
                if str(flat.get(key)).lower() == str(not default).lower())]
    inductor = [(key, f"{key[len(INDUCTOR):]}={value}") for key, value in sorted(flat.items()) if key.startswith(INDUCTOR)]
    return [("mode", "?" if mode in _UNSET else mode), *((k, t) for k, t in extras if t), *inductor,
            *_extra(flat, varying)]


def run_variant(flat: Mapping[str, Any], varying=()) -> str:
    """The mode and any option that changes what a step runs, e.g. `compiled max-autotune fused sdpa-gqa`,
    from a config's VARIANT_KEYS and Inductor options: MLflow params, a flattened result config, or values
    read from a config; then the other keys its sweep varies (`eager dtype=fp32`), so that no two runs of a
    sweep share a name."""
    return " ".join(text for _, text in _variant_parts(flat, varying))


def run_label(flat: Mapping[str, Any], varying=()) -> str:
    """The one run name, e.g. `qwen3-0.6b bs=4 ctx=1024 cache=1280 graphed`, from dotted keys (LABEL_KEYS):
    a RunConfig's, a flattened config's, or a run's MLflow params; a missing key reads `?`. A config saved
    before context_len existed names its prompt_len. The `varying` keys (those its sweep varies) lead, in their
    order, then the fixed ones (`bs=4 dtype=fp32 qwen3-0.6b ctx=1024 cache=1280 eager`): the name's first words
    tell a sweep's runs apart where a table cuts it short."""
    context = flat.get("context_len", flat.get("prompt_len", "?"))
    cache = "auto" if str(flat.get("cache_len")) in ("None", "null") else flat.get("cache_len", "?")
    parts = [("model.name", str(flat.get("model.name", "?"))), ("bs", f"bs={flat.get('bs', '?')}"),
             ("context_len", f"ctx={context}"), ("cache_len", f"cache={cache}"), *_variant_parts(flat, varying)]
    lead = [text for key in varying for k, text in parts if k == key]
    return " ".join([*lead, *(text for k, text in parts if k not in varying)])
