"""Secrets never leave the process: credentials in a URI (user:password@, token-like query values)
are cut from every string before it is printed, written to a file or sent to a store."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# the scheme's colon may be escaped (`http\://`), as Hydra writes overrides
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*\\?://)[^/@\s'\"]+@")
_SECRET_QUERY = re.compile(
    r"(?i)(?P<key>[?&;][a-z0-9_.-]*(?:token|secret|passw|pwd|key|sig|credential|auth)[a-z0-9_.-]*=)[^&;#\s'\"]+")
MASK = "***"


def redact(text: str) -> str:
    """`https://alice:s3cret@host/x?token=abc` -> `https://host/x?token=***`; other text unchanged."""
    return _SECRET_QUERY.sub(rf"\g<key>{MASK}", _USERINFO.sub(r"\g<scheme>", text))


def redact_tree(value: Any) -> Any:
    """Every string inside nested dicts, lists and tuples, redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_tree(v) for v in value)
    return value


def redact_files(folder: Path, pattern: str) -> None:
    """Rewrite, in place, files that Hydra wrote with the command line in them (.hydra/*.yaml, multirun.yaml)."""
    for path in Path(folder).glob(pattern):
        text = path.read_text()
        if (clean := redact(text)) != text:
            path.write_text(clean)
