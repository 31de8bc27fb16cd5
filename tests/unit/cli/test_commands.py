"""The subcommands (harness/cli/commands.py) in process."""
from __future__ import annotations

import pytest

from tests.support import eager_only_records


def written_sweep(folder, median: float):
    """A sweep folder holding the result files of two finished eager runs."""
    from harness.store import results

    for record in eager_only_records():
        record.step_ms = [record.metrics["step_ms_median"] * median * (1 + 0.001 * (i % 5)) for i in range(64)]
        record.config_hash = f"config-bs{record.config['bs']}"
        results.write(folder / str(record.config["bs"]), record)
    return folder


@pytest.mark.slow
def test_report_and_compare_leave_no_harness_folder_in_tmp(tmp_path, monkeypatch, own_tmp):
    from harness.cli import commands

    monkeypatch.chdir(tmp_path)
    base, cand = written_sweep(tmp_path / "base", 1.0), written_sweep(tmp_path / "cand", 1.0)
    assert commands.main(["report", str(base)]) == 0
    assert commands.main(["compare", str(base), str(cand)]) == 0
    assert list(own_tmp.iterdir()) == []
    assert (base / "report" / "summary.md").is_file()  # kept inside the sweep folder
    assert len(list((tmp_path / "outputs" / "compares").glob("*/*/compare.md"))) == 1
