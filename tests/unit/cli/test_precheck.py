"""The checks a sweep passes before anything is created (harness/cli/precheck.py)."""
from __future__ import annotations

import pytest

from harness.cli.precheck import check_store_uri
from harness.errors import ConfigError
from tests.support import FAST


@pytest.mark.slow
def test_a_sweeps_exclude_rules_keep_a_job_they_leave_out_from_refusing_it(tmp_path, monkeypatch):
    """A job the sweep's exclude rules leave out is never run, so its config does not refuse the sweep."""
    from harness.cli.precheck import check_sweep

    with pytest.raises(ConfigError, match="graph_steps=2 applies to mode=graphed"):
        check_sweep([*FAST, "mode=eager,graphed", "graph_steps=1,2"])
    check_sweep([*FAST, "mode=eager,graphed", "graph_steps=1,2", "hydra.sweeper.exclude=[{mode:eager,graph_steps:2}]"])


@pytest.mark.parametrize("uri, says", [
    ("foo://bar", "tracking.uri=foo://bar is not a store MLflow can use"),
    ("http://host:5000/?token=abc", "carries a secret in its query string"),
])
def test_a_store_uri_that_cannot_work_is_refused(uri, says):
    with pytest.raises(ConfigError, match=says):
        check_store_uri(uri)
    check_store_uri("sqlite:////tmp/x.db")  # what MLflow takes passes
    check_store_uri("http://127.0.0.1:5000")
