"""The measurement itself (harness/measure/job.py), in process, on the tiny model on CPU."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from harness.measure.gpu_state import GpuState
from harness.measure.job import JobError, measure, token_repeat_fraction
from tests.support import FAST, run_config


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_eager_decode_on_cpu_reports_every_number():
    result = measure(run_config(*FAST, "bs=2", "device=cpu"))
    m = result.metrics
    assert len(result.step_ms) == 8 and result.step_clock == "host"
    for key in ("mean", "median", "p90", "p99", "min", "max", "stdev", "cv"):
        assert m[f"step_ms_{key}"] >= 0
    assert m["step_ms_min"] <= m["step_ms_median"] <= m["step_ms_max"]
    assert m["tokens_per_s"] == pytest.approx(2 * 1000 / m["step_ms_median"])
    assert m["wall_ms_per_step"] >= m["step_ms_mean"]
    assert m["prefill_ms"] > 0 and m["warmup_ms"] > 0 and m["build_ms"] > 0
    assert m["prefill_tokens_per_s"] == pytest.approx(2 * 8 / m["prefill_ms"] * 1e3)
    assert m["kv_slots_valid"] == 8 + 2 + 4.5 and m["kv_slots_read"] == 64 and m["waste_factor"] > 1  # FAST: ctx 8, cache 64
    assert result.weights == "random" and result.weights_source == "seed=0 std=0.25"
    assert result.architecture["num_hidden_layers"] == 2
    assert result.environment["device"] == "cpu"
    assert result.failure is None


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_a_sweep_reuses_the_model_it_built():
    first = measure(run_config(*FAST, "device=cpu", "bs=1"))
    second = measure(run_config(*FAST, "device=cpu", "bs=2"))
    assert not first.model_reused and second.model_reused
    assert second.metrics["build_ms"] == 0.0


@pytest.mark.usefixtures("fresh_model_cache")
def test_graphed_without_cuda_fails_with_a_clear_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(JobError, match="mode=graphed needs a CUDA GPU"):
        measure(run_config(*FAST, "mode=graphed"))


@pytest.mark.usefixtures("fresh_model_cache")
def test_profiling_on_the_cpu_says_it_was_skipped():
    phases = []
    result = measure(run_config(*FAST, "device=cpu", "profile=true"), on_phase=phases.append)
    assert result.mode_tags["profile"].startswith("skipped: the profiler pass times CUDA kernels")
    assert any(p.startswith("profile skipped") for p in phases) and "kernels_per_step" not in result.metrics


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


def test_the_repeat_fraction_counts_steps_that_repeat_the_previous_token():
    tokens = torch.tensor([[1, 5], [1, 6], [2, 6], [2, 6], [3, 7]])  # [steps, rows]: 4 of 8 steps repeat
    assert token_repeat_fraction(tokens) == pytest.approx(4 / 8)
    assert token_repeat_fraction(tokens[:1]) == 0.0


@pytest.mark.slow
def test_a_jobs_collection_freezes_what_survives_and_releasing_the_models_frees_it(fresh_model_cache):
    """What a job's collection leaves is frozen (later collections skip it); a cycle among frozen objects that became
    garbage is freed once the models are released, not kept for the process's life."""
    from harness.measure.job import collect_this_jobs_garbage
    from harness.models import release_models

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only a collection frees it
    alive = weakref.ref(a)
    try:
        collect_this_jobs_garbage()
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert alive() is not None  # frozen: a later job's collection does not walk it
        release_models()
        assert gc.get_freeze_count() == 0 and alive() is None
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_a_block_cut_to_the_budget_checks_every_token_it_decoded_and_still_fails_a_fault(monkeypatch):
    cut = ["decode_tokens=48", "cache_len=128", "time_budget_s=0.001", "bs=2", "model.tie_word_embeddings=false"]
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", *cut))
    m = result.metrics
    assert result.failure is None and m["block_steps"] == 32 and len(result.step_ms) == 32 and m["repeats"] == 1
    assert result.mode_tags["block_cut"].startswith("32 steps a block, not decode_tokens=48: at the warm-up's ")
    assert m["decoded_tokens_checked"] == (2 + 32) * 2 and m["tokens_match"] == 1.0 and m["verified_steps"] == 32
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", "stale_token")
    broken = measure(run_config(*FAST, "device=cpu", "dtype=fp32", *cut))
    assert broken.metrics["block_steps"] == 32 and broken.failure.startswith("logits differ from eager's")


@pytest.mark.parametrize("overrides, blocks, rule", [
    (["stop=adaptive", "time_budget_s=0.001"], 1, "time budget: "),
    (["stop=adaptive", "target_ci_pct=1000"], 2, "interval: "),
    (["stop=repeats", "time_budget_s=0.001"], 3, "repeats: 3 blocks"),
])
@pytest.mark.slow
def test_a_job_times_the_blocks_its_rule_asks_for_and_says_which_rule_stopped_it(overrides, blocks, rule):
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "repeats=3", *overrides))
    assert result.failure is None and result.metrics["repeats"] == blocks and len(result.step_ms) == 8 * blocks
    assert result.mode_tags["stopped_by"].startswith(rule)
