"""What a new user meets in the first hour on a CPU machine (issue: CPU numbers off by two orders of magnitude
under torch's default threads, a set-up command ending in exit 1, Hydra's own errors, folders that cannot be
written, names that lose their distinguishing key, and the smaller defects). Each test is named by the behaviour
it guards."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from harness.config.schema import ConfigError
from harness.measure.environment import running_threads, usable_cores
from harness.measure.job import measure
from support import FAST, REPO, run_config


@pytest.fixture
def torch_threads():
    """torch's thread count restored after the test (a job sets its own)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


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


def test_cpu_threads_sets_the_jobs_threads(torch_threads):
    torch.set_num_threads(1)
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "cpu_threads=2"))
    assert result.environment["torch_threads"] == "2"


def test_cpu_threads_below_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^cpu_threads=0 is invalid: it must be >= 1") as err:
        run_config("cpu_threads=0")
    assert "\n" not in str(err.value)


def result_label(threads: int) -> str:
    return run_config(*FAST, "device=cpu", "dtype=fp32", f"cpu_threads={threads}").label


def test_more_threads_than_the_usable_cores_warn_and_mark_the_run_noisy(torch_threads, capsys):
    threads = usable_cores() + 1
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", f"cpu_threads={threads}"))
    reason = f"cpu_threads={threads} exceeds the {usable_cores()} cores this process may use"
    assert reason in result.mode_tags["noisy"]
    assert f"warning: {result_label(threads)}: {reason}" in capsys.readouterr().err
    assert "cpu_load" in result.metrics


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
