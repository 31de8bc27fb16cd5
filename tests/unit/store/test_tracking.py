"""The tracking store (harness/store/tracking.py): run ids by prefix."""
from __future__ import annotations

import pytest


@pytest.mark.usefixtures("store_in_tmp_path")  # the store at tmp_path/mlflow.db, made in milliseconds
def test_a_run_id_prefix_of_8_characters_names_the_run_where_it_is_unique(tmp_path):
    from mlflow.tracking import MlflowClient

    from harness.store import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    runs = [c.create_run(c.create_experiment(name)).info.run_id for name in ("a", "b")]
    assert tracking.get_run(uri, runs[1][:8]).info.run_id == runs[1]  # in any experiment
    assert tracking.get_run(uri, runs[0][:12]).info.run_id == runs[0]
    with pytest.raises(tracking.StoreError, match="no run"):
        tracking.get_run(uri, runs[0][:7])  # shorter than 8: not taken as a prefix
