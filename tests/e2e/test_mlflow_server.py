"""A sweep logged to a real `mlflow server`."""
from __future__ import annotations

import pytest

from tests.support import SECRET, run_harness

pytestmark = pytest.mark.xdist_group("served")  # with the browser test: the served sweep is paid once a worker


def test_no_secret_reaches_a_store_a_file_or_the_console(served_sweep):
    proc, root = served_sweep.sweep, served_sweep.root
    assert proc.returncode == 0, proc.stderr
    report = run_harness("--tracking-uri", served_sweep.uri, "report", "--out", "rep", cwd=root)  # a server too
    assert report.returncode == 0 and "| tiny | 8 | 64 | 1 |" in report.stdout and "| tiny | 8 | 64 | 2 |" in report.stdout
    assert SECRET not in proc.stdout + proc.stderr + report.stdout + report.stderr
    leaks = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []  # the server's database and artifacts, outputs/ (result.json, .hydra, sweep.json)
    assert len(list(root.glob("server/artifacts/**/config.yaml"))) == 2  # the scan saw the artifacts
    assert len(list(root.glob("server/artifacts/*/*/artifacts/summary.md"))) == 1  # on the parent, at the top
    assert not (root / "mlruns").exists()  # everything went to the server
