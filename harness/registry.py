"""What the mode and attention-backend registries share: specs by name (an unknown name refused in one line that
lists the known ones), and their code imported only when a job needs it, from a "module:attribute" target."""
from __future__ import annotations

import importlib


class Registry(dict):
    """name -> spec, for the config key `key` (`mode`, `attn`)."""

    def __init__(self, key: str):
        super().__init__()
        self.key = key

    def register(self, spec):
        self[spec.name] = spec
        return spec

    def spec(self, name: str):
        if name not in self:
            raise KeyError(f"{self.key}={name} is invalid: use one of {', '.join(self)}")
        return self[name]


def load(target: str):
    """The attribute a "module:attribute" target names, its module imported now."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
