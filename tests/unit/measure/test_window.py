"""The timed window (harness/measure/timing.py, to_the_window): every timed block of a run starts `warmup` steps
after the context, whatever graph_steps, so that runs that differ only in graph_steps time the same positions.

Bug caught throughout: a stepper of K steps a call (graph_steps > 1, argmax and feeding inside its graph) warmed up
in whole calls, round_up(warmup, K) steps, and timed from there: Llama-3.2-1B at context 32 timed positions 159-286
at graph_steps=127 against 42-169 at graph_steps=1, so a sweep over graph_steps compared different prefixes.

The cheap jobs run mode=graphed's own stepper with its graph's calls run uncaptured (no CUDA here): what its graph
holds, `graph_steps` eager steps a call with argmax and feeding inside past one (GraphedStepper._k_steps). The slow
job runs mode=fused, whose graph of several steps feeds itself through its own greedy kernel (Triton's interpreter).
"""
from __future__ import annotations

import pytest
import torch

from harness.errors import ConfigError
from harness.measure import job as job_module
from harness.measure.job import measure
from harness.modes import MODES, ModeSpec
from harness.modes.base import DecodeMode, Stepper
from harness.modes.graphed import GraphedStepper
from tests.support import FAST, run_config

pytestmark = pytest.mark.usefixtures("fresh_model_cache")

UNCAPTURED = "graphed-uncaptured"
CPU_FP32 = ("device=cpu", "dtype=fp32")
CONTEXT, WARMUP = 8, 2  # FAST's
K = 4  # a warm-up of 2 steps takes one call of 4: two steps past the window's first slot


class UncapturedGraphedStepper(GraphedStepper):
    """mode=graphed's stepper, each call run as its capture would have recorded it (GraphedStepper.capture's fn)."""

    def step(self) -> torch.Tensor:
        return self._k_steps() if self.feeds_itself else Stepper.step(self)


class UncapturedGraphedMode(DecodeMode):
    """mode=graphed on a CPU: eager's kernels (an exact mode, checked against eager bit for bit), no graph."""

    name = UNCAPTURED

    def prepare(self, model, prompt, cfg):
        return UncapturedGraphedStepper(model, prompt, cfg.cache_len, cfg.graph_steps)


@pytest.fixture
def uncaptured(monkeypatch) -> str:
    monkeypatch.setitem(MODES, UNCAPTURED, ModeSpec(UNCAPTURED, f"{__name__}:UncapturedGraphedMode", graph_steps=True))
    return f"mode={UNCAPTURED}"


def _write_position(stepper) -> int:
    """The slot every layer of the stepper's cache writes next, read from the cache itself."""
    positions = {int(layer.cumulative_length) for layer in stepper.cache.layers}
    assert len(positions) == 1, positions
    return positions.pop()


@pytest.fixture
def timed_spans(monkeypatch) -> list:
    """Each timed block of the jobs run after it, as the cache saw it: (the slot its first step wrote, the slot the
    step after its last would write, the tokens it decoded [steps, bs])."""
    spans, real = [], job_module.timed_decode

    def recording(stepper, tokens, device, keep_logits=None):
        start = _write_position(stepper)
        block = real(stepper, tokens, device, keep_logits)
        spans.append((start, _write_position(stepper), block.tokens.clone()))
        return block

    monkeypatch.setattr(job_module, "timed_decode", recording)
    return spans


def _jobs_over_graph_steps(spans: list, *overrides: str) -> dict[int, tuple]:
    """A job at graph_steps=1 and one at K, one after the other as a sweep runs them (the second decodes from the
    context the first kept): each one's result and the spans of its timed blocks."""
    out = {}
    for graph_steps in (1, K):
        spans.clear()
        result = measure(run_config(*FAST, *overrides, f"graph_steps={graph_steps}"))
        assert result.failure is None and result.metrics["verified"] == 1.0, (graph_steps, result.failure)
        out[graph_steps] = (result, list(spans))
    return out


@pytest.mark.slow
def test_every_graph_steps_times_the_same_positions(uncaptured, timed_spans):
    """Two blocks each (the second after a rewind and a warm-up again): at graph_steps=1 and 4 every block writes
    slots 10 to 17, the logged first timed position is 10 (context 8 + warmup 2), and the blocks decode the very same
    tokens (the same history at the same positions). The run at 4 passes its checks against eager, which judge the
    warm-up's first two tokens and the block's as one decode from the context: the token its warm-up fed the window's
    first step is the right one. On the old window the run at 4 timed slots 12 to 19."""
    runs = _jobs_over_graph_steps(timed_spans, uncaptured, *CPU_FP32, "repeats=2", "stop=repeats")
    first = CONTEXT + WARMUP
    for graph_steps, (_, spans) in runs.items():
        assert [(start, end) for start, end, _ in spans] == [(first, first + 8)] * 2, graph_steps
        assert torch.equal(spans[0][2], spans[1][2])  # the second block decoded what the first did
    assert [result.metrics["first_timed_position"] for result, _ in runs.values()] == [first, first]
    assert runs[K][0].metrics["prefill_reused"] == 1.0  # it decoded from the first job's context, as a sweep's does
    assert torch.equal(runs[1][1][0][2], runs[K][1][0][2])
    # the speed of light is computed over the positions timed, the same for both
    for key in ("step_bytes", "kv_slots_read", "implementation_bytes"):
        assert runs[1][0].metrics[key] == runs[K][0].metrics[key], key


@pytest.mark.slow
def test_a_run_timed_past_its_window_fails(uncaptured, monkeypatch):
    """The window's check (timing.window_problem), every block's first slot read from the cache: a run of 4 steps a
    call whose warm-up is left where it ended (the old window: no rewind into the window) fails, naming the slot."""
    from harness.measure import timing

    cfg = run_config(*FAST, uncaptured, *CPU_FP32, f"graph_steps={K}")
    assert measure(cfg).failure is None
    monkeypatch.setattr(job_module, "to_the_window", lambda stepper, warmup, decoded: decoded)
    monkeypatch.setattr(timing, "to_the_window", lambda stepper, warmup, decoded: decoded)
    result = measure(cfg)
    assert result.failure == ("timed block 1 started at slot 12, not at slot 10 (context_len + warmup): it timed other "
                              "positions than the run's window"), result.failure
    assert result.metrics["first_timed_position"] == 12


@pytest.mark.slow
def test_a_window_needs_the_warm_up_and_whole_replays_of_the_decode_only(uncaptured, timed_spans):
    """A cache of context + warmup + the decode in whole replays holds a run of K steps a call: the warm-up's one
    call of 4 ends inside it, and the block of 32 from slot 10 fills it to its last slot (verification's free run
    of 32 steps from the context fits too). The old window asked for the warm-up in whole replays as well, 44 slots,
    and refused 42."""
    steps = ("decode_tokens=32",)
    assert run_config(*FAST, uncaptured, *steps, "graph_steps=4", "cache_len=42").cache_len == 42
    with pytest.raises(ConfigError, match=r"decode in whole replays of graph_steps=4, = 42 tokens must fit; "
                                          r"use cache_len>=42"):
        run_config(*FAST, uncaptured, *steps, "graph_steps=4", "cache_len=41")
    result = measure(run_config(*FAST, uncaptured, *CPU_FP32, *steps, "graph_steps=4", "cache_len=42"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    assert [(start, end) for start, end, _ in timed_spans] == [(CONTEXT + WARMUP, 42)]
    # one step a call needs no more: the same cache_len, its minimum either way
    with pytest.raises(ConfigError, match="= 42 tokens must fit"):
        run_config(*FAST, uncaptured, *steps, "cache_len=41")


@pytest.mark.slow
def test_an_ab_over_graph_steps_times_both_arms_from_the_same_slot(uncaptured, monkeypatch):
    """`harness ab` between graph_steps=1 and 4: every block of both arms starts at slot 10, as the A/B's result
    says; on the old window arm B's started at 12."""
    from harness.analysis.ab import markdown, result_of
    from harness.measure import ab

    starts = {}
    real = ab.timed_decode

    def recording(stepper, tokens, device, keep_logits=None):
        starts.setdefault(stepper.tokens_per_step, []).append(_write_position(stepper))
        return real(stepper, tokens, device, keep_logits)

    monkeypatch.setattr(ab, "timed_decode", recording)
    a, b = (run_config(*FAST, uncaptured, *CPU_FP32, f"graph_steps={k}") for k in (1, K))
    arm_a, arm_b, environment = ab.time_arms(a, b, pairs=2)
    assert starts == {1: [CONTEXT + WARMUP] * 2, K: [CONTEXT + WARMUP] * 2}
    result = result_of(arm_a, arm_b, environment, 0.01)
    assert result.first_timed_position == (CONTEXT + WARMUP, CONTEXT + WARMUP)
    assert "- every block timed from slot 10 (A) and 10 (B)" in markdown(result)


@pytest.mark.slow
def test_a_fused_graph_of_several_steps_times_the_same_positions_as_one_step_a_call(timed_spans):
    """mode=fused, whose graph of several steps feeds each step's argmax to the next through its own greedy kernel
    (Triton's interpreter on a CPU, launched one by one): at graph_steps=1 and 4 the one block writes slots 10 to
    17, logged as the first timed position 10, with the same tokens; both are judged against fp32."""
    runs = _jobs_over_graph_steps(timed_spans, *CPU_FP32, "bs=1", "mode=fused", "model.tie_word_embeddings=false")
    for graph_steps, (_, spans) in runs.items():
        assert [(start, end) for start, end, _ in spans] == [(CONTEXT + WARMUP, CONTEXT + WARMUP + 8)], graph_steps
    assert torch.equal(runs[1][1][0][2], runs[K][1][0][2])
    for result, _ in runs.values():
        assert result.metrics["first_timed_position"] == CONTEXT + WARMUP
        assert result.metrics["fp32_max_logit_err"] < 1e-3
