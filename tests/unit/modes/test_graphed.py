"""The graphed mode (harness/modes/graphed.py) without a GPU: its capture's warm-up and its refusal."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.measure.job import JobError, measure, seeded_prompt
from tests.support import FAST, run_config

pytestmark = pytest.mark.usefixtures("fresh_model_cache")


CPU = torch.device("cpu")


def test_a_capture_warm_up_writes_after_a_kept_context_and_inside_the_cache(monkeypatch):
    """A capture's warm-up calls its step SIDE_STREAM_WARMUP times, each from one position: a graph of several steps
    at a cache sized for the context and two replays, prefilled as the context a job keeps for the next, writes
    neither past the cache (three replays from the context would) nor over the context. The capture's own CUDA parts
    are stood in for on the CPU (the side stream's calls made here, a graph that runs nothing)."""
    from harness.measure.context_check import context_digest
    from harness.modes import graphed

    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=1", "mode=graphed", "graph_steps=8", "cache_len=24")
    assert cfg.cache_len == cfg.context_len + 2 * 8 < cfg.context_len + graphed.SIDE_STREAM_WARMUP * 8
    model = models.get_model(cfg.model, "fp32", cfg.attn, CPU, 0).model
    prompt = seeded_prompt(1, cfg.context_len, model.config.vocab_size, 0, CPU)
    stepper = graphed.GraphedStepper(model, prompt, cfg.cache_len, cfg.graph_steps, prefill=True)
    context, after_each_call = context_digest(stepper), []

    def warm_up_here(fn, steps=graphed.SIDE_STREAM_WARMUP):
        for _ in range(steps):
            fn()
            after_each_call.append([int(layer.cumulative_length) for layer in stepper.cache.layers])

    monkeypatch.setattr(graphed, "warm_up_on_side_stream", warm_up_here)
    monkeypatch.setattr(graphed, "capture", lambda fn, pool=None: (None, None, 0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    stepper.capture(prompt)
    assert after_each_call == [[cfg.context_len + 8] * 2] * graphed.SIDE_STREAM_WARMUP
    assert torch.equal(context_digest(stepper), context)


@pytest.mark.parametrize("mode", ["graphed", "bucketed", "compiled"])
def test_graph_modes_without_cuda_fail_on_their_own(mode):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(JobError, match=f"mode={mode} needs a CUDA GPU"):
        measure(run_config(*FAST, f"mode={mode}"))
