"""GPU tests: run on the H200 (`pytest -m gpu`); skipped where there is no CUDA."""
from __future__ import annotations

import pytest
import torch

from harness import models
from harness.job import measure
from tests.conftest import gpu, run_config

pytestmark = [pytest.mark.gpu, gpu]
QWEN = ("model=qwen3-0.6b", "cache_len=256", "decode_tokens=64")


@pytest.mark.parametrize("bs", [1, 8])
def test_graphed_tokens_equal_eager_tokens(bs):
    result = measure(run_config(*QWEN, f"bs={bs}", "mode=graphed"))
    assert "failure" not in result
    assert result["metrics"]["tokens_match"] == 1.0
    assert result["environment"]["gpu_name"]


def test_graphed_is_faster_than_eager():
    eager = measure(run_config(*QWEN, "mode=eager"))["metrics"]["step_ms_median"]
    graphed = measure(run_config(*QWEN, "mode=graphed"))["metrics"]["step_ms_median"]
    print(f"eager {eager:.3f} ms/step, graphed {graphed:.3f} ms/step")
    assert graphed < eager


def test_memory_returns_to_the_post_load_baseline_between_jobs():
    models.release_models()
    first = measure(run_config(*QWEN, "bs=8", "mode=graphed"))
    baseline = torch.cuda.memory_allocated()
    second = measure(run_config(*QWEN, "bs=4", "mode=graphed", "cache_len=4096"))
    assert torch.cuda.memory_allocated() == baseline
    for result in (first, second):
        m = result["metrics"]
        assert m["mem_returned_to_baseline"] == 1.0 and m["mem_leaked_mb"] <= 0
        assert m["graph_mem_mb"] > 0 and m["peak_mem_allocated_mb"] > m["mem_baseline_mb"]
    assert second["metrics"]["mem_baseline_mb"] == pytest.approx(baseline / 2**20)
