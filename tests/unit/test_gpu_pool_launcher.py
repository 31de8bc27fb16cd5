"""hydra/launcher=gpus (hydra_plugins/harness_gpu_pool): a job whose process died gives its slot back. The sweep
through the real launcher and its processes is tests/e2e/test_gpu_pool.py; there, submitit reports a dead process
only after waiting seconds for its result, and the finished jobs may not need the slot by then."""
from __future__ import annotations

import queue
import threading

import submitit
from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from harness.cli import plugin_api
from hydra_plugins.harness_gpu_pool.gpu_pool_launcher import RESULT_WAIT_S, GpuPoolLauncher


class _DiedExecutor:
    """submitit's LocalExecutor, whose job's process died before it wrote a result (SIGKILL, a segfault)."""

    def __init__(self, folder):
        self.folder = folder

    def update_parameters(self, **parameters):
        self.parameters = parameters

    def submit(self, *_):
        class Died:
            _results_timeout_s = submitit.core.core.Job._results_timeout_s

            def result(self):
                waited.append(self._results_timeout_s)  # how long submitit would wait for the dead job's result
                raise submitit.core.utils.UncompletedJobError("Job 7 has not produced any output (state: FINISHED)")
        return Died()


waited = []  # what each Died job's result() found


def test_a_job_whose_process_died_is_recorded_failed_and_gives_its_slot_back(tmp_path, monkeypatch):
    """Bugs caught: the slot put back only after a job that returned, so a dead job's GPU was never used again; and
    put back only after submitit's 15 s wait for a result that a dead local process never writes."""
    monkeypatch.setattr(submitit, "LocalExecutor", _DiedExecutor)
    waited.clear()
    recorded = []
    monkeypatch.setattr(plugin_api, "record_died",
                        lambda cfg, overrides, reason, idx, status="FAILED": recorded.append((reason, idx, status)))
    launcher = GpuPoolLauncher.__new__(GpuPoolLauncher)
    launcher.params = {"submitit_folder": str(tmp_path / ".submitit")}
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    free = queue.Queue()
    free.put(1)
    returned = launcher._run_on_free_gpu(free, ["bs=2"], 3, {}, threading.Event())
    assert free.get_nowait() == 1  # the slot is free again for the next job
    assert waited == [RESULT_WAIT_S] and RESULT_WAIT_S < submitit.core.core.Job._results_timeout_s
    assert recorded == [("the job's process on GPU 1 died before it recorded a result (Job 7 has not produced any "
                         "output (state: FINISHED))", 3, "FAILED")]
    assert returned.status == JobStatus.COMPLETED and returned.overrides == ["bs=2"]
