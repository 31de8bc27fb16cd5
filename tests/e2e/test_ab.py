"""`harness ab` repeating in fresh processes (its compiled arms, which compile or read the cache a process before
them wrote: tests/e2e/test_saved_steps.py)."""
from __future__ import annotations

import json

from harness.cli import commands as cli


TINY = ["model=tiny", "device=cpu", "warmup=2", "context_len=8"]


def test_the_ab_repeats_in_fresh_processes(workdir):
    assert cli.main(["ab", "cache_len=64", "cache_len=64", *TINY, "decode_tokens=8", "--pairs", "2", "--processes", "2",
                     "--threshold", "50%", "--out", "two"]) == 0
    result = json.loads((workdir / "two" / "ab.json").read_text())
    assert result["processes"] == 2 and result["pairs"] == 4 and len(result["blocks_b_ms"]) == 4
    assert (workdir / "two" / "ab.md").read_text().startswith("# A/B, paired in each of 2 processes")
    # eager arms compile nothing: their preparation is timed, and no compile cache line is claimed for them
    assert result["prepared"] == [[], []] and all(s > 0 for s in result["prepare_s"])
    assert cli.main(["ab", "cache_len=64", "cache_len=64", *TINY, "--processes", "0"]) == 2
