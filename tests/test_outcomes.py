"""Truthful outcomes: what cannot run is refused in one line before anything is created; what ran says where its
result went; what moves a CPU's numbers is recorded."""
from __future__ import annotations

import pytest

import json

import torch

from harness.cli.precheck import check_store_uri
from harness.errors import ConfigError
from harness.measure.job import measure, token_repeat_fraction
from tests.support import FAST, run_config, run_harness


def test_the_repeat_fraction_counts_steps_that_repeat_the_previous_token():
    tokens = torch.tensor([[1, 5], [1, 6], [2, 6], [2, 6], [3, 7]])  # [steps, rows]: 4 of 8 steps repeat
    assert token_repeat_fraction(tokens) == pytest.approx(4 / 8)
    assert token_repeat_fraction(tokens[:1]) == 0.0


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_random_tiny_model_decodes_a_varied_sequence():
    """Seeded random weights at 2/sqrt(hidden): greedy decode moves on (at std 0.02 it repeated every token)."""
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "bs=2", "decode_tokens=32"))
    assert result.metrics["token_repeat_fraction"] <= 0.1
    assert result.weights_source == "seed=0 std=0.25"


@pytest.mark.parametrize("uri, says", [
    ("foo://bar", "tracking.uri=foo://bar is not a store MLflow can use"),
    ("http://host:5000/?token=abc", "carries a secret in its query string"),
])
def test_a_store_uri_that_cannot_work_is_refused(uri, says):
    with pytest.raises(ConfigError, match=says):
        check_store_uri(uri)
    check_store_uri("sqlite:////tmp/x.db")  # what MLflow takes passes
    check_store_uri("http://127.0.0.1:5000")


@pytest.mark.e2e
@pytest.mark.parametrize("overrides, says", [
    (["bs=0"], "harness: bs=0 is invalid: the batch size must be >= 1"),
    (["cache_len=10"], "harness: cache_len=10 is too short"),
    (["buckets=[4,2]"], "harness: buckets=[4, 2] is invalid"),
    (["model=qwen3-06b"], "harness: In 'config': Could not find 'model/qwen3-06b' Available options in 'model':"),
    (["bs=abc"], "could not be converted to Integer"),
    (["model=tiny", "context_len=100000"], "context_len=100000 is too long for model=tiny"),
    (["bs=1000000", "device=cpu"], "KV cache for model=qwen3-0.6b in bf16, more than the"),
    (["tracking.uri=foo://bar"], "is not a store MLflow can use"),
])
def test_a_bad_run_is_refused_in_one_line_before_anything_is_created(workdir, overrides, says):
    proc = run_harness(*overrides, cwd=workdir)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert list(workdir.iterdir()) == []  # no store, no outputs folder


@pytest.mark.e2e
def test_the_threads_that_move_a_cpu_run_are_recorded(workdir):
    proc = run_harness(*FAST, "device=cpu", cwd=workdir, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = (workdir / "outputs").glob("**/result.json")
    env = json.loads(result.read_text())["environment"]
    assert env["OMP_NUM_THREADS"] == "1" and env["torch_threads"] == "1" and "torch_interop_threads" in env
