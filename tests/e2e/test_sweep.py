"""Sweeps of the real CLI in subprocesses against real SQLite stores: runs that land, resume, faults survived,
nothing lost or merged."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import matplotlib.image
import pytest
import torch
import yaml

from harness.cli import commands as cli
from tests.support import FAST, child_runs, harness_env, one_line_error, run_config, run_harness, runs_by_kind, store


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


def test_a_run_reruns_from_its_saved_hydra_config(workdir):
    first = run_harness(*FAST, "bs=3", "seed=5", cwd=workdir)
    assert first.returncode == 0, first.stderr
    (run_dir,) = (workdir / "outputs" / "runs").glob("*/*")
    saved = run_dir / ".hydra"
    again = run_harness("--config-path", str(saved), "--config-name", "config", cwd=workdir)
    assert again.returncode == 0, again.stderr
    results = [json.loads(p.read_text()) for p in (workdir / "outputs").glob("**/result.json")]
    assert len(results) == 2
    assert results[0]["config"] == results[1]["config"]
    assert yaml.safe_load((saved / "config.yaml").read_text())["bs"] == 3
    _, parents, children = runs_by_kind(store(workdir))
    assert len(parents) == 2 and len(children) == 2  # a single run gets its own parent too


def test_a_sweeps_exclude_rules_leave_their_jobs_out_unrun_and_unrecorded(workdir):
    # dtype is an enum in the composed config: a rule compared with its repr (DType.bf16) would exclude nothing
    proc = run_harness("-m", *FAST, "bs=1,2", "mode=eager", "dtype=fp32,bf16",
                       "hydra.sweeper.exclude=[{bs:2,dtype:bf16}]", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "sweep: 4 jobs, 3 to run, 0 rejected, 1 excluded by hydra.sweeper.exclude" in proc.stderr + proc.stdout
    _, _, children = runs_by_kind(store(workdir))
    assert sorted((c.data.params["bs"], c.data.params["dtype"]) for c in children) == [
        ("1", "bf16"), ("1", "fp32"), ("2", "fp32")]
    # `harness plan` leaves out what the sweep would, names each job as its run would be named, and estimates the
    # jobs that ran from their recorded phases; a config never run says so and is not counted in the total
    plan = run_harness("plan", *FAST, "bs=1,2,3", "mode=eager", "dtype=fp32,bf16",
                       "hydra.sweeper.exclude=[{bs:2,dtype:bf16}]", cwd=workdir)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[0] == "5 jobs (1 more excluded: bs=2 dtype=bf16)"
    by_label = {line.split("  ")[-1].strip(): line for line in lines[1:6]}
    ran = [f"bs={bs} dtype={dtype} tiny ctx=8 cache=64 eager" for bs, dtype in (("1", "fp32"), ("1", "bf16"), ("2", "fp32"))]
    assert all("(median of 1 past run)" in by_label[label] for label in ran), plan.stdout
    assert all("no past run" in by_label[f"bs=3 dtype={d} tiny ctx=8 cache=64 eager"] for d in ("fp32", "bf16"))
    assert lines[6].startswith("total: ") and lines[6].endswith(" s for the 3 jobs that ran before; 2 never ran here")
    assert float(lines[6].split()[1]) > 0


def test_resume_runs_only_what_a_killed_sweep_left_missing(workdir):
    killed = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env={"HARNESS_INJECT_FAULT": "sigkill:bs=2 "})
    assert killed.returncode == -signal.SIGKILL
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "RUNNING" and [c.data.params["bs"] for c in children] == ["1"]

    again = run_harness("-m", *FAST, "bs=1,2,3", "resume=true", cwd=workdir)
    assert again.returncode == 0, again.stderr
    assert "2 finished, 0 failed, 1 skipped (resume)" in again.stdout
    client = store(workdir)
    abandoned = client.get_run(parent.info.run_id)
    assert abandoned.info.status == "FAILED" and abandoned.data.tags["failure_reason"] == "abandoned"
    finished = [c for c in child_runs(workdir) if c.info.status == "FINISHED"]
    assert sorted(c.data.params["bs"] for c in finished) == ["1", "2", "3"]  # bs=1 once, not twice


def test_an_oom_in_one_job_leaves_the_others_finished(workdir):
    proc = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env={"HARNESS_INJECT_FAULT": "oom:bs=2 "})
    assert proc.returncode == 1
    by_bs = {c.data.params["bs"]: c for c in child_runs(workdir)}
    assert by_bs["1"].info.status == by_bs["3"].info.status == "FINISHED"
    assert by_bs["2"].info.status == "FAILED"
    assert by_bs["2"].data.tags["failure_reason"].startswith("out of memory at bs=2 cache_len=64 mode=eager")
    assert by_bs["2"].data.tags["failure_reason"].endswith("memory back at the post-load baseline: not measured off a GPU")


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the graphed jobs that fail without CUDA")
def test_report_on_a_resumed_sweep(workdir, capsys):
    sweep = ["-m", *FAST, "bs=1,2", "cache_len=64,128", "mode=eager,graphed"]
    first = run_harness(*sweep, cwd=workdir)
    assert first.returncode == 1  # the graphed jobs need CUDA
    link = next(line for line in first.stdout.splitlines() if line.startswith("Compare this sweep's runs: "))
    finished = [c for c in runs_by_kind(store(workdir))[2] if c.info.status == "FINISHED"]
    assert len(finished) == 4 and sorted(re.findall(r"%22([0-9a-f]{32})%22", link)) == sorted(
        c.info.run_id for c in finished)  # the failed graphed runs are left out of the comparison
    again = run_harness(*sweep, "resume=true", cwd=workdir)
    assert "0 finished, 4 failed, 4 skipped (resume)" in again.stdout
    assert [line for line in again.stdout.splitlines() if line.endswith(" ")] == []  # no padding into a pipe
    db = workdir / "mlruns" / "mlflow.db"
    report = run_harness("--tracking-uri", f"sqlite:///{db}", "report", "--out", "rep", cwd=workdir)
    assert report.returncode == 0, report.stderr
    for bs, cache in ((1, 64), (2, 64), (1, 128), (2, 128)):  # the skipped jobs shown by their original runs
        row = next(line for line in report.stdout.splitlines() if line.startswith(f"| tiny | 8 | {cache} | {bs} |"))
        assert " ms ±" in row and "1.00x" in row and "FAILED: mode=graphed needs a CUDA GPU" in row
    assert "wrote summary.md, latency_vs_bs.png, speedup_vs_bs.png in" in report.stdout  # one context: no context plot
    for png in ("latency_vs_bs.png", "speedup_vs_bs.png"):
        image = matplotlib.image.imread(workdir / "rep" / png)
        assert image.ndim == 3 and image.shape[0] > 100
    resumed_parent = max(runs_by_kind(store(workdir))[1], key=lambda p: p.info.start_time)
    logged = {a.path for a in store(workdir).list_artifacts(resumed_parent.info.run_id)}
    assert {"summary.md", "latency_vs_bs.png"} <= logged
    client = store(workdir)
    empty = client.create_run(client.get_experiment_by_name("harness").experiment_id,
                              tags={"harness.kind": "sweep"}).info.run_id
    assert cli.main(["report", empty, "--out", str(workdir / "rep2")]) == 0
    assert "(no job runs in this sweep)" in capsys.readouterr().out
    assert "No such file or directory: '/proc/nope'" in one_line_error(capsys, "report", "--out", "/proc/nope")


def test_a_sweep_over_dtype_keeps_two_runs_everywhere(workdir):
    proc = run_harness("-m", *FAST, "device=cpu", "dtype=bf16,fp32", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dtype=bf16 tiny bs=1 ctx=8 cache=64 eager" in proc.stdout and "dtype=fp32 tiny" in proc.stdout
    _, (parent,), children = runs_by_kind(store(workdir))
    assert sorted(c.info.run_name for c in children) == ["dtype=bf16 tiny bs=1 ctx=8 cache=64 eager",
                                                         "dtype=fp32 tiny bs=1 ctx=8 cache=64 eager"]
    medians = {k: v for k, v in parent.data.metrics.items() if k.startswith("median_ms/")}
    assert set(medians) == {"median_ms/eager_dtypebf16/bs1", "median_ms/eager_dtypefp32/bs1"}
    report = run_harness("report", "--out", str(workdir / "report"), cwd=workdir)
    assert report.returncode == 0, report.stderr
    assert "| model | context_len | cache_len | bs | eager dtype=bf16 | eager dtype=fp32 |" in report.stdout
    assert run_config(*FAST, "dtype=fp32").label == "tiny bs=1 ctx=8 cache=64 eager"  # a single run: nothing varies
