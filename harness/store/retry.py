"""How long a store that is down, or hung, may hold a job up: a bounded budget, then the result stays on disk.

Each request waits at most HARNESS_STORE_TIMEOUT_S (default 5 s, MLflow's own default is 120 s); a call is
retried with backoff (1, 2, 4, ... s, at most MAX_DELAY_S apart) until HARNESS_STORE_RETRY_S (default 15 s)
have passed, the last try at the budget's end, and only for errors that can pass (refused or reset
connections, timeouts, 5xx, a locked database). The cap keeps a store that comes back from waiting out a long
sleep; the last try at the end keeps the whole budget (doubling alone would give up after 7 s of a 15 s
budget, 63 s of 90). Once a call has given up, the store is taken for down: later calls in the process try
once, until one succeeds.
"""
from __future__ import annotations

import os
import re
import time

from harness.progress import say

MAX_DELAY_S = 8.0  # the longest wait between two tries: a store back up is found within this
STILL_DOWN_S = 300  # after a call gave up, later calls try once for this long (or until one succeeds)
_gave_up_at: float | None = None
# Error texts of failures that a retry can outlive; any other error (a bad request, "file is not a
# database", a missing run) is raised at once.
TRANSIENT = ("connection", "timed out", "timeout", "temporarily", "unavailable", "database is locked",
             "max retries", "reset by peer", "refused", "remote end closed")
# a gateway's or server's passing refusal, as a whole number (a port such as 45045 is not one)
TRANSIENT_STATUS = re.compile(r"(?<!\d)50[234](?!\d)")


def timeout_s() -> float:
    return float(os.environ.get("HARNESS_STORE_TIMEOUT_S", "5"))


def budget_s() -> float:
    return float(os.environ.get("HARNESS_STORE_RETRY_S", "15"))


def http_settings() -> dict[str, str]:
    """MLflow's HTTP client settings, so that our budget, not MLflow's 7 retries of 120 s, bounds a call."""
    return {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": f"{timeout_s():g}",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
            # MLflow prints every ended run's URL, credentials and all; the harness prints its own, redacted
            "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


def is_transient(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return any(word in text for word in TRANSIENT) or TRANSIENT_STATUS.search(text) is not None


def with_retries(what: str, fn):
    """Call fn, retrying transient store errors with backoff inside the budget; the last error is raised."""
    global _gave_up_at
    deadline, delay = time.monotonic() + (0 if store_is_down() else budget_s()), 1.0
    while True:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - MLflow raises many types for a store that is down
            wait = min(delay, deadline - time.monotonic())
            if not is_transient(err) or wait <= 0:
                _gave_up_at = time.monotonic() if is_transient(err) else _gave_up_at
                raise
            say(f"{what}: {type(err).__name__}, retrying in {wait:.3g} s")
            time.sleep(wait)
            delay = min(2 * delay, MAX_DELAY_S)
        else:
            _gave_up_at = None
            return result


def store_is_down() -> bool:
    """Whether a call already gave up on the store in this process (so a housekeeping call may skip it)."""
    return _gave_up_at is not None and time.monotonic() - _gave_up_at < STILL_DOWN_S


def mark_down() -> None:
    global _gave_up_at
    _gave_up_at = time.monotonic()
