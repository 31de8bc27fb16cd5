"""A sweep's excluded combinations: `hydra.sweeper.exclude`, a list of {key: value} rules. A job whose composed config
matches every key of one rule is left out of the sweep (counted, never run, never recorded): a grid's corner that
would measure nothing new, as eager under every attention backend where one baseline serves each graphed run."""
from __future__ import annotations

from enum import Enum

from omegaconf import DictConfig, OmegaConf


def excluding_rule(cfg: DictConfig, rules) -> dict | None:
    """The first rule the job's composed config matches (every key equal, as text), or None."""
    for rule in rules or ():
        rule = OmegaConf.to_container(rule) if isinstance(rule, DictConfig) else dict(rule)
        if all(_text(OmegaConf.select(cfg, key, default=None)) == str(value) for key, value in rule.items()):
            return rule
    return None


def _text(value) -> str:
    """A config value as a command line writes it (an enum by its name: dtype=bf16)."""
    return value.name if isinstance(value, Enum) else str(value)


def describe(rule) -> str:
    rule = OmegaConf.to_container(rule) if isinstance(rule, DictConfig) else rule
    return " ".join(f"{key}={value}" for key, value in rule.items())
