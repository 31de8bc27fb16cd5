"""The one interface every decode mode implements.

A mode turns (model, cache, first token) into a Stepper. A stepper owns the input buffer that
the next step reads (`input_ids`, shape [bs, 1]); `step()` runs one decode step and returns the
last position's logits, shape [bs, vocab]. The caller feeds the argmax back into `input_ids`.
"""
from __future__ import annotations

from typing import ClassVar, Protocol

import torch


class Stepper(Protocol):
    input_ids: torch.Tensor
    graph_bytes: int  # memory the mode's graphs hold (0 where there are none)

    def step(self) -> torch.Tensor: ...


class DecodeMode:
    name: ClassVar[str]
    needs_cuda: ClassVar[bool] = False
    # Modes other than plain eager prove themselves: their first greedy tokens must equal eager's.
    verify_against_eager: ClassVar[bool] = True
    prepare_phase: ClassVar[str] = "capture"  # what prepare() does, for the progress line

    def prepare(self, model: torch.nn.Module, cache, input_ids: torch.Tensor) -> Stepper:
        raise NotImplementedError


def forward_step(model: torch.nn.Module, cache, input_ids: torch.Tensor) -> torch.Tensor:
    """One decode step; the StaticCache advances its own device-side position."""
    return model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits[:, -1, :]
