"""`harness ab`: two configs timed in one process in alternating blocks, their ratio from a paired bootstrap, a
verdict, and a run in the store."""
from __future__ import annotations

import json
import os

import pytest

from harness.analysis.ab import block_spread_pct, differing_keys, pairs_to_decide, process_ratios, verdict
from harness.cli import commands as cli
from harness.measure.ab import balanced_order
from harness.measure.timing import DecodeTiming
from harness.measure.stats import paired_ratio_interval
from tests.support import run_config, store

TINY = ["model=tiny", "device=cpu", "warmup=2", "context_len=8"]


def test_the_verdict_reads_the_whole_interval_against_the_threshold():
    assert verdict(1.02, 1.05, 0.01) == "slower" and verdict(0.95, 0.98, 0.01) == "faster"
    assert verdict(0.995, 1.005, 0.01) == "same"
    assert verdict(0.995, 1.02, 0.01) == "ambiguous"  # straddles 1.01: more pairs would tell, `same` would hide it
    assert verdict(0.98, 1.005, 0.01) == "ambiguous"


def test_an_ambiguous_verdict_says_how_many_pairs_would_decide_it():
    """An H200's PDL A/B of Inductor's kernels: B / A 0.9768, interval 0.9557-0.9925 after 320 pairs, straddling
    0.99. Its upper side (0.0157) must shrink to the ratio's distance from 0.99 (0.0132): 320 x (0.0157 / 0.0132)^2
    = 452.7 pairs. Bugs caught: the lower side used (0.0211: 817), or the farther bound 1.01 (0.0332: 72)."""
    assert pairs_to_decide(0.9768, 0.9557, 0.9925, 0.01, 320) == 453
    assert pairs_to_decide(1.005, 0.995, 1.02, 0.01, 3) == 27  # toward `same`: the side above must reach 1.01
    assert pairs_to_decide(0.99, 0.98, 1.0, 0.01, 8) is None  # on the bound: no number of pairs decides
    # block medians 1, 1, 1.1, 0.9: sd 0.0707 of a median of 1 (a steady arm's blocks would give 0)
    assert block_spread_pct([[1.0, 1.0], [1.0, 1.0], [1.1, 1.1], [0.9, 0.9]]) == pytest.approx(7.0711, abs=1e-3)


def test_the_arms_differences_name_a_default_value_as_it_is():
    """Arm B at a key's default (`fused.pdl=true`): shown as True, where the identity alone (which leaves defaults
    out) showed None."""
    a, b = (run_config(*TINY, "mode=fused", f"fused.pdl={v}") for v in ("false", "true"))
    assert differing_keys(a, b) == {"fused.pdl": [False, True]}
    a, b = run_config(*TINY, "bs=2"), run_config(*TINY, "bs=1")
    assert differing_keys(a, b) == {"bs": [2, 1]}


def test_each_process_ratio_is_its_own_blocks_medians():
    """Two processes, B / A 1.0 in the first and 1.2 in the second, blocks interleaved as the pairs ran. Bugs
    caught: the processes pooled (one ratio), or a pair counted in the wrong process."""
    blocks_a = [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0], [2.0, 2.0]]
    blocks_b = [[1.0, 1.0], [2.4, 2.4], [1.0, 1.0], [2.4, 2.4]]
    assert process_ratios(blocks_a, blocks_b, [0, 1, 0, 1]) == pytest.approx([1.0, 1.2])
    assert process_ratios(blocks_a, blocks_b, [0, 0, 0, 0]) == pytest.approx([1.7 / 1.5])  # one process: all steps


def test_an_ab_undecided_across_processes_asks_for_more_processes_not_pairs():
    """Two processes that compiled afresh, B / A 0.98 in one and 1.01 in the other (what two compiles of one Inductor
    config gave on one H200): the interval spans both, straddles 0.99, and only more processes narrow it. Bug
    caught: `--pairs N` advised, which would narrow nothing."""
    import torch

    from harness.analysis.ab import markdown, result_of
    from harness.measure.ab import Arm

    cfg = run_config(*TINY)
    timing = [DecodeTiming([v] * 4, 4 * v, "host", 1, torch.empty(0)) for v in (1.0, 1.0, 1.0, 1.0)]
    arm_a, arm_b = Arm(cfg, list(timing)), Arm(cfg)
    arm_b.blocks = [DecodeTiming([v] * 4, 4 * v, "host", 1, torch.empty(0)) for v in (0.98, 0.98, 1.01, 1.01)]
    result = result_of(arm_a, arm_b, {}, 0.01, owners=[0, 0, 1, 1], fresh_compiles=True)
    assert result.verdict == "ambiguous" and result.process_ratios == pytest.approx([0.98, 1.01])
    assert result.pairs_to_decide is None and result.processes_to_decide >= 2
    text = markdown(result)
    assert "- B / A in each process (each compiled afresh): 0.9800, 1.0100" in text
    assert f"about {result.processes_to_decide} processes would decide it" in text and "--pairs" not in text


def test_pairs_from_several_processes_are_drawn_process_by_process():
    """Four processes, each with B / A constant inside it (1.0, 1.1, 1.2 and 1.3: a compile's choice per process).
    Drawn process by process, the interval spans what a fifth process could show; drawn as 40 pairs of one process
    (the bug: the processes' pairs pooled), it would claim 1.1-1.2."""
    blocks_a = [[1.0] * 5] * 40
    blocks_b = [[ratio] * 5 for ratio in (1.0, 1.1, 1.2, 1.3) for _ in range(10)]
    owners = [process for process in range(4) for _ in range(10)]
    assert paired_ratio_interval(blocks_a, blocks_b, processes=owners)[1:] == pytest.approx((1.0, 1.3))
    assert paired_ratio_interval(blocks_a, blocks_b)[1:] == pytest.approx((1.1, 1.2))


def test_the_ab_repeats_in_fresh_processes(workdir):
    assert cli.main(["ab", "cache_len=64", "cache_len=64", *TINY, "decode_tokens=8", "--pairs", "2", "--processes", "2",
                     "--threshold", "50%", "--out", "two"]) == 0
    result = json.loads((workdir / "two" / "ab.json").read_text())
    assert result["processes"] == 2 and result["pairs"] == 4 and len(result["blocks_b_ms"]) == 4
    assert (workdir / "two" / "ab.md").read_text().startswith("# A/B, paired in each of 2 processes")
    # eager arms compile nothing: their preparation is timed, and no compile cache line is claimed for them
    assert result["prepared"] == [[], []] and all(s > 0 for s in result["prepare_s"])
    assert cli.main(["ab", "cache_len=64", "cache_len=64", *TINY, "--processes", "0"]) == 2


def test_the_order_is_balanced():
    """Bug caught: a fixed AB AB order, which hands every second-place advantage (a warmer cache) to B."""
    order = balanced_order(4)
    assert order == list("ABBAABBA")
    firsts = order[::2]
    assert firsts.count("A") == firsts.count("B") == 2


def test_the_ratio_interval_keeps_the_pairs():
    """A drifts from 1 to 2 ms between its blocks, and B is 10% slower than A in each pair (it ran beside it). The
    paired bootstrap sees exactly 1.1; drawing A's and B's blocks apart (the bug) would mix a 1 ms block of A with a
    2.2 ms block of B and give an interval from 0.55 to 2.2."""
    blocks_a = [[1.0] * 5, [2.0] * 5, [1.0] * 5, [2.0] * 5]
    blocks_b = [[1.1] * 5, [2.2] * 5, [1.1] * 5, [2.2] * 5]
    ratio, low, high = paired_ratio_interval(blocks_a, blocks_b)
    assert ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)
    with pytest.raises(ValueError, match="paired blocks: 4 of A against 3 of B"):
        paired_ratio_interval(blocks_a, blocks_b[:3])


def _steps(blocks: list[list[float]]) -> list[float]:
    return [ms for block in blocks for ms in block]


def _as_recorded(result: dict) -> None:
    """The ratio, its interval and the verdict an A/B reports are what its recorded blocks give (load-proof: whatever
    the machine made the step times, the figures must follow from them)."""
    ratio, low, high = paired_ratio_interval(result["blocks_a_ms"], result["blocks_b_ms"])
    assert (result["ratio"], result["low"], result["high"]) == pytest.approx((ratio, low, high))
    assert result["verdict"] == verdict(low, high, result["threshold"])


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


def test_an_arm_that_compiled_nothing_is_called_out():
    """On the H200 a regional arm ran the whole-model arm's code (its line: compiled in process earlier) and the A/B
    said `same`, with nothing but that line to tell. Bug caught: the warning missing, or raised where both compiled."""
    from types import SimpleNamespace

    from harness.analysis.ab import _preparation
    from harness.modes.compiled import COMPILED_EARLIER

    compiled = "0 of 1 graphs from the FX graph cache, 1 compiled"
    served = SimpleNamespace(prepare_s=(36.1, 0.1), prepared=([compiled], [COMPILED_EARLIER]))
    both = SimpleNamespace(prepare_s=(36.1, 23.0), prepared=([compiled], [compiled]))
    eager = SimpleNamespace(prepare_s=(0.5, 0.4), prepared=([], []))
    assert any("B compiled nothing" in line for line in _preparation(served))
    assert not any("compiled nothing" in line for r in (both, eager) for line in _preparation(r))
