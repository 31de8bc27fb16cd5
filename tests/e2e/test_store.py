"""The store's failures through the real CLI: a down or hung store, sync of what it missed."""
from __future__ import annotations

import json
import signal
import socket
import sqlite3
import time

import pytest

from harness.cli import commands as cli
from harness.store import retry
from tests.support import FAST, QUICK_STORE, child_runs, one_line_error, run_harness, runs_by_kind, store


def test_sync_marks_an_abandoned_sweep_that_had_no_finished_job(workdir):
    killed = run_harness("-m", *FAST, "bs=1,2", cwd=workdir, env={"HARNESS_INJECT_FAULT": "sigkill:bs=1 "})
    assert killed.returncode == -signal.SIGKILL
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "RUNNING" and children == []
    assert cli.main(["sync", "outputs"]) == 0
    marked = store(workdir).get_run(parent.info.run_id)
    assert marked.info.status == "FAILED" and marked.data.tags["failure_reason"] == "abandoned"


def test_a_down_or_hung_store_costs_seconds_and_one_line(workdir, capsys, monkeypatch):
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections (the kernel completes them) and never answers
    start = time.monotonic()
    proc = run_harness(*FAST, cwd=workdir, env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{hung.getsockname()[1]}"})
    elapsed = time.monotonic() - start
    hung.close()
    # MLflow's own settings (7 retries of 120 s) would hold the job for minutes; the harness's budget (a 5 s
    # request timeout, 15 s of retries) for under 20 s. 60 s leaves room for a loaded machine's start-up.
    assert proc.returncode == 3 and elapsed < 60, (elapsed, proc.stderr)  # 3: measured, not logged
    (result,) = (workdir / "outputs").glob("**/result.json")
    assert json.loads(result.read_text())["status"] == "FINISHED"
    last = proc.stdout.strip().splitlines()[-1]  # the last line says so, and how to log it later
    assert last.startswith("NOT LOGGED: 1 of 1 results did not reach the store") and "harness sync " in last
    assert f"harness sync {result.parent.parent}" in last
    not_a_database = sqlite3.DatabaseError("file is not a database")  # not transient: raised at once
    assert not retry.is_transient(not_a_database) and retry.is_transient(ConnectionError("Connection refused"))
    calls = []
    with pytest.raises(sqlite3.DatabaseError):
        retry.with_retries("logging", lambda: calls.append(1) or (_ for _ in ()).throw(not_a_database))
    assert calls == [1] and "retrying" not in capsys.readouterr().err
    for var, value in {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", **QUICK_STORE}.items():
        monkeypatch.setenv(var, value)
    for argv in (["report"], ["sync", "outputs"], ["rerun", "0123abcd"]):
        assert "cannot reach the tracking store http://127.0.0.1:9" in one_line_error(capsys, *argv)


def test_sync_imports_what_an_unreachable_store_missed_exactly_once_and_names_a_corrupt_file(workdir):
    down = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", **QUICK_STORE}
    proc = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env=down)
    assert proc.returncode == 3 and "kept in" in proc.stderr  # a store that is down fails no job: 3, not logged
    results = sorted((workdir / "outputs").glob("**/result.json"))
    assert len(results) == 3 and not (workdir / "mlruns").exists()
    results[2].write_text('{"status": "FINI')  # a partial write
    for expected in ("2 imported, 0 already in the store, 1 unreadable", "0 imported, 2 already in the store, 1 unreadable"):
        synced = run_harness("sync", "outputs", cwd=workdir)
        assert synced.returncode == 1 and expected in synced.stdout, synced.stdout + synced.stderr
        assert f"{results[2].relative_to(workdir)}: not a readable result file" in synced.stderr
    children = child_runs(workdir)
    assert sorted(c.data.params["bs"] for c in children) == ["1", "2"]
    assert all(len(store(workdir).get_metric_history(c.info.run_id, "step_ms")) == 8 for c in children)
