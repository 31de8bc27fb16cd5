"""What a reader meets first: a sweep's parent named by what it varied, and the compact results table (the README's
and a parent run's description), which never merges two runs into one cell."""
from __future__ import annotations

import copy
from pathlib import Path

from harness.analysis.headline import headline_markdown
from harness.analysis.report import latest_of_each_config
from harness.cli.app import sweep_name

H200_RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "h200-qwen3-0.6b"


def test_a_parent_is_named_by_what_its_sweep_varied():
    assert sweep_name(["bs=1,2,4,8", "mode=eager,graphed"], {}) == "bs=1,2,4,8 × mode=eager,graphed"
    # a preset's axes are named too, unless the command line set them
    assert sweep_name(["+experiment=design-card", "bs=1,16"], {"bs": "1,2,4,8", "mode": "eager,graphed"}) == \
        "bs=1,16 × mode=eager,graphed · experiment=design-card"
    assert sweep_name(["model=tiny", "bs=range(1,3)", "dtype=bf16,fp32"], {}) == "bs=range(1,3) × dtype=bf16,fp32 · model=tiny"
    assert sweep_name([], {}) == "sweep of the defaults"
    assert sweep_name(["tracking.uri=https://alice:s3cret@host/x", "bs=1,2", "hydra/launcher=gpus", "resume=true",
                       "hydra.launcher.gpus=[0,1]"], {}) == "bs=1,2"  # where it is stored is not what it measures


def test_the_headline_table_is_the_runs_medians_and_their_speedups():
    records = latest_of_each_config(H200_RESULTS)[1]
    by_label = {r.label: r.metrics["step_ms_median"] for r in records}
    eager, graphed = by_label["qwen3-0.6b bs=1 ctx=16 cache=256 eager"], by_label["qwen3-0.6b bs=1 ctx=16 cache=256 graphed"]
    text = headline_markdown(records)
    row = next(line for line in text.splitlines() if line.startswith("| qwen3-0.6b | 16 | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:5] == [f"{eager:.3f}", f"{graphed:.3f}"] and cells[6] == f"{eager / graphed:.2f}x"
    assert text.splitlines()[0].startswith("GPU NVIDIA H200; dtype bf16; cache_len 256; torch 2.11.0+cu130")
    assert text.splitlines()[0].endswith("6 of 6 runs passed verification")


def test_the_headline_never_merges_runs_that_differ_in_a_key_it_does_not_show():
    records = latest_of_each_config(H200_RESULTS)[1]
    fp32 = copy.deepcopy(records[0])
    fp32.config["dtype"], fp32.result_id = "fp32", "another"
    text = headline_markdown([*records, fp32])
    assert "| model | context | dtype | bs |" in text  # the key the runs differ in becomes a column
    assert sum(line.startswith("| qwen3-0.6b | 16 |") for line in text.splitlines()) == 3
    assert "dtype bf16, fp32" in text.splitlines()[0]
    twin = copy.deepcopy(records[0])
    twin.config["seed"], twin.result_id = 1, "seed1"  # a key the table has no column for: said, not dropped
    assert "Shown once, the later of two runs of one cell" in headline_markdown([*records, twin])


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
