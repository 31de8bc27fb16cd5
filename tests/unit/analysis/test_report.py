"""`harness report` (harness/analysis/report.py, rows.py): its tables, cells and charts, and the command on a resumed
sweep of the CLI (run in this process)."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch

from harness.analysis import report
from harness.cli import commands as cli
from harness.analysis.report import table_markdown
from harness.analysis.summary import speedups
from harness.config.labels import run_variant
from harness.record import JobRecord
from tests.support import FAST, one_line_error, run_in_process, runs_by_kind, store


def _record(bs: int, median: float, env: dict | None = None, seed: int = 0, status: str = "FINISHED",
            **config) -> JobRecord:
    rng = np.random.default_rng(seed)
    steps = list(median * (1 + 0.002 * rng.standard_normal(3 * 64)))  # 3 blocks of 64 steps, ±0.2% noise
    return JobRecord(label=f"tiny bs={bs}", config={"bs": bs, "mode": "eager", "repeats": 3, "tracking": {"uri": "x"},
                                                    **config},
                     status=status, step_ms=steps, environment=env or {"torch": "2.11"})


def test_a_folder_report_keeps_a_measured_run_over_a_later_interrupted_one(tmp_path):
    """Two sweeps of one config, the second cut by its time limit: its KILLED record (no measurement) must not hide
    the first's result; a later run that measured (passed or failed) still replaces an earlier one."""
    from harness.analysis.report import from_folder, latest_of_each_config
    from harness.store import results

    def written(sweep: str, bs: int, status: str, started: str) -> JobRecord:
        record = _record(bs, 10.0, status=status, model={"name": "tiny"})
        record.config_hash, record.started = f"config-bs{bs}", started
        record.metrics = {"step_ms_median": 10.0} if status == "FINISHED" else {}
        record.reason = None if status == "FINISHED" else "interrupted" if status == "KILLED" else "a wrong token"
        results.write(tmp_path / sweep / str(bs), record)
        return record

    measured = written("cold", 1, "FINISHED", "2026-12-02T11:40:00")
    written("warm", 1, "KILLED", "2026-12-02T11:58:00")
    written("cold", 2, "FINISHED", "2026-12-02T11:41:00")
    failed_later = written("warm", 2, "FAILED", "2026-12-02T11:59:00")
    latest = {r.config_hash: r for r in latest_of_each_config(tmp_path)[1]}
    assert latest["config-bs1"].result_id == measured.result_id
    assert latest["config-bs2"].result_id == failed_later.result_id
    summary = from_folder(tmp_path, tmp_path / "report")[0].read_text()
    assert "- interrupted before it measured, not in the table: tiny bs=1 KILLED" in summary
    assert "- ran again later, not in the table: tiny bs=2 FINISHED" in summary


def _row(name, median, variant="eager"):
    return dict(id=name, name=name, status="FINISHED", reason="", mode="eager", variant=variant, model="tiny", bs=1,
                context_len=8, cache_len=64, dtype=None, median_ms=median, ci_low=None, ci_high=None, ci_pct=None,
                noisy=False, efficiency=None, floor_ms=None, parameters=None, mlflow_run_id=None)


def test_a_report_cell_never_hides_a_second_run():
    text = table_markdown([_row("run a", 1.0), _row("run b", 2.0)])
    assert "1.000 ms" in text and "2.000 ms" in text
    assert "Runs sharing a cell (their configs differ in keys the table does not show): run a; run b" in text


def test_variants_get_their_own_columns_against_the_plain_eager_baseline():
    params = {"mode": "compiled", "graph_steps": "1", "model.fuse_projections": "True", "attn": "sdpa-gqa",
              "compile_mode": "max-autotune"}  # as MLflow logs them
    assert run_variant(params) == "compiled max-autotune fused sdpa-gqa"
    assert run_variant({"mode": "graphed", "graph_steps": 4, "model.fuse_projections": False}) == "graphed steps=4"
    runs = [("eager", "eager fused", 8.0), ("eager", "eager", 10.0), ("compiled", "compiled fused", 2.0),
            ("compiled", "compiled max-autotune fused", 1.0)]
    rows = [dict(id=i, name=f"run {i}", status="FINISHED", model="tiny", cache_len=64, bs=1, context_len=8, dtype="bf16", mode=mode,
                 variant=variant, median_ms=ms, efficiency=None, floor_ms=None, reason="")
            for i, (mode, variant, ms) in enumerate(runs)]
    assert speedups(rows) == {0: 1.25, 1: 1.0, 2: 5.0, 3: 10.0}
    header, _, cells = table_markdown(rows).splitlines()
    assert header == "| model | context_len | cache_len | bs | eager | eager fused | compiled fused | compiled max-autotune fused |"
    assert cells.startswith("| tiny | 8 | 64 | 1 | 10.000 ms, 1.00x | 8.000 ms, 1.25x | 2.000 ms, 5.00x |")


def test_the_context_plot_has_a_line_per_mode_and_attn_and_the_floor(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(report, "_draw", lambda series, floors, x, *a: drawn.setdefault(x, (series, floors)))
    rows = [dict(id=f"{attn}{ctx}", name=f"{attn}{ctx}", status="FINISHED", model="qwen3-0.6b", cache_len=ctx + 256, bs=8, context_len=ctx,
                 dtype="bf16", mode="graphed", variant=run_variant({"mode": "graphed", "attn": attn}),
                 median_ms=ms * ctx / 1024, efficiency=0.5, floor_ms=ctx / 4096, reason="", ci_low=None, ci_high=None)
            for attn, ms in (("sdpa", 7.0), ("flex", 2.0)) for ctx in (1024, 4096, 16384)]
    report.plots(rows, tmp_path)
    series, floors = drawn["context_len"]
    assert sorted(series) == [("qwen3-0.6b", "graphed"), ("qwen3-0.6b", "graphed flex")]
    assert series[("qwen3-0.6b", "graphed flex")] == [(1024, 2.0), (4096, 8.0), (16384, 32.0)]
    assert floors == {("qwen3-0.6b", "floor"): {(1024, 0.25), (4096, 1.0), (16384, 4.0)}}


@pytest.mark.slow
def test_a_model_sweep_plots_speedup_and_latency_against_model_size(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(report, "_draw", lambda series, floors, x, ylabel, path: drawn.setdefault(path.stem, (series, floors)))
    sizes = {"qwen3-0.6b": 0.75e9, "qwen3-8b": 8.2e9}
    rows = [dict(id=f"{m}{mode}{bs}", name=f"{m}{mode}{bs}", status="FINISHED", model=m, cache_len=256, bs=bs, context_len=16, dtype="bf16",
                 mode=mode, variant=mode, median_ms=ms * size / 1e9, efficiency=0.5, floor_ms=size / 4e9,
                 parameters=size, reason="", ci_low=None, ci_high=None)
            for m, size in sizes.items() for bs in (1, 8) for mode, ms in (("eager", 20.0), ("graphed", 5.0))]
    report.plots(rows, tmp_path)
    series, floors = drawn["speedup_vs_model_size"]
    assert series[("graphed", "bs=8")] == [(0.75e9, 4.0), (8.2e9, 4.0)]  # one line per mode and bs, across models
    series, floors = drawn["latency_vs_model_size"]
    assert floors[("floor", "bs=1")] == {(0.75e9, 0.1875), (8.2e9, 2.05)}
    drawn.clear()
    report.plots([r for r in rows if r["model"] == "qwen3-8b"], tmp_path)  # one model, one context: no such axes
    assert sorted(drawn) == ["latency_vs_bs", "speedup_vs_bs"]


RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


def _rows(folder: Path) -> list[dict]:
    from harness.analysis.report import latest_of_each_config
    from harness.analysis.rows import row_of

    return [row_of(r) for r in latest_of_each_config(folder)[1]]


def _drawn(monkeypatch) -> list:
    figures = []
    monkeypatch.setattr(report, "_save", lambda fig, path: figures.append(fig) or path)
    return figures


def test_the_ladder_chart_is_each_runs_median_by_mode_with_the_floor(monkeypatch, tmp_path):
    """Bugs caught: a bar put in another model's or bs's group, a mode's bars swapped with another's, the floor of
    the wrong group, an axis without its unit, a legend without the floor."""
    figures = _drawn(monkeypatch)
    rows = _rows(RESULTS / "h100-ladder")
    assert report.ladder_chart(rows, tmp_path / "ladder.png") == [tmp_path / "ladder.png"]
    ax = figures[0].axes[0]
    groups = [tuple(t.get_text().split("\nbs ")) for t in ax.get_xticklabels()]
    assert groups[0] == ("llama-3.2-1b", "1") and len(groups) == 9
    medians = {(r["model"], str(r["bs"]), r["variant"]): r["median_ms"] for r in rows}
    for bars in ax.containers:
        assert [b.get_height() for b in bars] == [medians[(*g, bars.get_label())] for g in groups]
    floors = {(r["model"], str(r["bs"])): r["floor_ms"] for r in rows}
    segments = [segment for c in ax.collections for segment in c.get_segments()]  # a line across each group
    assert [s[0][1] for s in segments] == [floors[g] for g in groups]
    assert all(g - 0.5 < s[0][0] < s[1][0] < g + 0.5 for g, s in enumerate(segments))
    assert "ms" in ax.get_ylabel() and [t.get_text() for t in ax.get_legend().get_texts()][-4:] == \
        ["eager", "graphed", "compiled", "fused"] and "floor" in ax.get_legend().get_texts()[0].get_text()
    # one context and one mode: no ladder to draw
    assert report.ladder_chart([r for r in rows if r["variant"] == "fused"], tmp_path / "x.png") == []


def test_the_context_chart_is_a_panel_per_bs_with_a_line_per_backend_and_the_floor(monkeypatch, tmp_path):
    figures = _drawn(monkeypatch)
    rows = _rows(RESULTS / "h200-context-kept")
    assert report.context_chart(rows, tmp_path / "context.png") == [tmp_path / "context.png"]
    axes = figures[0].axes
    assert [ax.get_title() for ax in axes] == [f"qwen3-0.6b, bs {bs}" for bs in (1, 8, 32)]
    lines = {line.get_label(): line for line in axes[2].get_lines()}
    flex = sorted((r["context_len"], r["median_ms"]) for r in rows if r["bs"] == 32 and r["variant"] == "graphed flex")
    assert list(zip(lines["graphed flex"].get_xdata(), lines["graphed flex"].get_ydata())) == flex
    assert lines["floor"].get_linestyle() == "--" and "ms" in axes[0].get_ylabel() and "context" in axes[0].get_xlabel()
    assert report.context_chart(_rows(RESULTS / "h100-ladder"), tmp_path / "x.png") == []  # one context


def test_a_job_that_never_ran_is_a_row_named_by_its_label():
    """A job whose process died before it recorded anything has a label and a reason, but no config: the report
    shows it under its name, not as a row of `None`s."""
    from harness.analysis.report import table_markdown
    from harness.analysis.rows import row_of
    from harness.record import JobRecord

    died = JobRecord(label="qwen3-0.6b bs=8 ctx=16 cache=auto eager", config={}, status="FAILED",
                     reason="the job's process on GPU 0 died before it recorded a result")
    row = next(line for line in table_markdown([row_of(died)]).splitlines() if "died" in line)
    assert row.startswith("| qwen3-0.6b bs=8 ctx=16 cache=auto eager | - | - | - |") and "None" not in row


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_run_whose_step_replayed_no_cuda_graph_is_marked_so_beside_its_median_in_the_tables():
    from rich.console import Console

    from harness.analysis.rows import row_of
    from harness.analysis.summary import table
    from harness.record import JobRecord

    def record(graphs: str) -> JobRecord:
        return JobRecord(label=f"tiny bs=1 compiled {graphs[:4]}", config={"bs": 1, "mode": "compiled"},
                         status="FINISHED", metrics={"step_ms_median": 2.5}, mode_tags={"cuda_graphs": graphs})

    lost, replayed = record("NONE replayed: reduce-overhead records CUDA graphs, ..."), record("2 replayed a step")
    lines = table_markdown([row_of(lost), row_of(replayed)]).splitlines()
    assert "2.500 ms no CUDA graph replayed" in next(line for line in lines if "NONE" in line)
    assert "no CUDA graph" not in next(line for line in lines if "2 re" in line)
    console = Console(width=250, record=True)
    console.print(table([lost, replayed]))
    printed = console.export_text().splitlines()
    assert "2.500 no CUDA graph replayed" in next(line for line in printed if "NONE" in line)
    assert "no CUDA graph" not in next(line for line in printed if "2 re" in line)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the graphed jobs that fail without CUDA")
def test_report_on_a_resumed_sweep(workdir, capfd, monkeypatch):
    sweep = ["-m", *FAST, "bs=1,2", "cache_len=64,128", "mode=eager,graphed"]
    first = run_in_process(capfd, monkeypatch, *sweep)
    assert first.returncode == 1  # the graphed jobs need CUDA
    link = next(line for line in first.stdout.splitlines() if line.startswith("Compare this sweep's runs: "))
    finished = [c for c in runs_by_kind(store(workdir))[2] if c.info.status == "FINISHED"]
    assert len(finished) == 4 and sorted(re.findall(r"%22([0-9a-f]{32})%22", link)) == sorted(
        c.info.run_id for c in finished)  # the failed graphed runs are left out of the comparison
    again = run_in_process(capfd, monkeypatch, *sweep, "resume=true")
    assert "0 finished, 4 failed, 4 skipped (resume)" in again.stdout
    assert [line for line in again.stdout.splitlines() if line.endswith(" ")] == []  # no padding into a pipe
    db = workdir / "mlruns" / "mlflow.db"
    report = run_in_process(capfd, monkeypatch, "--tracking-uri", f"sqlite:///{db}", "report", "--out", "rep")
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
    assert "(no job runs in this sweep)" in capfd.readouterr().out
    assert "No such file or directory: '/proc/nope'" in one_line_error(capfd, "report", "--out", "/proc/nope")
