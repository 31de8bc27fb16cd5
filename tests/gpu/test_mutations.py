"""GPU tests: every built-in mutation fails a captured run. Skipped where there is no CUDA."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.measure.job import measure
from tests.support import flex_block_mask_one_short, gpu, run_config
from tests.gpu.support import QWEN


pytestmark = [pytest.mark.gpu, gpu]


@pytest.mark.parametrize("kind", ["kv_lost", "rope_off_by_one", "layer_skipped", "newest_masked", "stale_token",
                                  "rewind_clears_context_end"])
def test_every_injected_mutation_fails_a_graphed_run(monkeypatch, kind):
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)  # active in the capture: the graph holds the fault
    result = measure(run_config(*QWEN, "bs=2", "mode=graphed", "repeats=1", "model.tie_word_embeddings=false"))
    print(f"{kind}: {result.failure}")
    assert result.failure is not None and result.metrics["verified"] == 0.0


@pytest.mark.parametrize("context", [100, 1024])
def test_flex_missing_the_newest_tokens_block_fails_the_run(monkeypatch, context):
    """The block count one short where the position is a multiple of 128 (the new token's own block unread): the
    verified window crosses 128 at context 100 and starts at it at context 1024. Compiled flex reads the block
    count, which flex's CPU path ignores, so only a GPU shows what it computes. The 4x max-logit bound misses it at
    both; the worst step's KL delta catches it at context 100, not at 1024 (one key of 1025 unread at one step
    moves the KL less than bf16's own spread), where the check of flex's read plan does."""
    from harness.kernels import attention

    models.release_models()
    torch._dynamo.reset()  # flex's compiled op must trace the faulty mask, not reuse an earlier trace
    monkeypatch.setattr(attention, "decode_block_mask", flex_block_mask_one_short)
    result = measure(run_config("model=tiny", f"context_len={context}", "decode_tokens=40", "mode=graphed", "attn=flex"))
    models.release_models()
    torch._dynamo.reset()
    # the fault in force (flex compiled after the reset: Dynamo reads a module's globals when it traces)
    assert int(attention.decode_block_mask(torch.tensor(128), 256, "cuda").kv_num_blocks.flatten()[0]) == 1
    m = result.metrics
    print(f"context {context}: max-logit {m['fp32_max_logit_err']:.4g} (bound {m['fp32_err_bound']:.4g}); KL delta "
          f"{m['kl_delta_nats']:.3g} [{m['kl_delta_low_nats']:.3g}, {m['kl_delta_high_nats']:.3g}] nats, worst step "
          f"{m['kl_delta_max_step_nats']:.3g} (tolerance {m['kl_step_tolerance_nats']:.3g}); {result.failure}")
    assert result.failure is not None and m["verified"] == 0.0
    if context == 1024:  # H200, 2026-12-01: 0.000513 nats at that step against a tolerance of 0.00394
        assert result.failure.startswith("attn=flex plans to read 1024 slots for the token at slot 1024"), result.failure
    else:  # the window crosses 128 (H200: 0.00487 nats at that step against 0.0043; max-logit 0.3691 within 0.4732)
        assert result.failure.startswith("at one step the run's KL from fp32"), result.failure


@pytest.mark.parametrize("kind,steps_a_replay", [("kv_append_lost", (1, 4)), ("fused_rope_off_by_one", (1, 4)),
                                                  ("fused_greedy_not_fed", (4,))])  # the last feeds in the graph only
def test_a_fault_inside_a_captured_fused_kernel_fails_the_run(monkeypatch, kind, steps_a_replay):
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)  # built into the kernels before capture
    for graph_steps in steps_a_replay:
        result = measure(run_config(*QWEN, "bs=2", "mode=fused", "repeats=1", "model.tie_word_embeddings=false",
                                    f"graph_steps={graph_steps}"))
        print(f"{kind}, graph_steps={graph_steps}: {result.failure}")
        assert result.failure is not None and result.metrics["verified"] == 0.0
