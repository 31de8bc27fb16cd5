"""Fixtures the tests share; plain helpers are in tests/support.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness import models
from tests.support import MlflowServer


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """A fresh folder for outputs/ and mlruns/, with no tracking URI inherited."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fresh_model_cache():
    """No model built by an earlier test, and none left for a later one."""
    models.release_models()
    yield
    models.release_models()


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "server")
    server.start()
    yield server.url
    server.stop()
