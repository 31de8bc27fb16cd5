"""The harness's one folder for what outlives a process: $HARNESS_CACHE_DIR, by default ~/.cache/harness. Under it:
compile/ (compiled kernels, saved compiled steps, tuned fused plans), store/ (an empty MLflow store, migrated once,
that each new embedded store starts as), logs/ (a failed command's log) and ceilings.json (each GPU's measured copy
and compute rates)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("HARNESS_CACHE_DIR") or Path.home() / ".cache" / "harness")
