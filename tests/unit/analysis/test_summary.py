"""A sweep's summary (harness/analysis/summary.py): speedups and their intervals, energy per token, the time line;
derived figures worked out by hand from fixed inputs."""
from __future__ import annotations

import pytest
import torch

from harness.analysis.summary import speedup_intervals, speedups
from harness.measure.gpu_state import GpuState
from tests.support import eager_only_records


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


def test_an_eager_only_sweep_logs_no_speedup_of_eager_over_itself():
    from harness.analysis.summary import child_speedups, parent_metrics

    metrics = parent_metrics(eager_only_records())
    assert not [k for k in metrics if k.startswith("speedup/")], metrics
    assert {"median_ms/eager/bs1", "median_ms/eager/bs2"} <= metrics.keys()
    assert child_speedups(eager_only_records()) == {}


def test_the_time_line_accounts_for_the_sweep_wall_phases_outside_them_and_between_jobs():
    """The summary's time line: phases summed, then what the jobs spent outside them (job wall less its phases) and
    what the sweep spent between jobs; where jobs ran side by side their walls exceed the sweep's, and no time between
    jobs is made up. A job with no end (killed unrecorded) counts in neither."""
    from harness.analysis.summary import time_breakdown
    from harness.record import JobRecord

    def job(started: str, ended: str, **phases_ms) -> JobRecord:
        return JobRecord(label="j", config={}, started=f"2026-12-04T13:{started}+00:00",
                         ended=ended and f"2026-12-04T13:{ended}+00:00", metrics=phases_ms)

    one_after_another = [job("00:00.000", "00:10.000", decode_wall_ms=6000.0, verify_ms=1500.0),
                         job("00:12.000", "00:20.500", prepare_ms=7000.0, release_ms=500.0),
                         job("00:21.000", "", decode_wall_ms=900.0)]  # no end: in the phase sums, not the walls
    assert one_after_another[0].wall_s == 10.0 and one_after_another[2].wall_s is None
    line = time_breakdown(one_after_another, wall_s=25.0)
    assert line == ("time: sweep wall 25.0 s; in jobs: build 0.0 s, prefill 0.0 s, prepare 7.0 s, warmup 0.0 s, "
                    "decode 6.9 s, verify 1.5 s, release 0.5 s, outside these phases 3.5 s; between jobs 6.5 s")
    side_by_side = [job("00:00.000", "00:10.000", decode_wall_ms=9000.0), job("00:01.000", "00:11.000")]
    assert time_breakdown(side_by_side, wall_s=12.0).endswith(
        "outside these phases 11.0 s; 20.0 s of job walls, side by side")
    assert time_breakdown(one_after_another).endswith("outside these phases 3.5 s")  # no sweep wall: no gap
