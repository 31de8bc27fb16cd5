"""GPU tests of the machine's fingerprint. Skipped where there is no CUDA."""
from __future__ import annotations

import pytest

from harness.measure.job import measure
from tests.support import FAST, gpu, run_config


pytestmark = [pytest.mark.gpu, gpu]


def test_a_gpu_run_logs_its_machines_fingerprint():
    """Copy bandwidth, an empty kernel's launch, a graph of 100 of them and the SM clock under load, each with its
    spread: in the range an H200 (4.8 TB/s HBM3e, microsecond launches) can give."""
    env = measure(run_config(*FAST, "mode=graphed")).environment
    copy, launch, graph = (float(env[f"fingerprint_{k}"]) for k in ("copy_gb_per_s", "launch_us", "graph100_us"))
    assert 500 < copy < 10000 and 0.5 < launch < 50 and graph < 100 * launch  # a graph's kernels launch cheaper
    assert all(float(env[f"fingerprint_{k}_spread_pct"]) >= 0 for k in ("copy_gb_per_s", "launch_us", "graph100_us"))
    if "fingerprint_sm_clock_under_load_mhz" in env:  # where nvidia-ml-py is installed
        assert 500 < float(env["fingerprint_sm_clock_under_load_mhz"]) < 3000
