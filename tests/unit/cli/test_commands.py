"""The subcommands (harness/cli/commands.py) in process; sync of what a sweep that could not reach its store left on
disk."""
from __future__ import annotations

import pytest

from harness.store import retry
from tests.support import FAST, QUICK_STORE, child_runs, eager_only_records, run_in_process, store


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


@pytest.mark.slow
def test_sync_imports_what_an_unreachable_store_missed_exactly_once_and_names_a_corrupt_file(workdir, capfd,
                                                                                             monkeypatch):
    # a store taken for down by an earlier test would be tried once here: none is (put back after the test)
    monkeypatch.setattr(retry, "_gave_up_at", None)
    down = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", **QUICK_STORE}
    with monkeypatch.context() as sweep_only:  # the down store for the sweep alone, as a subprocess's environment
        proc = run_in_process(capfd, sweep_only, "-m", *FAST, "bs=1,2,3", env=down)
    assert proc.returncode == 3 and "kept in" in proc.stderr  # a store that is down fails no job: 3, not logged
    results = sorted((workdir / "outputs").glob("**/result.json"))
    assert len(results) == 3 and not (workdir / "mlruns").exists()
    results[2].write_text('{"status": "FINI')  # a partial write
    monkeypatch.setattr(retry, "_gave_up_at", None)  # the sweep gave up on the down store; a sync starts afresh
    for expected in ("2 imported, 0 already in the store, 1 unreadable", "0 imported, 2 already in the store, 1 unreadable"):
        synced = run_in_process(capfd, monkeypatch, "sync", "outputs")
        assert synced.returncode == 1 and expected in synced.stdout, synced.stdout + synced.stderr
        assert f"{results[2].relative_to(workdir)}: not a readable result file" in synced.stderr
    children = child_runs(workdir)
    assert sorted(c.data.params["bs"] for c in children) == ["1", "2"]
    assert all(len(store(workdir).get_metric_history(c.info.run_id, "step_ms")) == 8 for c in children)
