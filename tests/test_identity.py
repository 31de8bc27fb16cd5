"""Run identity: every key a sweep varies is in its runs' labels, report columns and parent metric names; nothing
is merged or dropped silently."""
from __future__ import annotations

import pytest

from harness.analysis.report import table_markdown
from harness.config.labels import run_label, varying_keys
from harness.record import flatten
from tests.support import FAST, run_config, run_harness, runs_by_kind, store

FLAT = flatten({"model": {"name": "tiny"}, "bs": 1, "context_len": 8, "cache_len": 64, "mode": "eager",
                "dtype": "fp32", "seed": 3, "attn": "sdpa"})


def test_the_keys_a_sweep_varies_are_named_in_every_label():
    jobs = [["model=tiny", "dtype=bf16", "bs=1"], ["model=tiny", "dtype=fp32", "bs=1"], ["model=tiny", "dtype=fp32", "bs=2"]]
    assert varying_keys(jobs) == ["bs", "dtype"]
    assert varying_keys([["+inductor.a=1", "model=x"], ["+inductor.a=2", "model=y"]]) == ["inductor.a", "model.name"]
    assert run_label(FLAT, ["bs", "dtype"]) == "bs=1 dtype=fp32 tiny ctx=8 cache=64 eager"  # the varying keys lead
    assert run_label(FLAT, ["dtype", "seed"]) == "dtype=fp32 seed=3 tiny bs=1 ctx=8 cache=64 eager"
    assert run_label(FLAT) == "tiny bs=1 ctx=8 cache=64 eager"


def _row(name, median, variant="eager"):
    return dict(id=name, name=name, status="FINISHED", reason="", mode="eager", variant=variant, model="tiny", bs=1,
                context_len=8, cache_len=64, dtype=None, median_ms=median, ci_low=None, ci_high=None, ci_pct=None,
                noisy=False, efficiency=None, floor_ms=None, parameters=None, mlflow_run_id=None)


def test_a_report_cell_never_hides_a_second_run():
    text = table_markdown([_row("run a", 1.0), _row("run b", 2.0)])
    assert "1.000 ms" in text and "2.000 ms" in text
    assert "Runs sharing a cell (their configs differ in keys the table does not show): run a; run b" in text


@pytest.mark.e2e
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
