"""What moves a CPU's numbers (harness/measure/environment.py): the job's threads, a loaded machine, the GPU it ran
on and the switches set in the environment."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from harness.measure.environment import running_threads, usable_cores
from harness.measure.job import measure
from tests.support import FAST, run_config


@pytest.mark.slow
def test_a_cpu_job_times_on_one_thread_by_default_whatever_torch_had(torch_threads):
    """torch's default uses every core; a CPU step of small kernels then times the scheduler. A job sets
    cpu_threads (default 1) before it builds anything, and logs it."""
    torch.set_num_threads(2)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32")
    assert cfg.cpu_threads == 1
    result = measure(cfg)
    assert torch.get_num_threads() == 1
    assert result.environment["torch_threads"] == "1"
    assert result.mode_tags["cpu_cores"] == f"{usable_cores()} of {os.cpu_count()}"


@pytest.mark.slow
def test_cpu_threads_sets_the_jobs_threads(torch_threads):
    torch.set_num_threads(1)
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "cpu_threads=2"))
    assert result.environment["torch_threads"] == "2"


def result_label(threads: int) -> str:
    return run_config(*FAST, "device=cpu", "dtype=fp32", f"cpu_threads={threads}").label


@pytest.mark.slow
def test_more_threads_than_the_usable_cores_warn_and_mark_the_run_noisy(torch_threads, capsys):
    threads = usable_cores() + 1
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", f"cpu_threads={threads}"))
    reason = f"cpu_threads={threads} exceeds the {usable_cores()} cores this process may use"
    assert reason in result.mode_tags["noisy"]
    assert f"warning: {result_label(threads)}: {reason}" in capsys.readouterr().err
    assert "cpu_load" in result.metrics


@pytest.mark.slow
@pytest.mark.skipif(running_threads() is None, reason="the kernel does not report procs_running (/proc/stat)")
def test_a_machine_loaded_past_its_free_cores_while_timing_warns_and_marks_the_run_noisy(torch_threads, capsys):
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1) + 1)]
    try:
        time.sleep(0.5)  # every spinner started
        result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "stop=repeats", "repeats=2"))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    assert "the machine's load" in result.mode_tags["noisy"]
    assert result.metrics["cpu_load"] > os.cpu_count()
    assert "warning: " in capsys.readouterr().err


@pytest.mark.usefixtures("fresh_model_cache")
def test_the_physical_gpu_is_found_through_cuda_visible_devices(monkeypatch):
    from harness.measure.gpu_state import _visible_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # as SLURM binds two GPUs to a job
    assert _visible_gpu(0) == "3" and _visible_gpu(1) == "5" and _visible_gpu(2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9859b9d6-b2f2-30f8-6d9e-af659d812857")
    assert _visible_gpu(0) == "GPU-9859b9d6-b2f2-30f8-6d9e-af659d812857"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _visible_gpu(1) == "1"


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.slow
def test_tuning_switches_set_in_the_environment_are_recorded(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1")
    monkeypatch.setenv("HARNESS_UNRELATED", "x")
    result = measure(run_config(*FAST, "device=cpu"))
    assert result.environment["TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"] == "1"
    assert "HARNESS_UNRELATED" not in result.environment
