"""From a command line or a saved config to a validated RunConfig: the schema's dotted keys, unknown and
renamed keys refused in one line, saved configs of earlier versions upgraded."""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.config.schema import CONF_DIR, GROUPS, ModelConfig, RunConfig
from harness.errors import ConfigError
from harness.config.labels import INDUCTOR
from harness.record import flatten

RENAMED = {"prompt_len": "context_len"}  # keys of saved configs from earlier versions, and their names now
OPEN = ("model.extra", "inductor")  # free-form keys (a model type's config.json keys, Inductor options), checked where used


def model_preset(name: str) -> DictConfig:
    """A conf/model/ preset by name, as `model=NAME` selects it on a command line."""
    presets = sorted(p.stem for p in (Path(CONF_DIR) / "model").glob("*.yaml"))
    if name not in presets:
        raise ConfigError(f"model={name} is not a model preset: use one of {', '.join(presets)}")
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(Path(CONF_DIR) / "model" / f"{name}.yaml"))


def schema_keys(node: type = None, prefix: str = "") -> list[str]:
    """Every dotted key of the schema: `bs`, `model.hidden_size`, `tracking.uri`, ..."""
    keys = []
    for f in dataclasses.fields(node or RunConfig):
        sub = typing.get_type_hints(node or RunConfig)[f.name]
        keys += schema_keys(sub, f"{prefix}{f.name}.") if dataclasses.is_dataclass(sub) else [f"{prefix}{f.name}"]
    return keys


def check_keys(keys) -> None:
    """Refuse a key the schema lacks, naming the nearest one that exists."""
    known = schema_keys()
    for key in keys:
        if key in RENAMED:
            raise ConfigError(f"{key} is now called {RENAMED[key]}: use {RENAMED[key]}=N")
        if key not in known and not any(key.startswith(f"{o}.") for o in OPEN):
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            raise ConfigError(f"{key} is not a config key" + (f": did you mean {near[0]}?" if near else
                              f"; the keys are {', '.join(known)}"))


def check_overrides(args) -> None:
    """The keys of command-line overrides (`k=v`, `+k=v`, `++k=v`), checked before Hydra composes them:
    a typo is refused in one line, and `+` adds no key the schema lacks (only a documented group)."""
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        if arg.startswith("-") or "=" not in arg or key.split(".")[0].split("/")[0] == "hydra" or key in GROUPS:
            continue
        check_keys([key])
        if key.startswith(INDUCTOR) and not arg.startswith("+"):  # Hydra's own refusal spans eight lines
            raise ConfigError(f"{arg} adds an Inductor option, which the config does not hold yet: write +{arg}")


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Validate a composed (or saved) config against the schema. Unknown keys are rejected."""
    data = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    if (upgraded := upgrade(data)) is not data:
        cfg = data = upgraded
    check_keys(k for k in flatten(data) if not k.startswith("hydra."))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
        return OmegaConf.to_object(merged)  # runs every __post_init__
    except ConfigError:
        raise
    except Exception as err:  # OmegaConf wraps exceptions raised in __post_init__
        cause = err.__cause__ if isinstance(err.__cause__, ConfigError) else None
        raise ConfigError(str(cause or err).splitlines()[0]) from err


def upgrade(data: dict) -> dict:
    """A config saved by an earlier version, in today's keys: its runs stay rerunnable. A saved prompt_len
    was the context the cache held, so it becomes context_len; its explicit cache_len is kept."""
    if not any(old in data for old in RENAMED):
        return data
    return {RENAMED.get(k, k): v for k, v in data.items()}
