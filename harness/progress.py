"""Progress lines on stderr, one per phase change: never printed from inside the timed loop."""
from __future__ import annotations

import sys


def say(line: str) -> None:
    print(f"[harness] {line}", file=sys.stderr, flush=True)
