"""Sweeps handed to SLURM on a real single-node cluster (Debian's slurm-wlm and munge, started here) and a real
`mlflow server` on 127.0.0.1: a sweep submitted through hydra/launcher=slurm."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests import slurm_cluster
from tests.support import FAST, REPO, MlflowServer, run_harness, runs_by_kind

# one cluster a machine (slurmctld's ports, munged): under pytest-xdist (--dist loadgroup) in one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm"),
              pytest.mark.skipif(slurm_cluster.missing() is not None, reason=f"no SLURM here: {slurm_cluster.missing()}")]


LAUNCH = ["hydra/launcher=slurm", "hydra.launcher.array_parallelism=2", "hydra.launcher.gpus_per_node=null",
          "hydra.launcher.mem_gb=1", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
          "hydra.launcher.partition=debug"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    env = slurm_cluster.start(root)
    yield root, env
    slurm_cluster.stop(root)


def sacct_jobs(env: dict) -> list[str]:
    """Finished jobs as sacct reports them from the job completion log (-c: no slurmdbd here)."""
    out = subprocess.run(["sacct", "-c", "-S", "2020-01-01", "-o", "JobID,State", "--parsable2", "--noheader"],
                         capture_output=True, text=True, env={**os.environ, **env}, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def assert_complete_sweep(url: str, n: int) -> None:
    client = MlflowClient(url)
    _, parents, children = runs_by_kind(client)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == n
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert len(client.get_metric_history(child.info.run_id, "step_ms")) == 8
        assert {"result.json", "steps.csv", "config.yaml"} <= {a.path for a in client.list_artifacts(child.info.run_id)}


def test_slurm_with_a_sqlite_store_is_refused(workdir, cluster):
    _, env = cluster
    proc = run_harness("-m", *LAUNCH, *FAST, "bs=1,2", cwd=workdir, env=env)
    assert proc.returncode == 2
    assert "cannot share the SQLite store" in proc.stderr and "MLFLOW_TRACKING_URI=http://" in proc.stderr
    assert not (workdir / "outputs").exists() or not list((workdir / "outputs").glob("**/result.json"))


def test_a_sweep_runs_as_slurm_jobs_and_logs_to_one_server_through_its_outage(workdir, cluster, tmp_path):
    """Two jobs as SLURM jobs logging to one server, which is taken down while they run: both complete (sacct),
    and both land under the sweep's parent once the server is back."""
    _, env = cluster
    before = len(sacct_jobs(env))
    server = MlflowServer(tmp_path / "server")
    server.start()
    # the outage (8 s down, then the server's own start-up, a minute and more on a loaded 2-core machine) outlasts
    # the default 15 s retry budget; the jobs are given 240 s
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": server.url,
                "HARNESS_STORE_RETRY_S": "240"}
    sweep = subprocess.Popen([sys.executable, "-m", "harness", "-m", *LAUNCH, *FAST, "bs=1,2"], cwd=workdir,
                             env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not list((workdir / "outputs").glob("sweeps/*/*/.submitit")) and time.time() < deadline:
            time.sleep(0.5)  # jobs submitted: now take the server away while they run
        server.stop()
        time.sleep(8)
        server.start()  # same port, same database
        out, err = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    try:
        assert sweep.returncode == 0, out + err
        assert_complete_sweep(server.url, 2)
    finally:
        server.stop()
    jobs = sacct_jobs(env)[before:]
    assert len(jobs) == 2 and all(line.endswith("|COMPLETED") for line in jobs), jobs
