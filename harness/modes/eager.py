from __future__ import annotations

import torch

from harness.modes.base import DecodeMode, forward_step


class EagerStepper:
    graph_bytes = 0

    def __init__(self, model: torch.nn.Module, cache, input_ids: torch.Tensor):
        self.model, self.cache, self.input_ids = model, cache, input_ids.clone()

    def step(self) -> torch.Tensor:
        return forward_step(self.model, self.cache, self.input_ids)


class EagerMode(DecodeMode):
    """Call the model at every step: one kernel launch per op, from Python."""

    name = "eager"
    verify_against_eager = False
    prepare_phase = "prepare"

    def prepare(self, model, cache, input_ids):
        return EagerStepper(model, cache, input_ids)
