"""The timed loop (harness/measure/timing.py): a step's time and the warm-up's pace."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.measure.timing import warm_up
from harness.modes.eager import EagerStepper
from tests.support import tiny_fp32


class _FakeClock:
    """The host clock the timed loop reads (time.perf_counter), advanced only by the steps themselves: a step time
    worked out by hand, whatever the machine's load."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_ms_per_step_is_the_time_of_a_call_of_every_row(monkeypatch):
    """A call of a bs=4 eager stepper that takes 3 ms on the loop's clock is 3 ms a step, at the point the loop
    computes it (timing.timed_decode). Bug caught: the call's time divided by bs (0.75 ms: a step read as a token of
    one row)."""
    from harness import models
    from harness.measure import timing
    from harness.modes.eager import EagerStepper
    from tests.support import FAST, run_config

    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=4")
    model = models.get_model(cfg.model, "fp32", "sdpa", torch.device("cpu"), 0).model
    clock = _FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    with torch.inference_mode():
        stepper = EagerStepper(model, torch.randint(0, 1000, (4, 8), generator=torch.Generator().manual_seed(0)), 64)
        step = stepper.step

        def three_ms_call():
            clock.now += 0.003
            return step()

        stepper.step = three_ms_call
        block = timing.timed_decode(stepper, 5, torch.device("cpu"))
    assert block.step_ms == pytest.approx([3.0] * 5) and block.tokens.shape == (5, 4)
    assert block.wall_ms == pytest.approx(15.0) and block.n_tokens == 5


def test_the_warm_ups_pace_is_its_second_half_so_a_slow_first_call_does_not_cut_a_block(monkeypatch):
    """On the clock the warm-up reads (harness.clock's, stood in for so that a loaded machine cannot move it), a first
    call of 500 ms (a late compile) and nine of 2 ms: the pace is the second half's, 2 ms a step. Bugs caught: the
    mean of all ten calls (51.8 ms), the first half's (101.6 ms)."""
    from harness import clock

    now = [0.0]
    monkeypatch.setattr(clock, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    _, model, prompt = tiny_fp32()
    stepper = EagerStepper(model, prompt, 64)
    step, calls = stepper.step, []

    def timed_call():
        calls.append(1)
        now[0] += 0.5 if len(calls) == 1 else 0.002
        return step()

    stepper.step = timed_call
    with torch.inference_mode():
        tokens, pace_ms = warm_up(stepper, 10, torch.device("cpu"))
        assert tokens.shape == (10, 2) and len(calls) == 10 and pace_ms == pytest.approx(2.0)
        assert warm_up(stepper, 1, torch.device("cpu"))[1] is None  # one call: no second half to time
