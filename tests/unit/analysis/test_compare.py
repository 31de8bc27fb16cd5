"""`harness compare` (harness/analysis/compare.py): matching, bootstrap verdicts, environment and GPU-fingerprint
diffs, and the command on two real sweeps of the CLI (run in this process)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from harness.analysis.compare import compare, environment_diff, parse_threshold
from harness.errors import ConfigError
from harness.cli import commands as cli
from harness.measure.job import SLOW_MS
from harness.record import JobRecord
from tests.support import FAST, run_in_process, runs_by_kind, store


def _record(bs: int, median: float, env: dict | None = None, seed: int = 0, status: str = "FINISHED",
            **config) -> JobRecord:
    rng = np.random.default_rng(seed)
    steps = list(median * (1 + 0.002 * rng.standard_normal(3 * 64)))  # 3 blocks of 64 steps, ±0.2% noise
    return JobRecord(label=f"tiny bs={bs}", config={"bs": bs, "mode": "eager", "repeats": 3, "tracking": {"uri": "x"},
                                                    **config},
                     status=status, step_ms=steps, environment=env or {"torch": "2.11"})


@pytest.mark.slow
def test_verdicts_come_from_the_ratio_interval_at_the_threshold():
    base = [_record(1, 10.0), _record(2, 10.0), _record(4, 10.0), _record(8, 10.0)]
    cand = [_record(1, 10.01, seed=1), _record(2, 11.0, seed=2), _record(4, 9.0, seed=3), _record(16, 10.0)]
    pairs, unmatched = compare(base, cand, ignore=[], threshold=0.03)
    verdicts = {p.label: p.verdict for p in pairs}
    assert verdicts == {"tiny bs=1": "same", "tiny bs=2": "slower", "tiny bs=4": "faster"}
    slower = next(p for p in pairs if p.label == "tiny bs=2")
    assert slower.low < slower.ratio < slower.high and 1.09 < slower.low and slower.high < 1.11
    assert sorted(unmatched) == [("baseline", "tiny bs=8", "no candidate run with this config"),
                                 ("candidate", "tiny bs=16", "no baseline run with this config")]
    # a 10% change inside a 15% threshold is `same`; where the store lives never decides a match
    assert {p.verdict for p in compare(base, cand, [], 0.15)[0]} == {"same"}
    moved = [_record(2, 10.0, tracking={"uri": "elsewhere"})]
    assert len(compare([_record(2, 10.0)], moved, [], 0.03)[0]) == 1


@pytest.mark.slow
def test_ignored_keys_match_runs_that_differ_in_them_and_environments_are_diffed():
    base = [_record(1, 10.0, attn="sdpa")]
    cand = [_record(1, 5.0, attn="flex", env={"torch": "2.13", "gpu_uuid": "GPU-b"})]
    assert compare(base, cand, [], 0.03)[0] == []
    assert [p.verdict for p in compare(base, cand, ["attn"], 0.03)[0]] == ["faster"]
    assert environment_diff(base, cand, []) == {"gpu_uuid": (["-"], ["GPU-b"]), "torch": (["2.11"], ["2.13"])}
    assert environment_diff(base, cand, ["env.gpu_uuid"]) == {"torch": (["2.11"], ["2.13"])}
    assert parse_threshold("3%") == 0.03 and parse_threshold("0.05") == 0.05
    with pytest.raises(ConfigError, match="--threshold 150% is invalid"):
        parse_threshold("150%")


@pytest.mark.slow
def test_a_config_run_twice_pairs_once_and_the_others_are_listed():
    base = [_record(1, 10.0), _record(1, 10.0, seed=5), _record(2, 10.0, status="FAILED")]
    cand = [_record(1, 10.0, seed=6), _record(1, 10.0, seed=7)]
    pairs, unmatched = compare(base, cand, [], 0.03)
    assert len(pairs) == 1
    assert sorted(unmatched) == [("baseline", "tiny bs=1", "another run of a config already paired"),
                                 ("baseline", "tiny bs=2", "not comparable: FAILED"),
                                 ("candidate", "tiny bs=1", "another run of a config already paired")]


def _printed(copy: float, spread: float, launch: float = 2.5) -> dict:
    return {"torch": "2.11", "fingerprint_copy_gb_per_s": str(copy), "fingerprint_copy_gb_per_s_spread_pct": str(spread),
            "fingerprint_launch_us": str(launch), "fingerprint_launch_us_spread_pct": "1.0"}


def test_gpu_fingerprints_are_told_apart_beyond_their_noise_and_not_as_environment_differences():
    from harness.analysis.compare import Side, as_markdown, environment_diff, fingerprint_diff

    base = [_record(1, 10.0, env=_printed(4000.0, 0.5)), _record(2, 10.0, env=_printed(4010.0, 0.5))]
    # two processes on one H200 moved an empty kernel's launch by 58% (6.1 → 9.7 µs): the host's figure, not a new GPU
    alike = [_record(1, 10.0, env=_printed(4030.0, 0.8, launch=3.9)), _record(2, 10.0, env=_printed(3990.0, 0.8, launch=3.9))]
    slower_memory = [_record(1, 10.0, env=_printed(3600.0, 0.5)), _record(2, 10.0, env=_printed(3610.0, 0.5))]
    assert environment_diff(base, alike, []) == {}  # measured figures always differ a little: not a difference
    assert [row["differs"] for row in fingerprint_diff(base, alike)] == [False, False]
    copy, launch = fingerprint_diff(base, slower_memory)
    assert copy["figure"] == "copy_gb_per_s" and copy["differs"] and round(copy["change_pct"], 1) == -10.0
    assert copy["noise_pct"] == 5.0 and not launch["differs"]  # the floor: a 0.5% spread is not the noise
    text = as_markdown(Side("a", base, "a"), Side("b", slower_memory, "b"), [], [], {}, 0.03,
                       fingerprint_diff(base, slower_memory))
    assert "copy_gb_per_s 4005 → 3605 GB/s (-10.0%, noise ±5.0%)" in text
    assert "They differ beyond their noise in copy_gb_per_s" in text


@pytest.mark.slow
def test_a_slowed_sweep_fails_compare_which_names_its_runs_and_logs_on_its_parent(workdir, capfd, monkeypatch):
    args = ("-m", *FAST, "bs=1,2", "hydra.sweep.dir=sweeps/${now:%H-%M-%S}-${harness_uid:}")
    assert run_in_process(capfd, monkeypatch, *args).returncode == 0
    slowed = run_in_process(capfd, monkeypatch, *args, env={"HARNESS_INJECT_FAULT": "slow:bs=2 "})
    assert slowed.returncode == 0, slowed.stderr[-2000:]
    base_dir, _ = sorted((workdir / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime)
    _, parents, jobs = runs_by_kind(store(workdir))
    cand_parent = max((p for p in parents if p.data.tags["harness.kind"] == "sweep"), key=lambda p: p.info.start_time)
    out = workdir / "cmp"
    assert cli.main(["compare", str(base_dir), cand_parent.info.run_id, "--out", str(out)]) == 1
    printed = capfd.readouterr().out
    slower = next(line for line in printed.splitlines() if "runs slower beyond 3%: " in line)
    assert "bs=2 tiny ctx=8 cache=64 eager" in slower  # (bs=1 may be named too: this CPU is shared and noisy)
    pairs = {p["label"]: p for p in json.loads((out / "compare.json").read_text())["pairs"]}
    assert pairs["bs=2 tiny ctx=8 cache=64 eager"]["verdict"] == "slower"
    # the fault's exact effect, which no load can take away: each of bs=2's steps slept SLOW_MS more, and it reached
    # bs=2 alone (a fault in every job would slow both). bs=1's ratio is whatever the shared CPU made it: not asserted
    assert pairs["bs=2 tiny ctx=8 cache=64 eager"]["candidate_ms"] >= SLOW_MS
    faults = {r.info.run_name: r.data.tags.get("fault") for r in jobs
              if r.data.tags["mlflow.parentRunId"] == cand_parent.info.run_id}
    assert sorted(faults) == ["bs=1 tiny ctx=8 cache=64 eager", "bs=2 tiny ctx=8 cache=64 eager"]
    assert faults["bs=1 tiny ctx=8 cache=64 eager"] is None and faults["bs=2 tiny ctx=8 cache=64 eager"].startswith(
        f"slowed by {SLOW_MS:g} ms a step")
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
