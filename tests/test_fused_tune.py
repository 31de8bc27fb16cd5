"""fused.tune: a product's plan chosen by timing the step. Here (Triton's interpreter) the choices are checked to change
how a product launches and never what it computes, the descent to take a choice only where it times faster, and a
job to say that it did not tune where no GPU times the step."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from harness.config.fused import FusedConfig
from harness.kernels.fused import plan as fused_plan, tune as fused_tune
from harness.kernels.fused.knobs import KNOBS
from harness.kernels.fused.plan import PRODUCT_KINDS, PlanChoice, default_choice, plan, slice_layout
from harness.measure.job import measure
from tests.support import run_config
from tests.test_fused import FUSED, decode_like_eager, fused_and_eager


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


@pytest.mark.parametrize("hidden", [64, 96], ids=["splits-whole", "splits-ragged"])
def test_row_slices_split_over_k_compute_eager_logits(monkeypatch, hidden):
    """fused.slices with K split (narrow splits here, so that a tiny model's products split): each split's input,
    squares and sums only its own columns, where the splits are whole BK (64 = 2 x 32) or ragged (96 = 4 x 24 in
    BK of 32: the loads past a split's end masked), and gate/up (never split) takes whole rows in halves."""
    knobs = replace(KNOBS, slice_columns=32, slice_values_a_thread_narrow=2)  # (a tiny model is narrow: slice_values)
    eager, run, decoder = fused_and_eager(f"model.hidden_size={hidden}", knobs=knobs)
    for kind in PRODUCT_KINDS:
        decoder = decoder.replanned(kind, PlanChoice(2, True, 4, slices=True))
    products = decoder.products()
    assert all(p.one_tile and not p.packed and "row slices" in str(p) for p in products.values())
    assert products["qkv"].splits == {64: 2, 96: 4}[hidden] and products["o"].splits == 2  # O's K: 4 heads x 16
    assert products["down"].splits == 4
    assert products["gate_up"].splits == products["lm_head"].splits == 1 and products["gate_up"].bn == {64: 4, 96: 2}[hidden]
    decode_like_eager(eager, run, decoder, 3)


def test_slice_layout_fills_a_thread_with_whole_rows_of_a_split():
    # Llama-3.1-8B's down (4096 x 14336): 8 splits of 1792 in BK of 2048, 4 rows a program on four warps
    assert slice_layout(KNOBS, 4096, 14336, True, 4) == (4, 2048, 8)
    assert slice_layout(KNOBS, 4096, 14336, True, 8) == (8, 2048, 8)
    # Qwen3-0.6B's down (1024 x 3072): 2 splits of 1536; unsplit (lm_head, gate/up) its whole K: 2 rows at least
    assert slice_layout(KNOBS, 1024, 3072, True, 4) == (4, 2048, 2)
    assert slice_layout(KNOBS, 128256, 4096, False, 4) == (2, 4096, 1)
    assert slice_layout(KNOBS, 2048, 2048, True, 4) == (4, 2048, 1)


def test_the_rules_warps_a_program_by_layout_k_and_rows(monkeypatch):
    """The rules' plan (default_choice, rule_warps) on the GPU: an unsplit slice of K 2048 or more on eight warps, a
    split or shorter one on four; tiles on eight, four from 32 rows in a model 4096 wide."""
    monkeypatch.setattr(fused_plan, "interpreted", lambda: False)

    def rules(n, k, kind, rows=1, hidden=2048, options=FusedConfig()):
        return default_choice(KNOBS, n, k, options, rows, hidden, kind)

    # Llama-3.2-1B at bs=1, its large products sliced (fused.tma off: with it, they stream through TMA as tiles):
    # gate/up and lm_head unsplit (K 2048) on eight, down split (K 8192) on four, QKV tiles
    no_tma = FusedConfig(tma=False)
    assert rules(16384, 2048, "gate_up", options=no_tma) == PlanChoice(2, True, 8, slices=True)
    assert rules(128256, 2048, "lm_head", options=no_tma) == PlanChoice(2, True, 8, slices=True)
    assert rules(2048, 8192, "down", options=no_tma) == PlanChoice(2, True, 4, slices=True)
    assert rules(3072, 2048, "qkv") == PlanChoice(1, True, 8)  # QKV split for one program an SM at bs=1 here
    assert rules(3072, 2048, "qkv", rows=8) == PlanChoice(2, True, 8)
    # with fused.split_k off, down's K stays whole: eight
    assert rules(2048, 8192, "down", options=FusedConfig(split_k=False, tma=False)) == PlanChoice(2, True, 8,
                                                                                               slices=True)
    # the large products' rule: 16-bit weights of a model 2048 wide stream through TMA as tiles on eight warps; 32-bit
    # ones (which fused.tma does not stream) stay sliced
    assert [rules(n, k, kind) for n, k, kind in ((16384, 2048, "gate_up"), (2048, 8192, "down"))] == [
        PlanChoice(2, True, 8)] * 2
    assert default_choice(KNOBS, 2048, 8192, FusedConfig(), 1, 2048, "down", 4).slices
    # Qwen3-0.6B (1024 wide): a K of 1024 is short of 2048, four (fused.tma off; with it, at one row, the copies-first
    # rule takes the large products as tiles, and QKV for one program an SM)
    assert rules(6144, 1024, "gate_up", hidden=1024, options=no_tma) == PlanChoice(2, True, 4, slices=True)
    assert rules(6144, 1024, "gate_up", hidden=1024) == PlanChoice(2, True, 8)
    assert rules(4096, 1024, "qkv", hidden=1024) == PlanChoice(1, True, 8)
    # Qwen3-8B: tiles (no product of a model 4096 wide is sliced), on four from 32 rows
    assert rules(24576, 4096, "gate_up", hidden=4096) == PlanChoice(2, True, 8)
    assert rules(24576, 4096, "gate_up", rows=32, hidden=4096) == PlanChoice(2, True, 4)


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


def test_a_job_that_cannot_time_the_step_says_it_did_not_tune():
    result = measure(run_config(*FUSED, "model.tie_word_embeddings=false", "fused.tune=true"))
    assert result.failure is None and result.metrics["verified"] == 1.0, result.failure
    assert result.mode_tags["tune"].startswith("not applied: no GPU") and "tune_ms" not in result.metrics
    assert "tune=on" in result.mode_tags["fused"] and result.mode_tags["fused_plan"].startswith("qkv: ")
    assert run_config(*FUSED, "fused.tune=true").label.endswith("fused tune=on")


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

