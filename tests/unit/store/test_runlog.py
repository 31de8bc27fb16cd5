"""What a job logs to the store (harness/store/runlog.py)."""
from __future__ import annotations

import pytest

from tests.support import eager_only_records


@pytest.mark.usefixtures("store_in_tmp_path")  # the store at tmp_path/mlflow.db, made in milliseconds
def test_a_jobs_median_is_logged_to_four_significant_figures_and_counts_as_they_are(tmp_path):
    from mlflow.tracking import MlflowClient

    from harness.store import runlog

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record = eager_only_records()[0]
    record.metrics = {"step_ms_median": 4.23456789, "step_ms_ci_pct": 1.23456, "parameters": 751632384.0,
                      "tokens_per_s": 236.1483}
    run_id = runlog.log_job(uri, "harness", None, record, tmp_path)
    logged = MlflowClient(uri).get_run(run_id).data.metrics
    assert (logged["step_ms_median"], logged["step_ms_ci_pct"]) == (4.235, 1.235)
    assert (logged["parameters"], logged["tokens_per_s"]) == (751632384.0, 236.1483)
