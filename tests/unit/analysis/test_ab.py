"""`harness ab`'s analysis (harness/analysis/ab.py): the verdict from the ratio interval, the pairs that would
decide it, the arms' differences and names."""
from __future__ import annotations

import pytest

from harness.analysis.ab import block_spread_pct, differing_keys, pairs_to_decide, process_ratios, verdict
from harness.measure.timing import DecodeTiming
from tests.support import run_config, FAST


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_ab_arms_that_differ_in_dtype_are_named_apart():
    """The A/B's result names each arm by the keys they differ in first (its arms were both `tiny bs=1 ... eager`)."""
    import torch as _torch

    from harness.analysis.ab import result_of
    from harness.measure.ab import Arm
    from harness.measure.timing import DecodeTiming

    def timed(ms: float) -> DecodeTiming:
        return DecodeTiming([ms, ms * 1.01, ms * 0.99], 3 * ms, "host", 1, _torch.zeros(3, 1, dtype=_torch.long))

    a = Arm(run_config(*FAST, "dtype=fp32"), [timed(2.0), timed(2.0)])
    b = Arm(run_config(*FAST, "dtype=bf16"), [timed(3.0), timed(3.0)])
    result = result_of(a, b, {}, 0.03)
    assert (result.arm_a, result.arm_b) == ("dtype=fp32 tiny bs=1 ctx=8 cache=64 eager",
                                            "dtype=bf16 tiny bs=1 ctx=8 cache=64 eager")
