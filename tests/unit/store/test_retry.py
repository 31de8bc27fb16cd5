"""The store's retries (harness/store/retry.py)."""
from __future__ import annotations

from harness.errors import ConfigError
from harness.store import retry


def test_only_a_whole_5xx_status_counts_as_a_passing_store_error():
    """A port such as 45045 holds "504": a busy port is the user's error, never a store to wait for."""
    assert not retry.is_transient(ConfigError("port 45045 on 127.0.0.1 is already in use: pass --port"))
    assert retry.is_transient(RuntimeError("API request failed with error code 503 != 200"))
    assert retry.is_transient(RuntimeError("504 Gateway Time-out")) and not retry.is_transient(RuntimeError("run 5040"))
