"""What the GPU tests share: Qwen3-0.6B's short job, the fused jobs' knobs swapped for a test."""
from __future__ import annotations

import dataclasses


QWEN_DECODE_TOKENS = 64

QWEN = ("model=qwen3-0.6b", "cache_len=256", f"decode_tokens={QWEN_DECODE_TOKENS}")


def run_with_knobs(monkeypatch, **changes):
    """The fused jobs of this test planned with these knobs: the rules' default swapped for the test (the jobs build
    their stepper from it), put back after. Returns the knobs."""
    from harness.kernels.fused import knobs

    variant = dataclasses.replace(knobs.KNOBS, **changes)
    monkeypatch.setattr(knobs, "KNOBS", variant)
    return variant
