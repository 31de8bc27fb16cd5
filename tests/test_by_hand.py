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


class _Board(GpuState):
    """A GPU whose energy counter reads 1200 mJ more at each read (so 1200 mJ a timed block): NVML stood in for on a
    CPU, nothing else of the job."""

    def __init__(self, device):
        super().__init__(device)
        self.handle, self.counter = object(), 0.0

    def read(self, when: str) -> None:
        pass

    def energy(self) -> float:
        self.counter += 1200.0
        return self.counter


def test_the_jobs_energy_per_token_counts_every_row_of_every_block(monkeypatch):
    """A job of 2 timed blocks of 8 steps at bs=3 draws 2.4 J over 48 tokens: 0.05 J a token, as measure() computes
    it. Bugs caught: tokens counted as steps (0.15 J: bs=3 three times as costly per token as it is), one block's
    tokens for both blocks' energy (0.1 J)."""
    from harness.measure import job
    from tests.support import FAST, run_config

    monkeypatch.setattr(job, "GpuState", _Board)
    result = job.measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=3", "repeats=2", "stop=repeats"))
    assert result.failure is None and (result.metrics["repeats"], result.metrics["block_steps"]) == (2.0, 8.0)
    assert result.metrics["energy_j_per_token"] == pytest.approx(2.4 / (2 * 8 * 3))


def _slot_sums(prefix) -> torch.Tensor:
    return torch.stack([t.sum(dim=(0, 1, 3), dtype=torch.float32) for keys, values in prefix for t in (keys, values)])


def test_a_kept_fp32_or_plain_reference_serves_only_the_very_same_context():
    """fp32's and plain eager's references are kept for the next job of a shape, keyed by the prompt, the first
    token, the fed tokens and the context's slot sums. Two contexts of the same prompt and tokens whose K/V differ in
    one slot: the second must get references computed from its own K/V, as a cold start computes them. Bug caught:
    the key without the slot sums (the first context's references served to a context they were not computed from)."""
    from harness.measure import fidelity, references, traces
    from harness.measure.fidelity import ContextCopy
    from harness.modes.eager import EagerStepper
    from tests.support import tiny_fp32

    cfg, model, prompt = tiny_fp32()
    with torch.inference_mode():
        run = EagerStepper(model, prompt, cfg.cache_len)
        trace = traces.free_run(run, 6)
        context = fidelity._context_copy(model, run)
        other = ContextCopy([(k.clone(), v.clone()) for k, v in context.prefix], context.first_ids, context.rows)
        other.prefix[0][0][:, :, 3] += 0.5  # layer 0's keys at slot 3

        def both(ctx: ContextCopy) -> tuple[torch.Tensor, torch.Tensor]:
            sums = _slot_sums(ctx.prefix)
            return (fidelity._plain_reference(model, prompt, cfg, ctx, trace, sums, 1),
                    fidelity._fp32_reference(model, prompt, cfg, ctx, trace, sums))

        first = both(context)
        served = both(other)
        references.forget()
        cold = both(other)
    for kept, fresh, original in zip(served, cold, first):
        assert torch.equal(kept, fresh) and not torch.equal(kept, original)
