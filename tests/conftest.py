"""Fixtures the tests share, and the markers a test's folder gives it; plain helpers are in tests/support.py."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.kernels.triton_runtime import interpret_without_gpu

interpret_without_gpu()  # as the command line does, before anything imports triton: its interpreter on a CPU

from harness import models  # noqa: E402
from harness.measure import references  # noqa: E402
from harness.modes import kept_context  # noqa: E402
from tests.support import FAST, SECRET, MlflowServer, run_harness  # noqa: E402

TESTS = Path(__file__).resolve().parent
# A test's first folder under tests/ gives it this marker; the default run (pyproject's addopts) leaves both out
FOLDER_MARKS = {"e2e": "e2e", "gpu": "gpu"}


def folder_mark(path: Path) -> str | None:
    """The marker a test file's first folder under tests/ gives it (tests/e2e/... -> e2e), or None."""
    try:
        first = Path(path).resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return FOLDER_MARKS.get(first)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        mark = folder_mark(item.path)
        if mark is not None:
            item.add_marker(mark)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """A fresh folder for outputs/ and mlruns/, with no tracking URI inherited."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def no_saved_compiled_steps(monkeypatch):
    """No compiled step saved on disk by one test (or an earlier run of the suite) is loaded by another: a saved step
    keeps no guard on the Python it traced, and some tests patch a model's computation in ways its key cannot see.
    The tests of saved steps turn them on in a folder of their own (tests/unit/modes/test_saved_step.py,
    tests/e2e/test_saved_steps.py)."""
    monkeypatch.setenv("HARNESS_SAVE_COMPILED_STEPS", "0")


@pytest.fixture(autouse=True)
def no_kept_references():
    """Each test starts without an earlier test's eager references or kept context: some tests patch a model's
    computation in ways their keys (weights, shape, inputs) cannot see; the tests of keeping them say so themselves."""
    references.forget()
    kept_context.drop()
    yield
    references.forget()
    kept_context.drop()


@pytest.fixture
def fresh_model_cache(request):
    """No model built by an earlier test, and none left for a later one: the model cache (and the context kept from
    one of its models) is emptied before and after. For a fast test on a CPU that is all: the full garbage
    collection release_models() adds would take a large share of a tiny job's time, to free a model of a few MB.
    A slow test (Inductor's compiles: Dynamo's cache entries for a model go only with it) and any test on a GPU
    (its memory must come back) release the models whole."""
    whole = torch.cuda.is_available() or request.node.get_closest_marker("slow") is not None

    def release():
        if whole:
            models.release_models()
        else:
            models._cache.clear()
            kept_context.drop()

    release()
    yield
    release()


@pytest.fixture
def torch_threads():
    """torch's thread count restored after the test (a job sets its own)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A temporary folder of this test's own as the process's, to see what a command leaves in it."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its tables made and nothing logged: a copy of the harness's own empty store
    (tracking.start_as_the_empty_store; migrated once per MLflow version), opened once so that MLflow adds its
    Default experiment, or migrates it itself where the copy could not be made."""
    from mlflow.tracking import MlflowClient

    from harness.store.tracking import start_as_the_empty_store

    path = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    start_as_the_empty_store(path)
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store_in_tmp_path(tmp_path, empty_store_file) -> str:
    """A store of this test's own at tmp_path/mlflow.db, a copy of the empty one; its URI."""
    shutil.copyfile(empty_store_file, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "server")
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def served_sweep(tmp_path_factory):
    """One 2-job sweep logged to a real `mlflow server` through a tracking URI with credentials in it, and
    with a secret in the environment: shared by the tests that read it back (no secret anywhere, the
    report against a server, the UI in a browser), so the server and the sweep are paid once."""
    root = tmp_path_factory.mktemp("served")
    server = MlflowServer(root / "server")
    server.start()
    uri = server.url.replace("http://", f"http://alice:{SECRET}@")
    sweep = run_harness("-m", *FAST, "bs=1,2", f"tracking.uri={uri}", cwd=root,
                        env={"HF_TOKEN": SECRET, "HARNESS_SECRET": SECRET})
    yield SimpleNamespace(root=root, url=server.url, uri=uri, sweep=sweep)
    server.stop()
