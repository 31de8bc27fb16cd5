"""Decode modes by name. A new mode is one module here plus its name in config.MODE_NAMES."""
from __future__ import annotations

from harness.modes.base import DecodeMode, Stepper, forward_step, prefill
from harness.modes.bucketed import BucketedMode
from harness.modes.compiled import CompiledMode, CompiledNoGraphMode
from harness.modes.eager import EagerMode
from harness.modes.graphed import GraphedMode

MODES: dict[str, type[DecodeMode]] = {
    m.name: m for m in (EagerMode, GraphedMode, BucketedMode, CompiledNoGraphMode, CompiledMode)
}

__all__ = ["MODES", "DecodeMode", "Stepper", "forward_step", "prefill"]
