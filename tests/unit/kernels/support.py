"""Helpers the tests of the attention backends share: the tiny model built with a backend, teacher-forced logits."""
from __future__ import annotations

import torch

from harness import models
from tests.support import FAST, run_config


CPU = torch.device("cpu")


def _tiny(attn: str, bs: int = 2):
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", f"bs={bs}").model
    return models._load(cfg, torch.float32, attn, CPU, seed=0)[0]


def _forced_logits(stepper, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for token in tokens:
        out.append(stepper.step().clone())
        stepper.input_ids.copy_(token)
    return out
