"""A job's path, read from what it reports: build, prepare, prefill, warm up, time, verify, in that order; and the
references it keeps around its timed loop (references.JobReferences), however many blocks that loop times."""
import pytest

from harness.measure import lockstep, references
from harness.measure.job import measure
from tests.support import FAST, run_config

SHAPE = [*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false"]


@pytest.mark.slow
def test_a_job_runs_its_six_phases_in_order():
    """Every block is timed after the warm-up and before verification, which runs once, last. Bugs caught: a phase
    moved out of order (the verification between two timed blocks, the warm-up before the prefill), or a block
    timed twice or not at all where the first is timed apart from the rest."""
    seen = []
    result = measure(run_config(*SHAPE, "repeats=2", "stop=repeats"), on_phase=seen.append)
    assert result.failure is None and result.metrics["repeats"] == 2 and len(result.step_ms) == 2 * 8
    assert seen == ["build", "prepare", "prefill", "warmup", "decode (block 1, at most 2)",
                    "decode (block 2, at most 2)", "verify"]
    assert result.mode_tags["stopped_by"].startswith("repeats: 2 blocks")


@pytest.mark.slow
def test_plain_eagers_loop_is_its_reference_when_more_blocks_follow_the_first(monkeypatch):
    """The warm-up and the first timed block are kept as plain eager's own reference (their logits taken between
    calls, kept once that block ends, before the next is timed), and serve its check with no eager step decoded
    again. Bugs caught: the first block timed without keeping its logits (more tokens than logits: no reference),
    or the loop kept only where one block is timed (eager decoded again)."""
    passes = []
    monkeypatch.setattr(lockstep, "_token_gaps", lambda *a, **kw: passes.append(1))  # the eager pass it replaces
    start = references.hits["computed"]
    result = measure(run_config(*SHAPE, "warmup=2", "decode_tokens=32", "repeats=3", "stop=repeats"))
    assert result.failure is None and result.metrics["repeats"] == 3 and result.metrics["tokens_match"] == 1.0
    assert passes == [] and references.hits["computed"] == start and result.metrics["max_logit_diff"] == 0.0
    assert result.metrics["decoded_tokens_checked"] == 2 * 34  # the warm-up's 2 and the first block's 32, both rows
