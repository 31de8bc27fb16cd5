"""`harness ab` timed in one process (harness/measure/ab.py): balanced order, the arms' outcomes, nothing left in
/tmp."""
from __future__ import annotations

import json

import pytest

from harness.analysis.ab import verdict
from harness.cli import commands as cli
from harness.measure.ab import balanced_order
from harness.measure.stats import paired_ratio_interval
from tests.support import store, FAST


TINY = ["model=tiny", "device=cpu", "warmup=2", "context_len=8"]


def test_the_order_is_balanced():
    """Bug caught: a fixed AB AB order, which hands every second-place advantage (a warmer cache) to B."""
    order = balanced_order(4)
    assert order == list("ABBAABBA")
    firsts = order[::2]
    assert firsts.count("A") == firsts.count("B") == 2


def _steps(blocks: list[list[float]]) -> list[float]:
    return [ms for block in blocks for ms in block]


def _as_recorded(result: dict) -> None:
    """The ratio, its interval and the verdict an A/B reports are what its recorded blocks give (load-proof: whatever
    the machine made the step times, the figures must follow from them)."""
    ratio, low, high = paired_ratio_interval(result["blocks_a_ms"], result["blocks_b_ms"])
    assert (result["ratio"], result["low"], result["high"]) == pytest.approx((ratio, low, high))
    assert result["verdict"] == verdict(low, high, result["threshold"])


@pytest.mark.slow
def test_a_slowed_arm_is_slower_and_identical_arms_are_the_same(workdir, monkeypatch, capsys):
    """Asserted on the injected delay's effect, which no load can undo: a sleep of SLOW ms inside every timed step of
    an arm makes each of its steps at least SLOW ms. A loaded 2-core machine slowed the tiny model's step from a few ms
    to about 200 ms, which flipped the earlier form of this test (a 100 ms delay, ratios read as they came), so the
    delay is 500 ms: the slowed arm's verdict flips only where the other arm's median step passes 495 ms, and
    identical arms (both slowed) read `slower` or `faster` at a 50% threshold only where one arm's compute alone
    runs 250 ms a step past the other's, over every pair."""
    slow = 500.0
    monkeypatch.setattr("harness.measure.job.SLOW_MS", slow)
    monkeypatch.setenv("HARNESS_INJECT_FAULT", "slow:cache=128")  # arm B's label only
    short = [*TINY[:2], "warmup=1", "context_len=8", "decode_tokens=4", "--pairs", "2"]
    assert cli.main(["ab", "cache_len=64", "cache_len=128", *short, "--out", "slowed"]) == 1
    slowed = json.loads((workdir / "slowed" / "ab.json").read_text())
    assert len(slowed["blocks_a_ms"]) == len(slowed["blocks_b_ms"]) == 2 and len(slowed["blocks_a_ms"][0]) == 4
    assert min(_steps(slowed["blocks_b_ms"])) >= slow  # every timed step of B carries the sleep
    _as_recorded(slowed)
    assert slowed["verdict"] == "slower" and slowed["differs"] == {"cache_len": [64, 128]}
    # identical arms, both slowed alike: every step of each at least the delay, and the verdict never a change
    monkeypatch.setenv("HARNESS_INJECT_FAULT", "slow:cache=64")
    assert cli.main(["ab", "cache_len=64", "cache_len=64", *short, "--threshold", "50%", "--out", "same"]) == 0
    same = json.loads((workdir / "same" / "ab.json").read_text())
    assert len(same["blocks_a_ms"]) == len(same["blocks_b_ms"]) == 2 and len(same["blocks_b_ms"][0]) == 4
    assert min(_steps(same["blocks_a_ms"]) + _steps(same["blocks_b_ms"])) >= slow
    _as_recorded(same)
    assert same["verdict"] in ("same", "ambiguous") and same["differs"] == {}
    assert "**slower**" in capsys.readouterr().out
    assert slowed["block_spread_b_pct"] >= 0 and (same["pairs_to_decide"] is None) == (same["verdict"] != "ambiguous")
    runs = store(workdir).search_runs([store(workdir).get_experiment_by_name("harness").experiment_id],
                                      "tags.`harness.kind` = 'ab'")
    assert sorted(r.data.tags["verdict"] for r in runs) == sorted([same["verdict"], "slower"])
    assert {a.path for a in store(workdir).list_artifacts(runs[0].info.run_id)} == {"ab.md", "ab.json"}


def test_an_arm_that_cannot_run_here_is_one_line(workdir, capsys):
    assert cli.main(["ab", "mode=eager", "mode=graphed", *TINY, "decode_tokens=16", "--pairs", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mode=graphed needs a CUDA GPU" in err[0]
    assert cli.main(["ab", "bs=1", "bs=2", *TINY, "decode_tokens=16", "--pairs", "1"]) == 2
    assert "--pairs=1: use at least 2" in capsys.readouterr().err


@pytest.mark.slow
def test_ab_leaves_no_harness_folder_in_tmp(tmp_path, monkeypatch, own_tmp, torch_threads):
    from harness.cli import commands

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert commands.main(["ab", "dtype=fp32", "dtype=bf16", *FAST, "device=cpu", "--pairs", "2"]) in (0, 1)
    assert [p.name for p in own_tmp.iterdir() if p.name.startswith("harness-")] == []
    assert len(list((tmp_path / "outputs" / "ab").glob("*/*/ab.md"))) == 1
