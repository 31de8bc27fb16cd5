"""The sweep's parent run (harness/cli/app.py): its name and the jobs a resumed sweep skipped; sweeps on the basic
launcher in this process: exclude rules, a job out of memory, a dtype axis."""
from __future__ import annotations

import pytest

from harness.cli.app import sweep_name
from tests.support import FAST, child_runs, run_config, run_in_process, runs_by_kind, store


@pytest.mark.slow
def test_a_resumed_sweeps_parent_shows_the_skipped_jobs_numbers_and_links_the_earlier_sweep(workdir, capfd,
                                                                                             monkeypatch):
    """After an interrupted sweep, `resume=true` skipped the finished jobs, and its parent's table left them out
    ("Not in the table (SKIPPED)"): the results were split over two parents, unlinked."""
    assert run_in_process(capfd, monkeypatch, "-m", *FAST, "device=cpu", "bs=1").returncode == 0
    _, (first,), (done,) = runs_by_kind(store(workdir))
    assert run_in_process(capfd, monkeypatch, "-m", *FAST, "device=cpu", "bs=1,2", "resume=true").returncode == 0
    _, parents, _ = runs_by_kind(store(workdir))
    (resumed,) = [p for p in parents if p.info.run_id != first.info.run_id]
    table = resumed.data.tags["mlflow.note.content"]
    assert "SKIPPED" not in table
    rows = [line for line in table.splitlines() if line.startswith("| tiny | 8 |")]
    assert len(rows) == 2 and f"{done.data.metrics['step_ms_median']:.3f}" in rows[0]
    assert resumed.data.tags["harness.resumes"] == first.info.run_id
    assert store(workdir).get_run(first.info.run_id).data.tags["harness.resumed_by"] == resumed.info.run_id


def test_a_parent_is_named_by_what_its_sweep_varied():
    assert sweep_name(["bs=1,2,4,8", "mode=eager,graphed"], {}) == "bs=1,2,4,8 × mode=eager,graphed"
    # a preset's axes are named too, unless the command line set them
    assert sweep_name(["+experiment=design-card", "bs=1,16"], {"bs": "1,2,4,8", "mode": "eager,graphed"}) == \
        "bs=1,16 × mode=eager,graphed · experiment=design-card"
    assert sweep_name(["model=tiny", "bs=range(1,3)", "dtype=bf16,fp32"], {}) == "bs=range(1,3) × dtype=bf16,fp32 · model=tiny"
    assert sweep_name([], {}) == "sweep of the defaults"
    assert sweep_name(["tracking.uri=https://alice:s3cret@host/x", "bs=1,2", "hydra/launcher=gpus", "resume=true",
                       "hydra.launcher.gpus=[0,1]"], {}) == "bs=1,2"  # where it is stored is not what it measures


@pytest.mark.slow
def test_a_sweeps_exclude_rules_leave_their_jobs_out_unrun_and_unrecorded(workdir, capfd, monkeypatch):
    # dtype is an enum in the composed config: a rule compared with its repr (DType.bf16) would exclude nothing
    proc = run_in_process(capfd, monkeypatch, "-m", *FAST, "bs=1,2", "mode=eager", "dtype=fp32,bf16",
                          "hydra.sweeper.exclude=[{bs:2,dtype:bf16}]")
    assert proc.returncode == 0, proc.stderr
    assert "sweep: 4 jobs, 3 to run, 0 rejected, 1 excluded by hydra.sweeper.exclude" in proc.stderr + proc.stdout
    _, _, children = runs_by_kind(store(workdir))
    assert sorted((c.data.params["bs"], c.data.params["dtype"]) for c in children) == [
        ("1", "bf16"), ("1", "fp32"), ("2", "fp32")]
    # `harness plan` leaves out what the sweep would, names each job as its run would be named, and estimates the
    # jobs that ran from their recorded phases; a config never run says so and is not counted in the total
    plan = run_in_process(capfd, monkeypatch, "plan", *FAST, "bs=1,2,3", "mode=eager", "dtype=fp32,bf16",
                          "hydra.sweeper.exclude=[{bs:2,dtype:bf16}]")
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[0] == "5 jobs (1 more excluded: bs=2 dtype=bf16)"
    by_label = {line.split("  ")[-1].strip(): line for line in lines[1:6]}
    ran = [f"bs={bs} dtype={dtype} tiny ctx=8 cache=64 eager" for bs, dtype in (("1", "fp32"), ("1", "bf16"), ("2", "fp32"))]
    assert all("(median of 1 past run)" in by_label[label] for label in ran), plan.stdout
    assert all("no past run" in by_label[f"bs=3 dtype={d} tiny ctx=8 cache=64 eager"] for d in ("fp32", "bf16"))
    assert lines[6].startswith("total: ") and lines[6].endswith(" s for the 3 jobs that ran before; 2 never ran here")
    assert float(lines[6].split()[1]) > 0


@pytest.mark.slow
def test_an_oom_in_one_job_leaves_the_others_finished(workdir, capfd, monkeypatch):
    proc = run_in_process(capfd, monkeypatch, "-m", *FAST, "bs=1,2,3", env={"HARNESS_INJECT_FAULT": "oom:bs=2 "})
    assert proc.returncode == 1
    by_bs = {c.data.params["bs"]: c for c in child_runs(workdir)}
    assert by_bs["1"].info.status == by_bs["3"].info.status == "FINISHED"
    assert by_bs["2"].info.status == "FAILED"
    assert by_bs["2"].data.tags["failure_reason"].startswith("out of memory at bs=2 cache_len=64 mode=eager")
    assert by_bs["2"].data.tags["failure_reason"].endswith("memory back at the post-load baseline: not measured off a GPU")


@pytest.mark.slow
def test_a_sweep_over_dtype_keeps_two_runs_everywhere(workdir, capfd, monkeypatch):
    proc = run_in_process(capfd, monkeypatch, "-m", *FAST, "device=cpu", "dtype=bf16,fp32")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dtype=bf16 tiny bs=1 ctx=8 cache=64 eager" in proc.stdout and "dtype=fp32 tiny" in proc.stdout
    _, (parent,), children = runs_by_kind(store(workdir))
    assert sorted(c.info.run_name for c in children) == ["dtype=bf16 tiny bs=1 ctx=8 cache=64 eager",
                                                         "dtype=fp32 tiny bs=1 ctx=8 cache=64 eager"]
    medians = {k: v for k, v in parent.data.metrics.items() if k.startswith("median_ms/")}
    assert set(medians) == {"median_ms/eager_dtypebf16/bs1", "median_ms/eager_dtypefp32/bs1"}
    report = run_in_process(capfd, monkeypatch, "report", "--out", str(workdir / "report"))
    assert report.returncode == 0, report.stderr
    assert "| model | context_len | cache_len | bs | eager dtype=bf16 | eager dtype=fp32 |" in report.stdout
    assert run_config(*FAST, "dtype=fp32").label == "tiny bs=1 ctx=8 cache=64 eager"  # a single run: nothing varies
