from __future__ import annotations

from harness.modes.base import DecodeMode, Stepper


EagerStepper = Stepper  # eager calls the model at every step, which is Stepper's own step


class EagerMode(DecodeMode):
    """Call the model at every step: one kernel launch per op, from Python."""

    name = "eager"
    prepare_phase = "prepare"

    def prepare(self, model, prompt, cfg):
        return EagerStepper(model, prompt, cfg.cache_len, prefill=False)
