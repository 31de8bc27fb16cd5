"""Timing's statistics (harness/measure/stats.py): step stats, the decode metrics, when a job's timing stops, the
intervals; worked out by hand from fixed inputs."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.measure.job import measure
from harness.measure.stats import (paired_ratio_interval, step_stats, MIN_BLOCK_STEPS, MIN_BLOCKS, block_steps,
    stop_reason)
from tests.support import run_config, FAST


def test_the_interval_of_the_median_resamples_every_block():
    """Two blocks, steps of 1 ms in the first and 3 ms in the second: the two-level bootstrap draws either block
    twice (a median of 1 or 3) a quarter of the time each, so its 95% interval is 1 to 3 ms. Bug caught: the
    interval of the first block alone (1 to 1: a run that drifted between blocks reported as steady)."""
    from harness.measure.stats import decode_metrics
    from harness.measure.timing import DecodeTiming

    blocks = [DecodeTiming([1.0] * 4, 4.0, "host", 1, torch.empty(0)),
              DecodeTiming([3.0] * 4, 12.0, "host", 1, torch.empty(0))]
    m = decode_metrics(blocks, bs=1)
    assert m["step_ms_median"] == 2.0 and (m["step_ms_ci_low"], m["step_ms_ci_high"]) == (1.0, 3.0)
    assert m["step_ms_ci_pct"] == pytest.approx(50.0)


@pytest.mark.slow  # 2000 draws of 40 pairs
def test_pairs_from_several_processes_are_drawn_process_by_process():
    """Four processes, each with B / A constant inside it (1.0, 1.1, 1.2 and 1.3: a compile's choice per process).
    Drawn process by process, the interval spans what a fifth process could show; drawn as 40 pairs of one process
    (the bug: the processes' pairs pooled), it would claim 1.1-1.2."""
    blocks_a = [[1.0] * 5] * 40
    blocks_b = [[ratio] * 5 for ratio in (1.0, 1.1, 1.2, 1.3) for _ in range(10)]
    owners = [process for process in range(4) for _ in range(10)]
    assert paired_ratio_interval(blocks_a, blocks_b, processes=owners)[1:] == pytest.approx((1.0, 1.3))
    assert paired_ratio_interval(blocks_a, blocks_b)[1:] == pytest.approx((1.1, 1.2))


def test_the_ratio_interval_keeps_the_pairs():
    """A drifts from 1 to 2 ms between its blocks, and B is 10% slower than A in each pair (it ran beside it). The
    paired bootstrap sees exactly 1.1; drawing A's and B's blocks apart (the bug) would mix a 1 ms block of A with a
    2.2 ms block of B and give an interval from 0.55 to 2.2."""
    blocks_a = [[1.0] * 5, [2.0] * 5, [1.0] * 5, [2.0] * 5]
    blocks_b = [[1.1] * 5, [2.2] * 5, [1.1] * 5, [2.2] * 5]
    ratio, low, high = paired_ratio_interval(blocks_a, blocks_b)
    assert ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)
    with pytest.raises(ValueError, match="paired blocks: 4 of A against 3 of B"):
        paired_ratio_interval(blocks_a, blocks_b[:3])


@pytest.mark.usefixtures("fresh_model_cache")
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


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
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


@pytest.mark.usefixtures("fresh_model_cache")
def test_step_stats_on_known_values():
    s = step_stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s["median"] == 3.0 and s["mean"] == 4.0 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["stdev"] == pytest.approx(3.5355339, rel=1e-6)
    assert s["cv"] == pytest.approx(3.5355339 / 4.0, rel=1e-6)
    assert s["p90"] == pytest.approx(7.6)


STEADY = [[1.000, 1.001, 0.999, 1.000] * 8, [1.000, 1.000, 1.001, 0.999] * 8]  # a graphed run: ±0.1% at most


NOISY = [[1.0, 1.4, 0.8, 1.9] * 8, [1.6, 0.9, 1.2, 1.0] * 8]  # a host-bound eager run


def _rule(stop="adaptive", repeats=5, target_ci_pct=0.5, time_budget_s=10.0):
    return SimpleNamespace(stop=stop, repeats=repeats, target_ci_pct=target_ci_pct, time_budget_s=time_budget_s)


def test_the_interval_rule_stops_a_steady_run_after_two_blocks_and_never_after_one():
    assert stop_reason(_rule(), STEADY[:1], spent_s=1.0, next_block_s=1.0) is None  # one block cannot see drift
    why = stop_reason(_rule(), STEADY, spent_s=2.0, next_block_s=1.0)
    assert MIN_BLOCKS == 2 and why.startswith("interval: ±") and why.endswith("after 2 blocks, within target_ci_pct=0.5")
    assert stop_reason(_rule(), NOISY, spent_s=2.0, next_block_s=1.0) is None  # ±10% or more: time another


def test_the_budget_stops_before_a_block_that_would_pass_it_not_after():
    assert stop_reason(_rule(time_budget_s=3.0), NOISY[:1], spent_s=1.5, next_block_s=1.4) is None  # 2.9 s fits
    why = stop_reason(_rule(time_budget_s=3.0), NOISY, spent_s=2.9, next_block_s=1.4)
    assert why == ("time budget: a block more would take the timed decode from 2.9 s to about 4.3 s, "
                   "past time_budget_s=3")


def test_repeats_caps_the_adaptive_rule_and_alone_times_exactly_that_many_blocks():
    assert stop_reason(_rule(repeats=2), NOISY, spent_s=0.1, next_block_s=0.1) == "repeats: 2 blocks (repeats=2)"
    fixed = _rule(stop="repeats", repeats=3, time_budget_s=0.001)
    assert stop_reason(fixed, STEADY, spent_s=100.0, next_block_s=100.0) is None  # neither interval nor budget
    assert stop_reason(fixed, STEADY + STEADY[:1], 100.0, 100.0) == "repeats: 3 blocks (repeats=3)"


def _pace(stop="adaptive", decode_tokens=128, time_budget_s=5.0, graph_steps=1):
    return SimpleNamespace(stop=stop, decode_tokens=decode_tokens, time_budget_s=time_budget_s, graph_steps=graph_steps)


def test_a_block_holds_what_the_budget_does_at_the_warm_ups_pace_and_never_fewer_than_the_checks_compare():
    assert block_steps(_pace(), pace_ms=30.0) == (128, None)  # a host-bound eager step: a whole block fits
    steps, why = block_steps(_pace(), pace_ms=48.0)  # 5 s hold 104 steps of 48 ms
    assert steps == 104 and why == ("104 steps a block, not decode_tokens=128: at the warm-up's 48.0 ms a step, "
                                    "time_budget_s=5 holds 104")
    assert block_steps(_pace(), pace_ms=330.0)[0] == MIN_BLOCK_STEPS == 32  # 15 fit; a median wants 32
    assert block_steps(_pace(), pace_ms=330.0, at_least=121)[0] == 121  # a block edge the lockstep reaches
    assert block_steps(_pace(graph_steps=3), pace_ms=330.0)[0] == 33  # whole calls of a 3-step graph
    assert block_steps(_pace(stop="repeats"), pace_ms=330.0) == (128, None)  # exactly what was asked
    assert block_steps(_pace(), pace_ms=None) == (128, None)  # a warm-up of one call or none has no pace: no cut


def test_a_block_is_cut_to_the_kept_loop_of_its_shape_where_that_loop_is_shorter_and_no_rule_forbids_it():
    # a graphed job after an eager one whose slow steps cut its block to 73: 73 steps, so that eager's loop serves
    steps, why = block_steps(_pace(), pace_ms=12.8, at_least=22, reference_steps=73)
    assert steps == 73 and why == ("73 steps a block, not 128: as many as the loop of an earlier job of this shape "
                                   "decoded, whose logits serve as this run's reference")
    assert block_steps(_pace(), pace_ms=48.0, at_least=22, reference_steps=73)[0] == 73  # shorter than the budget's 104
    assert block_steps(_pace(), pace_ms=12.8, reference_steps=128) == (128, None)  # as long already
    assert block_steps(_pace(), pace_ms=330.0, reference_steps=73)[0] == 32  # the budget's cut is shorter: it stands
    assert block_steps(_pace(), pace_ms=12.8, reference_steps=31)[0] == 128  # under MIN_BLOCK_STEPS: no cut
    assert block_steps(_pace(), pace_ms=12.8, at_least=40, reference_steps=35)[0] == 128  # under what the lockstep needs
    assert block_steps(_pace(graph_steps=4), pace_ms=12.8, reference_steps=73)[0] == 128  # not whole 4-step calls
    assert block_steps(_pace(stop="repeats"), pace_ms=12.8, reference_steps=73) == (128, None)
