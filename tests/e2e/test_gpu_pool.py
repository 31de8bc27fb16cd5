"""hydra/launcher=gpus on CPU: one job per slot at a time (slots stand in for GPUs, CUDA_VISIBLE_DEVICES set per
job), a dead job is recorded, concurrent writers into one SQLite store lose nothing, one parent per sweep."""
from __future__ import annotations

import json
import re
from datetime import datetime

from tests.support import FAST, run_harness, runs_by_kind, store


POOL = ["hydra/launcher=gpus", "device=cpu"]


def _results(workdir) -> list[dict]:
    return [json.loads(p.read_text()) for p in (workdir / "outputs").glob("sweeps/*/*/*/result.json")]


def _overlaps(results: list[dict]) -> list[tuple]:
    """Pairs of jobs that ran in one slot at once, from their recorded start and end times (a job whose process died
    before it recorded anything has no slot or times of its own)."""
    ran = [r for r in results if "gpu_slot" in r["environment"]]
    spans = sorted((r["environment"]["gpu_slot"], datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"]),
                    r["label"]) for r in ran)
    return [(a[3], b[3]) for a, b in zip(spans, spans[1:]) if a[0] == b[0] and b[1] < a[2]]


def test_four_jobs_on_two_slots_never_share_a_slot_and_a_killed_one_is_recorded_as_the_rest_finish(workdir):
    """Four jobs on two slots: a slot is asked for a job while it may still run one (the overlap a shared slot would
    show), at the fewest jobs that ask it of both. One job is killed (SIGKILL) as it runs: it is recorded FAILED and
    the rest finish, all under the sweep's one parent (its slot given back: tests/unit/test_gpu_pool_launcher.py)."""
    proc = run_harness("-m", *POOL, "hydra.launcher.gpus=[0,1]", *FAST, "bs=1,2,3,4", cwd=workdir,
                       env={"HARNESS_INJECT_FAULT": "sigkill:bs=2 "})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "4 jobs over GPUs 0,1, one job a GPU at a time" in proc.stderr
    assert "3 finished, 1 failed" in proc.stdout
    results = _results(workdir)
    by_bs = {next(w for w in r["label"].split() if w.startswith("bs=")): r for r in results}
    assert len(results) == 4 and sorted(by_bs) == ["bs=1", "bs=2", "bs=3", "bs=4"]
    killed = by_bs.pop("bs=2")
    assert killed["status"] == "FAILED" and "died before it recorded a result" in killed["reason"]
    assert all(r["status"] == "FINISHED" for r in by_bs.values())
    # both slots ran jobs, the killed one's named in its reason: the finished ones may all have run in the other
    # slot, since submitit reports a dead process only once it has waited for its result (seconds)
    killed_slot = re.search(r"on GPU (\d+) died", killed["reason"]).group(1)
    assert {r["environment"]["gpu_slot"] for r in by_bs.values()} | {killed_slot} == {"0", "1"}
    assert _overlaps(results) == []
    _, parents, children = runs_by_kind(store(workdir))
    assert len(parents) == 1 and parents[0].info.status == "FAILED" and len(children) == 4
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    # each job's own output in the sweep's one submitit folder, named by its process (no folder a job: submitit makes
    # that only after the job's process started, which may already be opening its log there)
    (submitit,) = (workdir / "outputs").glob("sweeps/*/*/.submitit")
    assert len(list(submitit.glob("*_0_log.out"))) == 4 and not [p for p in submitit.iterdir() if p.is_dir()]


def test_four_concurrent_writers_into_one_sqlite_store_lose_no_run(workdir):
    """Four jobs at once, each logging its run into one SQLite file as it ends: all four land, FINISHED, under the
    sweep's one parent, which ends FINISHED."""
    proc = run_harness("-m", *POOL, "hydra.launcher.gpus=[0,1,2,3]", *FAST, "seed=0,1,2,3",
                       cwd=workdir, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, parents, children = runs_by_kind(store(workdir))
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["seed"] for c in children) == [str(s) for s in range(4)]
