"""The one interface every decode mode implements.

A mode's `prepare(model, prompt, cfg)` builds its Stepper and readies it (capture, compile), then
returns it just prefilled. A stepper owns its StaticCache and the input buffer the next step reads
(`input_ids`, [bs, 1]); its constructor allocates and prefills, nothing more; `restart(prompt)`
empties the cache and prefills; `step()` decodes `tokens_per_step` tokens and returns the last one's
logits [bs, vocab]. Unless the stepper `feeds_itself` (argmax and feeding inside its graph), the
caller writes the argmax back into `input_ids`.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from transformers import StaticCache


def prefill(model: torch.nn.Module, cache, prompt: torch.Tensor) -> torch.Tensor:
    """Eager prefill of the whole prompt; returns the first greedy token, shape [rows, 1]."""
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :].argmax(dim=-1, keepdim=True)


def forward_step(model: torch.nn.Module, cache, input_ids: torch.Tensor) -> torch.Tensor:
    """One decode step; the StaticCache advances its own device-side position."""
    return model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits[:, -1, :]


def pad_rows(prompt: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad a batch up to `rows` with token-0 rows, whose outputs are discarded."""
    missing = rows - prompt.shape[0]
    return prompt if missing == 0 else torch.cat([prompt, prompt.new_zeros(missing, prompt.shape[1])])


class Stepper:
    graph_bytes: int = 0  # memory held by the stepper's graphs
    tokens_per_step: int = 1
    feeds_itself: bool = False

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, cache_len: int, rows: int | None = None):
        self.model, self.bs, self.cache_len = model, prompt.shape[0], cache_len
        self.rows = rows or self.bs  # a bucketed stepper runs more rows than the batch has
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        self.static_ids = torch.zeros(self.rows, 1, dtype=torch.long, device=prompt.device)
        self.input_ids = self.static_ids if self.rows == self.bs else self.static_ids[: self.bs]
        self.tokens = self.input_ids.T  # [tokens_per_step, bs]: what the last step produced
        self.metrics: dict[str, float] = {}  # mode-specific numbers, merged into the run's metrics
        self.tags: dict[str, str] = {}
        self.restart(prompt)  # the prefill also allocates the cache, outside any graph pool

    def restart(self, prompt: torch.Tensor) -> None:
        self.cache.reset()
        self.static_ids.copy_(prefill(self.model, self.cache, pad_rows(prompt, self.rows)))

    def forward(self) -> torch.Tensor:
        """One eager decode step of every row the stepper holds."""
        return forward_step(self.model, self.cache, self.static_ids)

    def step(self) -> torch.Tensor:
        return self.forward()[: self.bs]


class DecodeMode:
    name: ClassVar[str]
    needs_cuda: ClassVar[bool] = False
    # Every run proves its decode (harness/verify.py). Exact modes run eager's very kernels, so their logits
    # must equal eager's bit for bit; inexact ones (other kernels, other rounding) are judged against fp32.
    exact: ClassVar[bool] = True
    prepare_phase: ClassVar[str] = "capture"  # what prepare() does, for the progress line

    def check(self, device: torch.device) -> str | None:
        """Why this mode cannot run here, or None."""
        if self.needs_cuda and device.type != "cuda":
            return (f"mode={self.name} needs a CUDA GPU and this job runs on {device} "
                    f"(torch.cuda.is_available() is {torch.cuda.is_available()}); use mode=eager here")
        return None

    def prepare(self, model: torch.nn.Module, prompt: torch.Tensor, cfg) -> Stepper:
        raise NotImplementedError
