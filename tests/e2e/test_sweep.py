"""Sweeps of the real CLI in subprocesses against real SQLite stores: runs that land, resume after a kill, sweeps
started together never merged. (The sweeps whose process is not what a test is about run in process:
tests/unit/cli/test_app.py, test_main.py and tests/unit/analysis/test_report.py.)"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

from tests.support import FAST, child_runs, harness_env, run_harness, run_in_process, runs_by_kind, store


def test_a_tiny_multirun_lands_in_mlflow(workdir):
    proc = run_harness("-m", *FAST, "bs=1,2", "mode=eager", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "2 finished, 0 failed" in proc.stdout
    assert f"mlflow ui --backend-store-uri sqlite:///{workdir}/mlruns/mlflow.db" in proc.stdout
    assert "job 1/2 bs=1 tiny ctx=8 cache=64 eager: decode" in proc.stderr  # progress goes to stderr

    client = store(workdir)
    exp, parents, children = runs_by_kind(client)
    assert exp.artifact_location == (workdir / "mlruns" / "artifacts").as_uri()
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.info.run_name for c in children) == ["bs=1 tiny ctx=8 cache=64 eager", "bs=2 tiny ctx=8 cache=64 eager"]
    # the parent is MLflow's landing: per mode x bs medians and speedups, the plots, a link comparing the runs
    by_bs = {c.data.params["bs"]: c for c in children}
    assert parent.info.run_name == "bs=1,2 · " + " ".join(FAST) + " mode=eager"  # what it varied, then what it fixed
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow opens its runs table
    median = by_bs["2"].data.metrics["step_ms_median"]
    assert parent.data.metrics["median_ms/eager/bs2"] == median == float(f"{median:.4g}")  # as known: 4 figures
    # an eager-only sweep has no speedup to show: eager's over itself is 1 by definition, not a finding
    assert not [k for k in parent.data.metrics if k.startswith("speedup/")] and parent.data.metrics["jobs_finished"] == 2
    assert "speedup_vs_eager" not in by_bs["1"].data.metrics
    row = next(line for line in parent.data.tags["mlflow.note.content"].splitlines() if line.startswith("| tiny | 8 | 2 | "))
    assert float(row.split("|")[4]) == pytest.approx(median, rel=1e-3)  # its description
    assert {a.path for a in client.list_artifacts(parent.info.run_id) if not a.is_dir} == {
        "summary.md", "latency_vs_bs.png", "speedup_vs_bs.png"}  # at the top; one context: no context plot
    ids = sorted(c.info.run_id for c in children)
    url = next(line for line in proc.stdout.splitlines() if line.startswith("Compare this sweep's runs: "))
    assert url.startswith("Compare this sweep's runs: http://127.0.0.1:5000/#/compare-runs?runs=")
    assert all(i in url for i in ids)

    for child in children:
        assert child.info.status == "FINISHED"
        p, m, t = child.data.params, child.data.metrics, child.data.tags
        bs = int(p["bs"])
        assert p["model.name"] == "tiny" and p["mode"] == "eager" and p["cache_len"] == "64"
        assert p["model.hidden_size"] == "64" and p["tracking.experiment"] == "harness"
        # (the median is logged to four significant figures, tokens/s as computed)
        assert m["tokens_per_s"] == pytest.approx(bs * 1000 / m["step_ms_median"], rel=1e-3)
        for key in ("step_ms_p99", "step_ms_cv", "wall_ms_per_step", "prefill_ms", "warmup_ms", "prepare_ms"):
            assert key in m
        assert t["weights"] == "random" and t["env.torch"] == torch.__version__
        assert "env.TORCHINDUCTOR_CACHE_DIR" not in t  # set by torch's imports, not by the user
        assert t["overrides"].endswith(f"bs={bs} mode=eager") and t["env.git_commit"]
        series = client.get_metric_history(child.info.run_id, "step_ms")
        assert [s.step for s in series] == list(range(8))
        files = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert files == {"result.json", "steps.csv", "config.yaml", "overrides.yaml"}
        job_dir = Path(t["job_dir"])
        on_disk = json.loads((job_dir / "result.json").read_text())
        assert on_disk["mlflow_run_id"] == child.info.run_id
        assert [s.value for s in series] == pytest.approx(on_disk["step_ms"])
        # the run spans its job, as result.json timed it (not the moment it was logged)
        started, ended = (datetime.fromisoformat(on_disk[k]).timestamp() * 1000 for k in ("started", "ended"))
        assert (child.info.start_time, child.info.end_time) == (int(started), int(ended)) and ended > started


def test_resume_runs_only_what_a_killed_sweep_left_missing(workdir, capfd, monkeypatch):
    """SIGKILL ends the sweep's process: a subprocess; the resume that follows runs in this process."""
    killed = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env={"HARNESS_INJECT_FAULT": "sigkill:bs=2 "})
    assert killed.returncode == -signal.SIGKILL
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "RUNNING" and [c.data.params["bs"] for c in children] == ["1"]

    again = run_in_process(capfd, monkeypatch, "-m", *FAST, "bs=1,2,3", "resume=true")
    assert again.returncode == 0, again.stderr
    assert "2 finished, 0 failed, 1 skipped (resume)" in again.stdout
    client = store(workdir)
    abandoned = client.get_run(parent.info.run_id)
    assert abandoned.info.status == "FAILED" and abandoned.data.tags["failure_reason"] == "abandoned"
    finished = [c for c in child_runs(workdir) if c.info.status == "FINISHED"]
    assert sorted(c.data.params["bs"] for c in finished) == ["1", "2", "3"]  # bs=1 once, not twice


def test_sweeps_started_together_never_share_a_folder(workdir):
    procs = [subprocess.Popen([sys.executable, "-m", "harness", "-m", *FAST, "bs=1,2"], cwd=workdir,
                              env=harness_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    sweeps = sorted((workdir / "outputs" / "sweeps").glob("*/*"))
    assert len(sweeps) == 3 and all(len(list(s.glob("*/result.json"))) == 2 for s in sweeps)
    _, parents, children = runs_by_kind(store(workdir))
    assert len(parents) == 3 and all(p.info.status == "FINISHED" for p in parents)
    per_parent = sorted(sum(c.data.tags["mlflow.parentRunId"] == p.info.run_id for c in children) for p in parents)
    assert per_parent == [2, 2, 2]
