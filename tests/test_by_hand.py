"""Derived figures worked out by hand from fixed inputs: speedups and their intervals, energy per token, the
speed-of-light floor. Each names the plausible bug it catches."""
from __future__ import annotations

import pytest
import torch

from harness.analysis.summary import speedup_intervals, speedups
from harness.measure.gpu_state import GpuState
from harness.measure.roofline import floor


def _row(run_id: str, mode: str, median: float, low: float, high: float, bs: int = 1) -> dict:
    return dict(id=run_id, name=run_id, status="FINISHED", reason="", mode=mode, variant=mode, model="tiny", bs=bs,
                context_len=8, cache_len=64, dtype="bf16", median_ms=median, ci_low=low, ci_high=high)


def test_a_speedup_and_its_interval_by_hand():
    """eager 10 ms (9-11), graphed 2 ms (1.9-2.1): 5x, and conservatively 9/2.1 to 11/1.9. Bugs caught: the ratio
    upside down (0.2x), the interval's ends paired the optimistic way (9/1.9 to 11/2.1), a speedup taken against
    the eager run of another bs."""
    rows = [_row("e1", "eager", 10.0, 9.0, 11.0), _row("g1", "graphed", 2.0, 1.9, 2.1),
            _row("e8", "eager", 40.0, 39.0, 41.0, bs=8), _row("g8", "graphed", 4.0, 3.9, 4.1, bs=8)]
    assert speedups(rows) == pytest.approx({"e1": 1.0, "g1": 5.0, "e8": 1.0, "g8": 10.0})
    intervals = speedup_intervals(rows)
    assert intervals["g1"] == pytest.approx((9.0 / 2.1, 11.0 / 1.9))
    assert intervals["e1"] == pytest.approx((9.0 / 11.0, 11.0 / 9.0))  # eager against itself: not exactly 1


def test_energy_per_token_counts_every_row():
    """6 J over 3 blocks of 100 steps at bs=2 is 600 tokens: 0.01 J a token. Bug caught: per step (0.02 J), which
    would make bs=2 look twice as costly per token as it is."""
    state = GpuState(torch.device("cpu"))
    state.handle, state.energy_mj = object(), 6000.0  # as if NVML had read the board's counter around the blocks
    steps, bs = 3 * 100, 2
    assert state.results(steps * bs, {})["energy_j_per_token"] == pytest.approx(0.01)


def test_the_floor_is_the_slower_of_memory_and_compute():
    """2.125 GB at 4.25 TB/s is 0.5 ms; 1 TFLOP at 1000 TFLOP/s is 1 ms: the floor is 1 ms, compute-bound. Bugs
    caught: the faster of the two taken (0.5), bytes read as GB or FLOP/s as TFLOP/s (a floor off by 1e3)."""
    ceilings = {"copy_bytes_per_s": 4.25e12, "bf16_flops_per_s": 1e15}
    assert floor({"step_bytes": 2.125e9, "step_flops": 1e12}, ceilings) == pytest.approx(
        {"floor_ms": 1.0, "floor_memory_ms": 0.5, "floor_compute_ms": 1.0})
    assert floor({"step_bytes": 2.125e9, "step_flops": 1e11}, ceilings)["floor_ms"] == pytest.approx(0.5)
