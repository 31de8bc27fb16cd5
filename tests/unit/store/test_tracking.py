"""The tracking store (harness/store/tracking.py): run ids by prefix, and a new embedded store made from the empty
one."""
from __future__ import annotations

import os

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


def test_a_new_embedded_store_starts_as_the_empty_one_migrated_once_and_holds_only_its_own(tmp_path, monkeypatch):
    """MLflow migrates a new SQLite store from its first schema, seconds of CPU in every new sweep folder: the
    migrations run once, into the empty store under the cache folder, and each new store starts as its copy. Each
    still gets its own Default experiment (none is copied) and sees only what was logged to it."""
    import sqlite3

    import mlflow.store.db.utils as db_utils

    from harness.store import tracking

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    migrated, migrate = [], db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables", lambda engine: (migrated.append(engine.url), migrate(engine)))
    uris = [f"sqlite:///{tmp_path / name / 'mlflow.db'}" for name in ("one", "two")]
    first, second = (tracking.client(uri) for uri in uris)
    (empty,) = (tmp_path / "cache" / "store").glob("empty-mlflow-*.db")
    assert [str(url.database) for url in migrated] == [str(empty.with_suffix(f".{os.getpid()}.partial"))]
    assert sqlite3.connect(empty).execute("select count(*) from experiments").fetchone() == (0,)
    first.create_experiment("only-in-one")
    assert [e.name for e in first.search_experiments()] == ["only-in-one", "Default"]
    assert [e.name for e in second.search_experiments()] == ["Default"]


def test_a_store_is_made_by_mlflow_itself_where_the_empty_one_cannot_be_built(tmp_path, monkeypatch):
    from harness.store import tracking

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))

    def moved(_):
        raise ImportError("cannot import name '_initialize_tables'")

    monkeypatch.setattr(tracking, "_build_empty_store", moved)
    store = tracking.client(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    assert [e.name for e in store.search_experiments()] == ["Default"]
    assert not (tmp_path / "store" / "mlflow.copying").exists()
