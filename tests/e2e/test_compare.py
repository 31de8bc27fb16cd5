"""`harness compare` on a real sweep of the CLI."""
from __future__ import annotations

import csv
import json

from harness.cli import commands as cli
from tests.support import FAST, run_harness, runs_by_kind, store


def test_a_slowed_sweep_fails_compare_which_names_its_runs_and_logs_on_its_parent(workdir, capsys):
    args = ("-m", *FAST, "bs=1,2", "hydra.sweep.dir=sweeps/${now:%H-%M-%S}-${harness_uid:}")
    assert run_harness(*args, cwd=workdir).returncode == 0
    slowed = run_harness(*args, cwd=workdir, env={"HARNESS_INJECT_FAULT": "slow:bs=2 "})
    assert slowed.returncode == 0, slowed.stderr[-2000:]
    base_dir, _ = sorted((workdir / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime)
    _, parents, _ = runs_by_kind(store(workdir))
    cand_parent = max((p for p in parents if p.data.tags["harness.kind"] == "sweep"), key=lambda p: p.info.start_time)
    out = workdir / "cmp"
    assert cli.main(["compare", str(base_dir), cand_parent.info.run_id, "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    slower = next(line for line in printed.splitlines() if "runs slower beyond 3%: " in line)
    assert "bs=2 tiny ctx=8 cache=64 eager" in slower  # (bs=1 may be named too: this CPU is shared and noisy)
    pairs = {p["label"]: p for p in json.loads((out / "compare.json").read_text())["pairs"]}
    assert pairs["bs=2 tiny ctx=8 cache=64 eager"]["verdict"] == "slower"
    # bs=1 not slowed: the fault's 20 ms a step is about 10x tiny's step, so bs=2's ratio stands far above bs=1's,
    # which a busy shared CPU can move by 2-3x but not to bs=2's (a fault in every job would put both alike)
    assert pairs["bs=1 tiny ctx=8 cache=64 eager"]["ratio"] < pairs["bs=2 tiny ctx=8 cache=64 eager"]["ratio"] / 2
    logged = {a.path for a in store(workdir).list_artifacts(cand_parent.info.run_id, "compare")}
    assert logged == {"compare/compare.md", "compare/compare.json", "compare/compare.png"}
    exported = workdir / "sweep.csv"
    assert cli.main(["export", cand_parent.info.run_id, "--format", "csv", "--out", str(exported)]) == 0
    rows = list(csv.DictReader(exported.open()))
    assert sorted(r["config.bs"] for r in rows) == ["1", "2"] and all(float(r["metric.step_ms_median"]) > 0 for r in rows)
    assert all(r["env.torch"] and r["status"] == "FINISHED" for r in rows)
    assert cli.main(["report", str(workdir / "sweeps"), "--out", str(workdir / "both")]) == 0  # no store needed
    summary = (workdir / "both" / "summary.md").read_text()
    assert summary.count("| tiny | 8 | 64 | 2 |") == 1 and (workdir / "both" / "latency_vs_bs.png").is_file()
    assert summary.count("- ran again later, not in the table: bs=") == 2  # the first sweep's, listed
