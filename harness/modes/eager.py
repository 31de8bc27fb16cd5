from __future__ import annotations

from harness.modes.base import DecodeMode, Stepper


class EagerStepper(Stepper):
    """Calls the model at every step (Stepper's own step)."""


class EagerMode(DecodeMode):
    """Call the model at every step: one kernel launch per op, from Python."""

    name = "eager"
    prepare_phase = "prepare"

    def prepare(self, model, prompt, cfg):
        return EagerStepper(model, prompt, cfg.cache_len)
