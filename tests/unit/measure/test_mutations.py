"""The harness's mutation registry (harness/measure/mutations.py): every injected fault fails the run."""
from __future__ import annotations

import pytest

from harness.measure import references
from harness.measure.job import measure
from tests.support import FAST, run_config

pytestmark = pytest.mark.usefixtures("fresh_model_cache")


@pytest.mark.parametrize("kind, says", [
    ("kv_lost", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("rope_off_by_one", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("layer_skipped", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("newest_masked", "logits differ from eager's (same kernels, 2 rows) by up to "),
    ("stale_token", "logits differ from eager's (same kernels, 2 rows) by up to "),
])
@pytest.mark.slow
def test_every_injected_mutation_fails_the_run_naming_what_differed(monkeypatch, kind, says):
    # untied embeddings: with tied random weights greedy decode repeats its input token, and a stale
    # token would be the right one
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "model.tie_word_embeddings=false")
    clean = measure(cfg)  # its eager references are kept for the next job of the shape, as in a sweep
    assert clean.failure is None and references.hits["computed"] > 0
    monkeypatch.setenv("HARNESS_INJECT_MUTATION", kind)
    result = measure(cfg)
    assert result.failure is not None and result.failure.startswith(says), result.failure
    assert result.mode_tags["mutation"] == kind and result.metrics["verified"] == 0.0
