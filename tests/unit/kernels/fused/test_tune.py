"""harness/kernels/fused/tune.py (fused.tune): a product's plan chosen by timing the step. Here (Triton's interpreter)
the choices are checked to change how a product launches and never what it computes, the descent to take a choice
only where it times faster, and a tuned plan to be kept."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan, tune as fused_tune
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import PRODUCT_KINDS, PlanChoice, plan
from tests.unit.kernels.fused.support import decode_like_eager, fused_and_eager


@pytest.mark.slow
@pytest.mark.parametrize("kind, choice", [("o", PlanChoice(per_sm=1, packed=False, warps=4)),
                                          ("qkv", PlanChoice(per_sm=4, packed=False, warps=8)),
                                          ("gate_up", PlanChoice(per_sm=2, packed=False, warps=4)),
                                          ("lm_head", PlanChoice(per_sm=2, packed=False, warps=8))])
def test_a_replanned_product_launches_differently_and_computes_eager_logits(kind, choice):
    eager, run, decoder = fused_and_eager()
    trial = decoder.replanned(kind, choice)
    before, after = decoder.products()[kind], trial.products()[kind]
    assert after.choice == choice and not after.packed and before.packed
    assert after.weight.data_ptr() != before.weight.data_ptr()  # its own weights, as the kernel reads them now
    for other in set(PRODUCT_KINDS) - {kind}:  # the rest shared, not packed again
        assert trial.products()[other] is decoder.products()[other]
    assert trial.residual.data_ptr() != decoder.residual.data_ptr()  # buffers of its own: two steps can be timed
    decode_like_eager(eager, run, trial, 3)


@pytest.mark.slow
def test_candidates_differ_in_one_respect_and_only_where_the_launch_changes(monkeypatch):
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)  # the GPU's plan

    def decoder_of(kind: str, n: int, k: int, options=FusedConfig(), rows: int = 8, choice=None, hidden: int = 2048):
        choice = choice or PlanChoice(2, options.packed, 8)
        product = plan(torch.zeros(n, k), options, KNOBS, True, choice=choice)
        return SimpleNamespace(options=options, knobs=KNOBS, rows=rows, hidden=hidden,
                               products=lambda: {kind: product})

    # at one row, the slices are a candidate, on the warps the rules give a slice of that K: Llama-3.2-1B's O (K 2048,
    # one split) on eight; a sliced product's candidates are its warps and the tiles
    assert PlanChoice(2, True, 8, slices=True) in fused_tune.candidates(decoder_of("o", 2048, 2048, rows=1), "o")
    sliced = decoder_of("o", 2048, 2048, rows=1, choice=PlanChoice(2, True, 4, slices=True))
    assert fused_tune.candidates(sliced, "o", prefetch=True) == [PlanChoice(2, True, 8, slices=True),
                                                                 PlanChoice(2, True, 8)]
    assert all(not c.slices for c in fused_tune.candidates(decoder_of("o", 2048, 2048, FusedConfig(slices=False),
                                                                      rows=1), "o"))

    # Qwen3-8B's gate/up as tiles (hidden 4096: the rules slice no product of it): as slices, on eight warps (a K of
    # 4096 unsplit); its down (K 12288, split) on four
    gate_up = decoder_of("gate_up", 24576, 4096, rows=1, hidden=4096)
    assert PlanChoice(2, True, 8, slices=True) in fused_tune.candidates(gate_up, "gate_up")
    down = decoder_of("down", 4096, 12288, rows=1, hidden=4096)
    assert PlanChoice(2, True, 4, slices=True) in fused_tune.candidates(down, "down")

    # Qwen3-8B's QKV (6144 x 4096): 96 blocks split 4 ways at 2 programs an SM, 2 ways at 1, 8 ways at 4
    assert fused_tune.candidates(decoder_of("qkv", 6144, 4096), "qkv") == [
        PlanChoice(2, True, 4), PlanChoice(2, False, 8), PlanChoice(1, True, 8), PlanChoice(4, True, 8)]
    # Llama-3.2-1B's O (2048 x 2048): 32 blocks split max_splits' 8 ways at 1, 2 or 4 an SM: the same launch
    assert fused_tune.candidates(decoder_of("o", 2048, 2048), "o") == [PlanChoice(2, True, 4), PlanChoice(2, False, 8)]
    # on a Hopper GPU the L2 prefetch too, where the weights are packed
    assert fused_tune.candidates(decoder_of("o", 2048, 2048), "o", prefetch=True) == [
        PlanChoice(2, True, 4), PlanChoice(2, False, 8), PlanChoice(2, True, 8, prefetch=True)]
    # an ablation's switch pins its respect
    pinned = decoder_of("qkv", 6144, 4096, FusedConfig(packed=False, split_k=False))
    assert fused_tune.candidates(pinned, "qkv", prefetch=True) == [PlanChoice(2, False, 4)]  # row-major: none
    # gate/up never splits: warps and packing only
    assert fused_tune.candidates(decoder_of("gate_up", 6144, 4096), "gate_up") == [PlanChoice(2, True, 4),
                                                                                   PlanChoice(2, False, 8)]


def test_the_descent_takes_a_choice_only_where_its_step_times_faster():
    decoder = fused_and_eager()[2]
    asked = []

    def ratio(trial, best):  # row-major O is 3% faster, and nothing else is faster by the margin
        changed = [k for k in PRODUCT_KINDS if trial.products()[k] is not best.products()[k]]
        assert len(changed) == 1  # one respect of one kind at a time, against the plan it would replace
        asked.append(changed[0])
        choice = trial.products()[changed[0]].choice
        return 0.97 if changed[0] == "o" and not choice.packed else KNOBS.tune_take_below + 1e-4

    tuned, tuning = fused_tune.tune(decoder, ratio)
    assert [line.split(":")[0] for line in tuning.taken] == ["o"] and "0.9700" in tuning.taken[0]
    assert not tuned.products()["o"].packed and all(tuned.products()[k].packed for k in ("qkv", "gate_up", "down"))
    assert sorted(set(asked)) == sorted(PRODUCT_KINDS) and len(tuning.tried) == len(asked)
    # after O was taken, the kinds after it were timed against the decoder that runs it
    assert tuned.products()["o"] is not decoder.products()["o"]
    slower, nothing = fused_tune.tune(decoder, lambda trial, best: 1.02)
    assert slower is decoder and nothing.taken == []


@pytest.mark.slow
def test_a_tuned_plan_is_kept_and_a_later_job_of_the_same_shape_takes_it_untimed(tmp_path):
    decoder = fused_and_eager()[2]
    favours_row_major_o = lambda trial, best: 0.97 if not trial.products()["o"].packed else 1.0  # noqa: E731
    first, tuning = fused_tune.tuned(decoder, favours_row_major_o, False, tmp_path, "Some GPU", "GPU-1")
    assert tuning.kept_from is None and not first.products()["o"].packed and len(list(tmp_path.iterdir())) == 1

    def never(trial, best):
        raise AssertionError("a kept plan is not timed again")

    again, kept = fused_tune.tuned(fused_and_eager()[2], never, False, tmp_path, "Some GPU", "GPU-2")
    assert kept.kept_from.startswith("GPU-1 at ") and kept.taken == tuning.taken and kept.tried == tuning.tried
    assert {k: p.choice for k, p in again.products().items()} == {k: p.choice for k, p in first.products().items()}
    assert kept.summary().endswith(f"(of {len(tuning.tried)} tried); kept from {kept.kept_from}")
    # another kind of GPU, or other options, is timed again
    other_gpu = fused_tune.tuned(fused_and_eager()[2], lambda trial, best: 1.0, False, tmp_path, "Other GPU", "GPU-3")
    assert other_gpu[1].kept_from is None and len(list(tmp_path.iterdir())) == 2
    unsplit = fused_and_eager(options=FusedConfig(pdl=False, split_k=False))[2]
    assert fused_tune.plan_key(decoder, "Some GPU", False) != fused_tune.plan_key(unsplit, "Some GPU", False)
    assert fused_tune.plan_key(decoder, "Some GPU", False) != fused_tune.plan_key(decoder, "Some GPU", True)


def test_a_kept_plan_that_cannot_be_read_is_timed_again(tmp_path):
    decoder = fused_and_eager()[2]
    (tmp_path / f"{fused_tune.plan_key(decoder, 'Some GPU', False)}.json").write_text('{"choices": {"o": {"x": 1}}}')
    timed = []
    _, tuning = fused_tune.tuned(decoder, lambda trial, best: timed.append(1) or 1.0, False, tmp_path, "Some GPU", "G")
    assert tuning.kept_from is None and timed  # timed, and the file written whole again
    assert fused_tune._kept(next(tmp_path.glob("*.json"))) is not None
