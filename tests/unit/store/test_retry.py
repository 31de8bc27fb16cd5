"""The store's retries (harness/store/retry.py), and what a down or hung store costs a run of the CLI (in this
process)."""
from __future__ import annotations

import json
import socket
import sqlite3
import time

import pytest

from harness.errors import ConfigError
from harness.store import retry
from tests.support import FAST, QUICK_STORE, one_line_error, run_in_process


def test_only_a_whole_5xx_status_counts_as_a_passing_store_error():
    """A port such as 45045 holds "504": a busy port is the user's error, never a store to wait for."""
    assert not retry.is_transient(ConfigError("port 45045 on 127.0.0.1 is already in use: pass --port"))
    assert retry.is_transient(RuntimeError("API request failed with error code 503 != 200"))
    assert retry.is_transient(RuntimeError("504 Gateway Time-out")) and not retry.is_transient(RuntimeError("run 5040"))


class Clock:
    """time.monotonic and time.sleep on a clock that only sleeping moves."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The retries on a Clock, with no store taken for down by an earlier call."""
    clock = Clock()
    monkeypatch.setattr(retry, "time", clock)
    monkeypatch.setattr(retry, "_gave_up_at", None)
    return clock


def _down_until(clock: Clock, back_at: float):
    """A store call refused until the clock reaches back_at; the times it was tried."""
    tries = []

    def call():
        tries.append(clock.now)
        if clock.now < back_at:
            raise ConnectionError("Connection refused")
        return "logged"
    return call, tries


def test_a_store_back_before_the_budget_ends_is_found_by_a_try_at_the_end(clock, monkeypatch):
    """Doubling alone (1, 2, 4, 8, ...) gave up once the next sleep would pass the deadline: after 7 s of a 15 s
    budget, 63 s of 90, and a server that came back at 70 s of a 90 s budget lost the run."""
    monkeypatch.setenv("HARNESS_STORE_RETRY_S", "90")
    call, tries = _down_until(clock, back_at=70.0)
    assert retry.with_retries("logging", call) == "logged"
    assert max(clock.sleeps) <= retry.MAX_DELAY_S and 70.0 <= tries[-1] <= 70.0 + retry.MAX_DELAY_S


def test_a_store_down_past_the_budget_is_tried_last_at_the_budgets_end_then_taken_for_down(clock, monkeypatch):
    monkeypatch.setenv("HARNESS_STORE_RETRY_S", "15")
    call, tries = _down_until(clock, back_at=1e9)
    with pytest.raises(ConnectionError):
        retry.with_retries("logging", call)
    assert tries[-1] == 15.0 and sum(clock.sleeps) == 15.0
    assert retry.store_is_down()
    tries.clear()
    with pytest.raises(ConnectionError):  # taken for down: a later call tries once
        retry.with_retries("logging", call)
    assert len(tries) == 1


def test_an_error_that_cannot_pass_is_raised_at_once(clock):

    def bad_request():
        raise ValueError("INVALID_PARAMETER_VALUE: run name too long")
    with pytest.raises(ValueError):
        retry.with_retries("logging", bad_request)
    assert clock.sleeps == [] and not retry.store_is_down()


@pytest.mark.slow
def test_a_down_or_hung_store_costs_seconds_and_one_line(workdir, capfd, monkeypatch):
    # a store taken for down by an earlier test would be tried once here: none is (put back after the test)
    monkeypatch.setattr(retry, "_gave_up_at", None)
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections (the kernel completes them) and never answers
    start = time.monotonic()
    proc = run_in_process(capfd, monkeypatch, *FAST, env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{hung.getsockname()[1]}"})
    elapsed = time.monotonic() - start
    hung.close()
    # MLflow's own settings (7 retries of 120 s) would hold the job for minutes; the harness's budget (a 5 s
    # request timeout, 15 s of retries) for under 20 s. In process there is no start-up to pay: 40 s leaves room
    # for the tiny job on a loaded machine.
    assert proc.returncode == 3 and elapsed < 40, (elapsed, proc.stderr)  # 3: measured, not logged
    (result,) = (workdir / "outputs").glob("**/result.json")
    assert json.loads(result.read_text())["status"] == "FINISHED"
    last = proc.stdout.strip().splitlines()[-1]  # the last line says so, and how to log it later
    assert last.startswith("NOT LOGGED: 1 of 1 results did not reach the store") and "harness sync " in last
    assert f"harness sync {result.parent.parent}" in last
    monkeypatch.setattr(retry, "_gave_up_at", None)  # the run gave up on the hung store; what follows starts afresh
    not_a_database = sqlite3.DatabaseError("file is not a database")  # not transient: raised at once
    assert not retry.is_transient(not_a_database) and retry.is_transient(ConnectionError("Connection refused"))
    calls = []
    with pytest.raises(sqlite3.DatabaseError):
        retry.with_retries("logging", lambda: calls.append(1) or (_ for _ in ()).throw(not_a_database))
    assert calls == [1] and "retrying" not in capfd.readouterr().err
    for var, value in {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", **QUICK_STORE}.items():
        monkeypatch.setenv(var, value)
    for var, value in retry.http_settings().items():  # what the store's client sets, put back after the test
        monkeypatch.setenv(var, value)
    for argv in (["report"], ["sync", "outputs"], ["rerun", "0123abcd"]):
        assert "cannot reach the tracking store http://127.0.0.1:9" in one_line_error(capfd, *argv)
