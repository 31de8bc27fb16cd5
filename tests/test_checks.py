"""Checks that fail closed: each test reaches a plausible bug that an outside audit found passing, through the real
code's inputs or the harness's mutation registry (harness/measure/mutations.py), never a copy of the code in the
test, and sees the run fail; the same test passes the run without the fault, so the real code carrying the bug
fails it too."""
from __future__ import annotations

import sys

import pytest
import torch

from harness.measure import mutations
from harness.measure.job import measure
from harness.modes import MODES, ModeSpec
from harness.modes.base import DecodeMode, Stepper
from tests.support import FAST, run_config

pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def test_a_rewind_one_slot_off_fails_the_run(monkeypatch):
    """K/V written one slot too far after every rewind: the run, eager's references and the fp32 calibration
    would all be rewound alike; the write position, counted from the prompt, is not. The real Stepper.rewind runs in
    both jobs: as it is (the run must pass), and asked through the mutation registry to rewind one slot past the
    context (the run must fail, naming the slot)."""
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "repeats=2")
    clean = measure(cfg)
    assert clean.failure is None and clean.metrics["verified"] == 1.0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "rewind_one_slot_off")
    result = measure(cfg)
    assert result.failure is not None and result.metrics["verified"] == 0.0
    assert result.failure.startswith("after a rewind the cache writes at slot 9, not after the 8 context tokens")


def test_a_loop_that_records_its_input_token_not_its_argmax_fails_the_run(monkeypatch):
    """Every token the loop records (warm-up and every timed block) is checked against the logits its call returned.
    A loop that records what a call read instead of the argmax it fed on, put in the loop's own recording through the
    mutation registry: on the untied tiny model a timed loop with this very fault passed every other check."""
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "decode_tokens=16", "model.tie_word_embeddings=false")
    clean = measure(cfg)
    assert clean.failure is None and clean.metrics["recorded_tokens_argmax"] == 1.0
    assert clean.metrics["recorded_tokens_checked"] == (2 + 16) * 2  # each call of the warm-up and the block, each row
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "input_token_recorded")
    result = measure(cfg)
    assert result.metrics["verified"] == 0.0 and result.metrics["recorded_tokens_argmax"] == 0.0
    assert result.failure.startswith("the token recorded for call 0 of the warm-up is not an argmax of the logits "
                                     "that call returned"), result.failure


class TwoTokenStepper(Stepper):
    """Two greedy steps a call, argmax and feeding inside (as a K-step graph does)."""

    tokens_per_step, feeds_itself = 2, True

    def step(self):
        rows = []
        for _ in range(2):
            logits = self.forward()[: self.bs]
            self.input_ids.copy_(logits.argmax(dim=-1, keepdim=True))
            rows.append(self.input_ids[:, 0].clone())
        self.tokens = torch.stack(rows)
        return logits


class LastTokenOnlyStepper(TwoTokenStepper):
    """Two steps a call that show only the last step's token: the first step's is lost to every check."""

    def step(self):
        logits = super().step()
        self.tokens = self.tokens[-1:]
        return logits


class RunnerUpFirstStepper(TwoTokenStepper):
    """Two steps a call whose first step feeds its second-best token (an argmax inside the graph gone wrong),
    shown as it is: every call's returned logits follow their history, only the tokens inside a call are wrong."""

    def step(self):
        rows = []
        for index in range(2):
            logits = self.forward()[: self.bs]
            self.input_ids.copy_(logits.topk(2 - index, dim=-1).indices[:, -1:])
            rows.append(self.input_ids[:, 0].clone())
        self.tokens = torch.stack(rows)
        return logits


def inexact_two_token_mode(monkeypatch, stepper: type) -> str:
    """A throwaway mode=inexact-two (other kernels than eager's, two tokens a call) whose stepper is `stepper`."""
    class InexactTwoTokenMode(DecodeMode):
        name, exact = "inexact-two", False

        def prepare(self, model, prompt, cfg):
            return stepper(model, prompt, cfg.cache_len, prefill=False)

    monkeypatch.setattr(sys.modules[__name__], "InexactTwoTokenMode", InexactTwoTokenMode, raising=False)
    monkeypatch.setitem(MODES, "inexact-two", ModeSpec("inexact-two", f"{__name__}:InexactTwoTokenMode", graph_steps=True))
    return "mode=inexact-two"


def test_a_run_no_check_applies_to_is_failed_not_verified(monkeypatch):
    mode = inexact_two_token_mode(monkeypatch, LastTokenOnlyStepper)
    result = measure(run_config(*FAST, mode, "device=cpu", "dtype=fp32"))
    assert result.metrics["verified"] == 0.0 and result.metrics["checks_applied"] == 0.0
    assert result.failure.startswith("no check applies: mode=inexact-two computes with other kernels")


def test_an_inexact_mode_of_two_tokens_a_call_is_judged_against_fp32_step_by_step(monkeypatch):
    mode = inexact_two_token_mode(monkeypatch, TwoTokenStepper)
    result = measure(run_config(*FAST, mode, "device=cpu", "dtype=fp32", "model.tie_word_embeddings=false"))
    assert result.failure is None and result.metrics["verified"] == 1.0
    assert result.metrics["checks_applied"] == 1.0 and result.metrics["fp32_max_logit_err"] < 1e-3


def test_a_wrong_token_inside_a_call_of_two_steps_fails_the_run(monkeypatch):
    mode = inexact_two_token_mode(monkeypatch, RunnerUpFirstStepper)
    result = measure(run_config(*FAST, mode, "device=cpu", "dtype=fp32", "model.tie_word_embeddings=false"))
    assert result.metrics["verified"] == 0.0
    assert result.failure.startswith("the token the run decoded at step 0 (inside a call of several) ranks ")


def test_every_applicable_check_is_counted():
    plain = measure(run_config(*FAST, "device=cpu", "dtype=fp32")).metrics  # eager's, sdpa: the reference kernels
    flex = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "attn=flex", "cache_len=128")).metrics
    assert (plain["checks_applied"], plain["verified"]) == (1.0, 1.0) and "fp32_max_logit_err" not in plain
    assert (flex["checks_applied"], flex["verified"]) == (2.0, 1.0) and "fp32_max_logit_err" in flex
    # flex's read plan checked at every verified position; sdpa has none to check (not applied, not passed)
    assert flex["read_plan_positions_checked"] == flex["verified_steps"] and "read_plan_positions_checked" not in plain


@pytest.mark.parametrize("context", [8, 128])
def test_flex_planning_one_block_short_fails_the_run(monkeypatch, context):
    """flex's block count one short where the position is a multiple of 128. On a CPU flex's unfused path reads
    every block whatever the count, so the logits stay right and only the check of its read plan sees the fault:
    at context 8 the verified window reaches slot 128, at context 128 it starts there. The real planner
    (decode_block_mask) runs: as it is, the run passes with its plan checked at slot 128; asked through the mutation
    registry for the position before (ceil(position / 128) blocks: one short at a block's first slot, the same
    count elsewhere), the run fails there."""
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "attn=flex", f"context_len={context}", "cache_len=256")
    if context == 128:  # (at context 8 test_every_applicable_check_is_counted runs the clean job across slot 128)
        clean = measure(cfg)
        assert clean.failure is None and clean.metrics["read_plan_positions_checked"] == clean.metrics["verified_steps"]
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "read_plan_one_behind")
    result = measure(cfg)
    assert result.metrics["verified"] == 0.0
    assert result.failure.startswith("attn=flex plans to read 128 slots for the token at slot 128, short of its 129 "
                                     "valid ones"), result.failure
    with pytest.raises(ValueError, match="attn=sdpa makes none; use attn=flex"):  # where it could not act: refused
        mutations.requested("eager", "sdpa")


def test_the_decode_metrics_are_what_the_step_times_give_by_hand():
    """Two timed blocks of a bs=4 run, 3 calls each (one token a call): every derived number worked out by hand.
    A step is one call of all bs rows; tokens count every row (a per-call time divided by bs, or tokens/s not
    multiplied by it, fails here)."""
    from harness.measure.stats import decode_metrics
    from harness.measure.timing import DecodeTiming

    blocks = [DecodeTiming([1.0, 2.0, 3.0], 10.0, "host", 1, torch.empty(0)),
              DecodeTiming([2.0, 2.0, 2.0], 8.0, "host", 1, torch.empty(0))]
    m = decode_metrics(blocks, bs=4)
    assert m["step_ms_median"] == 2.0 and m["step_ms_mean"] == pytest.approx(2.0) and m["step_ms_max"] == 3.0
    assert m["tokens_per_s"] == pytest.approx(4 * 1000 / 2.0)  # 4 rows every 2 ms
    assert m["wall_ms_per_step"] == pytest.approx(18.0 / 6)  # per decode step (6 steps in 18 ms of wall)
    assert m["tokens_per_s_wall"] == pytest.approx(4 * 1000 / 3.0)
    assert m["wall_minus_gpu_ms_per_step"] == pytest.approx(3.0 - 12.0 / 6)  # wall less the timed 12 ms, per step
    assert (m["block_0_step_ms_median"], m["block_1_step_ms_median"], m["decode_wall_ms"]) == (2.0, 2.0, 18.0)
    # a K-step graph: one sample per call, its time divided by K, so its tokens are not counted K times
    k_step = decode_metrics([DecodeTiming([1.0, 1.0], 5.0, "host", 2, torch.empty(0))], bs=1)
    assert k_step["step_ms_median"] == 1.0 and k_step["wall_ms_per_step"] == pytest.approx(5.0 / 4)
    assert k_step["wall_minus_gpu_ms_per_step"] == pytest.approx(5.0 / 4 - 4.0 / 4)
    assert m["timed_over_wall_max"] == pytest.approx(max(6.0 / 10.0, 6.0 / 8.0))  # each block's timed ms / its wall
    assert k_step["timed_over_wall_max"] == pytest.approx(4.0 / 5.0)  # 2 calls x 2 tokens x 1 ms in 5 ms


def test_timed_calls_that_outrun_their_wall_clock_fail_the_run():
    """The cross-check on every run: a block's timed calls lie inside its wall clock. Bugs caught: a K-step call's
    time counted per token but summed per call twice (x K), events read on another stream, ms taken for s."""
    from harness.measure.stats import clock_failure, decode_metrics
    from harness.measure.timing import DecodeTiming

    honest = decode_metrics([DecodeTiming([1.0, 1.0], 4.02, "cuda_event", 2, torch.empty(0))], bs=1)
    assert clock_failure(honest) is None  # 4 ms of calls in 4.02 ms of wall
    outrun = decode_metrics([DecodeTiming([1.0, 1.0], 3.5, "cuda_event", 2, torch.empty(0))], bs=1)
    assert "add up to 1.143x the block's wall clock" in clock_failure(outrun)
    run = measure(run_config(*FAST, "device=cpu"))  # a real run's clocks agree, and it passes
    assert run.failure is None and 0 < run.metrics["timed_over_wall_max"] <= 1.0
