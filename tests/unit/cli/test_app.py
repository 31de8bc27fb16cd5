"""The sweep's parent run (harness/cli/app.py): its name and the jobs a resumed sweep skipped."""
from __future__ import annotations

import pytest

from harness.cli.app import sweep_name
from tests.support import FAST


@pytest.mark.slow
def test_a_resumed_sweeps_parent_shows_the_skipped_jobs_numbers_and_links_the_earlier_sweep(tmp_path, monkeypatch,
                                                                                             torch_threads):
    """After an interrupted sweep, `resume=true` skipped the finished jobs, and its parent's table left them out
    ("Not in the table (SKIPPED)"): the results were split over two parents, unlinked."""
    from harness.cli.main import main
    from tests.support import runs_by_kind, store

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["-m", *FAST, "device=cpu", "bs=1"]) == 0
    _, (first,), (done,) = runs_by_kind(store(tmp_path))
    assert main(["-m", *FAST, "device=cpu", "bs=1,2", "resume=true"]) == 0
    _, parents, _ = runs_by_kind(store(tmp_path))
    (resumed,) = [p for p in parents if p.info.run_id != first.info.run_id]
    table = resumed.data.tags["mlflow.note.content"]
    assert "SKIPPED" not in table
    rows = [line for line in table.splitlines() if line.startswith("| tiny | 8 |")]
    assert len(rows) == 2 and f"{done.data.metrics['step_ms_median']:.3f}" in rows[0]
    assert resumed.data.tags["harness.resumes"] == first.info.run_id
    assert store(tmp_path).get_run(first.info.run_id).data.tags["harness.resumed_by"] == resumed.info.run_id


def test_a_parent_is_named_by_what_its_sweep_varied():
    assert sweep_name(["bs=1,2,4,8", "mode=eager,graphed"], {}) == "bs=1,2,4,8 × mode=eager,graphed"
    # a preset's axes are named too, unless the command line set them
    assert sweep_name(["+experiment=design-card", "bs=1,16"], {"bs": "1,2,4,8", "mode": "eager,graphed"}) == \
        "bs=1,16 × mode=eager,graphed · experiment=design-card"
    assert sweep_name(["model=tiny", "bs=range(1,3)", "dtype=bf16,fp32"], {}) == "bs=range(1,3) × dtype=bf16,fp32 · model=tiny"
    assert sweep_name([], {}) == "sweep of the defaults"
    assert sweep_name(["tracking.uri=https://alice:s3cret@host/x", "bs=1,2", "hydra/launcher=gpus", "resume=true",
                       "hydra.launcher.gpus=[0,1]"], {}) == "bs=1,2"  # where it is stored is not what it measures
