"""Credentials never leave the process (harness/store/redact.py)."""
from __future__ import annotations

from harness.store.redact import redact


def test_credentials_in_a_tracking_uri_are_redacted():
    assert redact("https://user:tok3n@mlflow.example:5000/x") == "https://mlflow.example:5000/x"
    assert redact("sqlite:////tmp/mlruns/mlflow.db") == "sqlite:////tmp/mlruns/mlflow.db"
    assert redact("tracking.uri=http://a:b@h:1/p?x=1&access_token=abc&sig=d#f") == "tracking.uri=http://h:1/p?x=1&access_token=***&sig=***#f"
    assert redact("bs=4 mode=graphed") == "bs=4 mode=graphed"
