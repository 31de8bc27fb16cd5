"""The compact results table (harness/analysis/headline.py): the README's and a parent run's description, which
never merges two runs into one cell."""
from __future__ import annotations

import copy
from pathlib import Path

from harness.analysis.headline import headline_markdown
from harness.analysis.report import latest_of_each_config
from tests.support import eager_only_records


RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


H200_RESULTS = RESULTS / "h200-design-card"  # qwen3-0.6b, context 16, bs 1, 2, 4, 8, eager and graphed


def test_the_headline_table_is_the_runs_medians_and_their_speedups():
    records = latest_of_each_config(H200_RESULTS)[1]
    by_label = {r.label: r.metrics["step_ms_median"] for r in records}
    eager, graphed = by_label["qwen3-0.6b bs=1 ctx=16 cache=256 eager"], by_label["qwen3-0.6b bs=1 ctx=16 cache=256 graphed"]
    text = headline_markdown(records)
    row = next(line for line in text.splitlines() if line.startswith("| qwen3-0.6b | 16 | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:5] == [f"{eager:.3f}", f"{graphed:.3f}"] and cells[5] == f"{eager / graphed:.2f}x"
    assert text.splitlines()[0].startswith("GPU NVIDIA H200; dtype bf16; cache_len 256; torch 2.11.0+cu130")
    assert text.splitlines()[0].endswith("8 of 8 runs passed verification")


def test_the_headline_never_merges_runs_that_differ_in_a_key_it_does_not_show():
    records = latest_of_each_config(H200_RESULTS)[1]
    fp32 = copy.deepcopy(records[0])
    fp32.config["dtype"], fp32.result_id = "fp32", "another"
    text = headline_markdown([*records, fp32])
    assert "| model | context | dtype | bs |" in text  # the key the runs differ in becomes a column
    batches = {r.config["bs"] for r in records}  # a row per bs in bf16, and one more: the fp32 run's
    assert sum(line.startswith("| qwen3-0.6b | 16 |") for line in text.splitlines()) == len(batches) + 1 == 5
    assert "dtype bf16, fp32" in text.splitlines()[0]
    twin = copy.deepcopy(records[0])
    twin.config["seed"], twin.result_id = 1, "seed1"  # a key the table has no column for: said, not dropped
    assert "Shown once, the later of two runs of one cell" in headline_markdown([*records, twin])


def test_the_headline_gives_the_floor_and_the_fastest_runs_share_of_it():
    """The floor column is the fastest run's own floor_ms, its share that floor over the fastest run's median; the
    header names the mode where every row's fastest is the same one, each cell names it where they differ; eager's
    variants are never a speedup column, and a mode with no eager to compare has no speedup column. Bugs caught: the
    share taken from the slowest or the eager run, a header naming one mode over rows another mode won, `eager
    sdpa-nocudnn` shown as a 1.00x speedup, a speedup column of dashes."""
    records = latest_of_each_config(RESULTS / "h100-ladder")[1]
    text = headline_markdown(records)
    header = text.splitlines()[2]
    assert header.endswith("| fused speedup | floor ms | fused share of floor |") and "eager speedup" not in header
    fused = next(r for r in records if r.label == "qwen3-8b bs=32 ctx=32 cache=256 fused")
    row = next(line for line in text.splitlines() if line.startswith("| qwen3-8b | 32 | 32 |"))
    floor, median = fused.metrics["floor_ms"], fused.metrics["step_ms_median"]
    assert row.split("|")[-3:-1] == [f" {floor:.3f} ", f" {100 * floor / median:.1f}% "]
    # a row whose fastest run is compiled: the cells name their mode, the header no longer does
    slow = copy.deepcopy(fused)
    slow.metrics["step_ms_median"] = 1000.0
    text = headline_markdown([r for r in records if r is not fused] + [slow])
    assert text.splitlines()[2].endswith("| floor ms | fastest's share of floor |")
    compiled = next(r for r in records if r.label == "qwen3-8b bs=32 ctx=32 cache=256 compiled")
    row = next(line for line in text.splitlines() if line.startswith("| qwen3-8b | 32 | 32 |"))
    share = 100 * compiled.metrics["floor_ms"] / compiled.metrics["step_ms_median"]
    assert row.endswith(f"| {share:.1f}% (compiled) |")
    only_fused = headline_markdown([r for r in records if r.config["mode"] == "fused"])
    assert "speedup" not in only_fused and "| fused ms/step | floor ms | fused share of floor |" in only_fused
    nocudnn = copy.deepcopy([r for r in records if r.config["mode"] in ("eager", "graphed")])
    for r in nocudnn:
        r.config["attn"], r.varying = "sdpa-nocudnn", ["attn"]
    assert "eager sdpa-nocudnn speedup" not in headline_markdown(nocudnn)


def test_a_headline_of_runs_without_a_floor_has_no_floor_columns():
    records = copy.deepcopy(latest_of_each_config(H200_RESULTS)[1])
    for r in records:
        r.metrics.pop("floor_ms", None)
    assert "floor" not in headline_markdown(records)


def test_an_eager_only_sweeps_description_table_has_as_many_header_cells_as_delimiters():
    from harness.analysis.headline import headline_markdown

    lines = headline_markdown(eager_only_records(), conditions_first=False).splitlines()
    header, delimiter, *rows = lines[:4]
    cells = lambda line: line.strip().strip("|").split("|")  # noqa: E731
    assert len(cells(header)) == len(cells(delimiter)) == len(cells(rows[0])) == 4, lines[:4]
