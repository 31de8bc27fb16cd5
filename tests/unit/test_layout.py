"""The test layout's own rule (tests/conftest.py): a test's folder gives it its marker, so that the default run
(pyproject's addopts) leaves out the end-to-end and GPU tests by where they live, not by a mark each file repeats."""
from __future__ import annotations

from tests.conftest import TESTS, folder_mark


def test_a_test_under_e2e_or_gpu_is_marked_by_its_folder_and_one_under_unit_is_not():
    """Bugs caught: a marker taken from any folder of the path (tests/unit/e2e_helpers/... marked e2e), or from the
    file's own folder only (tests/e2e/slurm/test_x.py left unmarked, so the default run starts SLURM)."""
    assert folder_mark(TESTS / "e2e" / "test_sweep.py") == "e2e"
    assert folder_mark(TESTS / "e2e" / "slurm" / "test_x.py") == "e2e"
    assert folder_mark(TESTS / "gpu" / "test_kernels.py") == "gpu"
    assert folder_mark(TESTS / "unit" / "measure" / "test_job.py") is None
    assert folder_mark(TESTS / "unit" / "e2e" / "test_x.py") is None
    assert folder_mark(TESTS.parent / "e2e" / "test_x.py") is None  # outside tests/


def test_this_unit_test_carries_neither_marker(request):
    assert request.node.get_closest_marker("e2e") is None and request.node.get_closest_marker("gpu") is None
