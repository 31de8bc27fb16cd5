"""`harness ab` repeating in fresh processes, whose compiled arms compile or read the cache a process before them
wrote."""
from __future__ import annotations

import json
import os

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


def test_a_compiled_arm_says_whether_its_kernels_were_compiled_or_read_from_the_cache(workdir, monkeypatch):
    # two machines' A/Bs of one compiled config ran the same kernels only where the second read the first's cache
    for variable, folder in (("HARNESS_CACHE_DIR", ""), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        monkeypatch.setenv(variable, str(workdir / "cache" / folder))  # a cold cache, whatever torch's imports set
    arms = ["+inductor.epilogue_fusion=false", "+inductor.epilogue_fusion=true"]
    common = [*TINY, "mode=compiled-nograph", "dtype=fp32", "decode_tokens=4", "--pairs", "2", "--threshold", "50%"]
    assert cli.main(["ab", *arms, *common, "--processes", "2", "--out", "cold"]) in (0, 1)
    cold = json.loads((workdir / "cold" / "ab.json").read_text())
    first, second = zip(*cold["prepared"])  # each arm's line from each process
    assert all(line.startswith("0 of") and not line.endswith(" 0 compiled") for line in first), first  # cold
    assert all(not line.startswith("0 of") and line.endswith(" 0 compiled") for line in second), second  # read
    assert "prepared in" in (workdir / "cold" / "ab.md").read_text()
    # --fresh-compiles: a process of its own, whose empty cache folders make it compile again, the cache above warm
    assert cli.main(["ab", *arms, *common, "--fresh-compiles", "--out", "fresh"]) in (0, 1)
    fresh = json.loads((workdir / "fresh" / "ab.json").read_text())
    assert fresh["fresh_compiles"] and fresh["processes"] == 1 and len(fresh["process_ratios"]) == 1
    assert all(line.startswith("0 of") and not line.endswith(" 0 compiled") for arm in fresh["prepared"] for line in arm)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(workdir / "cache" / "inductor")  # this process's, given back
