"""The store's failures through the real CLI: sync marks a sweep killed before any job ended. (A down or hung store
and sync of what it missed run in process: tests/unit/store/test_retry.py, tests/unit/cli/test_commands.py.)"""
from __future__ import annotations

import signal

from harness.cli import commands as cli
from tests.support import FAST, run_harness, runs_by_kind, store


def test_sync_marks_an_abandoned_sweep_that_had_no_finished_job(workdir):
    killed = run_harness("-m", *FAST, "bs=1,2", cwd=workdir, env={"HARNESS_INJECT_FAULT": "sigkill:bs=1 "})
    assert killed.returncode == -signal.SIGKILL
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "RUNNING" and children == []
    assert cli.main(["sync", "outputs"]) == 0
    marked = store(workdir).get_run(parent.info.run_id)
    assert marked.info.status == "FAILED" and marked.data.tags["failure_reason"] == "abandoned"
