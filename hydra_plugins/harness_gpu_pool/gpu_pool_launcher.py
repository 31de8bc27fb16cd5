"""`hydra/launcher=gpus`: one job per GPU at a time over every visible GPU (or `hydra.launcher.gpus=[0,2]`), the
others queued until a GPU frees.

Each job is its own process, started by submitit's local executor pinned to its GPU (CUDA_VISIBLE_DEVICES, so the
job sees it as cuda:0 and records its UUID and slot). A thread pool with one worker per GPU hands each job a free
GPU from a queue of tokens and waits for it; no scheduler of our own. A job that dies (SIGKILL, a segfault, an
out-of-memory kill) gives its GPU back and is recorded FAILED with how it ended; the others run on. Ctrl-C (or
SIGTERM) stops every running job, which records itself KILLED, and queues no more.
"""
# No `from __future__ import annotations` here: Hydra imports plugin modules by path, outside sys.modules, and
# dataclasses then cannot resolve string annotations.
import concurrent.futures
import os
import queue
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher


@dataclass
class GpuPoolLauncherConf:
    _target_: str = "hydra_plugins.harness_gpu_pool.gpu_pool_launcher.GpuPoolLauncher"
    gpus: Optional[List[int]] = None  # the GPUs (as nvidia-smi numbers them) to use; None: every visible one
    # each job's submitit files (its stdout and stderr as <process id>_0_log.out and _log.err, its pickles), in one
    # folder: not a folder a job (.submitit/%j), which submitit's local executor creates only after it has started
    # the job's process, whose first act is to open its log there (on a 2-core machine, 8 jobs at once: one failed
    # with FileNotFoundError in most sweeps)
    submitit_folder: str = "${hydra.sweep.dir}/.submitit"
    timeout_min: int = 24 * 60  # a job still running after this is stopped (SIGTERM: recorded KILLED)


# How long a job's result is waited for once its process has ended. A local job writes its result to this machine's
# disk before its process exits, so none there means the process died; submitit's own wait (15 s, for a cluster's
# network file system) would only keep that job's GPU from the next job.
RESULT_WAIT_S = 2


ConfigStore.instance().store(group="hydra/launcher", name="gpus", node=GpuPoolLauncherConf, provider="harness")


def visible_gpus() -> List[int]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES where it lists indices, else every GPU nvidia-smi
    lists (no torch import: the launcher's process never touches a GPU)."""
    given = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if given and all(v.isdigit() for v in given):
        return [int(v) for v in given]
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                            text=True, timeout=30)
    return [int(line) for line in listed.stdout.split() if line.strip().isdigit()] if listed.returncode == 0 else []


class GpuPoolLauncher(BaseSubmititLauncher):
    _EXECUTOR = "local"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.gpus = self.params.pop("gpus", None)

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        """In the job's own process: SIGTERM (Ctrl-C's cancel, a timeout) ends the job KILLED, as in a sweep."""
        from harness.cli.plugin_api import on_signal

        signal.signal(signal.SIGTERM, on_signal)
        return super().__call__(*args, **kwargs)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from harness.cli.plugin_api import say

        gpus = list(self.gpus) if self.gpus else visible_gpus()
        if not gpus:
            raise ValueError("hydra/launcher=gpus found no GPU (no CUDA_VISIBLE_DEVICES, no nvidia-smi): name the "
                             "slots, e.g. hydra.launcher.gpus=[0,1]")
        say(f"launcher gpus: {len(job_overrides)} jobs over GPUs {','.join(map(str, gpus))}, one job a GPU at a time")
        free: "queue.Queue[int]" = queue.Queue()
        for gpu in gpus:
            free.put(gpu)
        jobs: dict = {}  # job number -> its submitit job, while it runs (for Ctrl-C)
        stopping = threading.Event()  # (not on self: submitit pickles the launcher into every job)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(gpus), thread_name_prefix="gpu") as pool:
            futures = [pool.submit(self._run_on_free_gpu, free, list(overrides), initial_job_idx + i, jobs, stopping)
                       for i, overrides in enumerate(job_overrides)]
            try:
                return [f.result() for f in futures]
            except KeyboardInterrupt:
                stopping.set()
                for f in futures:
                    f.cancel()  # the queued ones never start
                for job in list(jobs.values()):
                    job.cancel(check=False)  # SIGTERM: the job records itself KILLED
                raise

    def _run_on_free_gpu(self, free, overrides: List[str], idx: int, jobs: dict, stopping) -> JobReturn:
        import submitit

        from harness.cli.plugin_api import outcome, say

        gpu = free.get()
        try:
            executor = submitit.LocalExecutor(folder=self.params["submitit_folder"])
            executor.update_parameters(gpus_per_node=1, visible_gpus=[gpu], tasks_per_node=1,
                                       timeout_min=self.params.get("timeout_min", 24 * 60))
            job = executor.submit(self, overrides, "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
            job._results_timeout_s = RESULT_WAIT_S  # submitit's attribute (its own tests set it so)
            jobs[idx] = job
            try:
                ret = job.result()
            except Exception as err:  # noqa: BLE001 - the job's process died: record it, free the GPU
                return self._died(overrides, idx, gpu, err, stopping.is_set())
            finally:
                jobs.pop(idx, None)
            if ret.status == JobStatus.COMPLETED and ret.return_value is not None:
                say(f"GPU {gpu}: job {idx} {outcome(ret.return_value)}")
            return ret
        finally:
            free.put(gpu)

    def _died(self, overrides: List[str], idx: int, gpu: int, err: BaseException, stopped: bool) -> JobReturn:
        from harness.cli.plugin_api import record_died

        job_dir = Path(str(self.config.hydra.sweep.dir)) / str(idx)
        if stopped:  # Ctrl-C or SIGTERM stopped it
            record_died(self.config, overrides, "interrupted (SIGINT or SIGTERM) before it recorded a result", idx,
                        status="KILLED")
        elif not (job_dir / "result.json").is_file():  # a job that died after writing its record keeps that record
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            record_died(self.config, overrides, f"the job's process on GPU {gpu} died before it recorded a result "
                                                f"({why[:300]})", idx)
        return JobReturn(overrides=overrides, working_dir=str(job_dir), status=JobStatus.COMPLETED, _return_value=None)
