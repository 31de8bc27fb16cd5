"""harness/measure/context_check.py: verification's window decodes across a block edge of the backend in use."""
from __future__ import annotations

import pytest

from harness.kernels import attention
from harness.measure.job import measure
from tests.support import FAST, run_config
from tests.unit.kernels.support import CPU


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def test_verification_decodes_across_a_block_edge_of_the_backend_in_use():
    from harness.measure.context_check import VERIFY_TOKENS, verified_steps

    assert verified_steps("sdpa", 16, 256) == VERIFY_TOKENS  # reads every slot: no edge to cross
    assert verified_steps("flex", 16, 256) == 128 - 16 + 3  # up to two past position 128, where flex's 2nd block starts
    assert verified_steps("flex", 1024, 1280) == VERIFY_TOKENS  # position 1024 starts a block: the first step crosses
    assert verified_steps("triton-decode", 40, 256) == VERIFY_TOKENS  # 40..71 crosses 64
    assert verified_steps("triton-decode", 8, 64) == 56  # as far as the cache holds


def _newest_slot_dropped_at_block_edges(monkeypatch):
    """attn=triton-decode with a fault at its block edges only: where the new token starts a block of 64 slots, the
    kernel attends to the slots before it and not to the token itself."""
    attention.use_triton_decode(CPU)
    kernel = attention.triton_decode_op

    def faulty(query, key, value, position, scale):
        return kernel(query, key, value, position - 1 if int(position) % 64 == 0 else position, scale)

    monkeypatch.setattr(attention, "triton_decode_op", faulty)


@pytest.mark.slow
def test_a_fault_at_a_block_edge_fails_the_run_that_32_steps_from_the_context_would_pass(monkeypatch):
    from harness.measure import context_check

    _newest_slot_dropped_at_block_edges(monkeypatch)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=1", "attn=triton-decode", "model.tie_word_embeddings=false",
                     "cache_len=128")
    faulty = measure(cfg)  # verification decodes positions 8..66: position 64 starts a block
    assert faulty.metrics["verified_steps"] == 64 - 8 + 3 and faulty.failure is not None
    monkeypatch.setattr(context_check, "verified_steps", lambda *a: context_check.VERIFY_TOKENS)
    assert measure(cfg).failure is None  # the old window, positions 8..39, decodes at no edge: the fault passed
