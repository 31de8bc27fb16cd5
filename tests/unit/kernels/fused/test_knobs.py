"""harness/kernels/fused/knobs.py: a variant's knobs as the benchmarks read them (benchmarks/common.py's knobs_from)."""
from __future__ import annotations

import dataclasses

import pytest

from harness.kernels.fused.knobs import KNOBS
from tests.support import REPO


def test_a_variant_names_only_knobs_that_exist_and_reads_each_value_as_its_fields_type(monkeypatch, capsys):
    """benchmarks/fused_variants.py --variant (and fused_kernels.py's and fused_occupancy.py's --knobs: common.py's
    knobs_from): a knob that Knobs does not have would time a step under a label naming a change never made (a
    misspelt name, silently), so it ends the program with one line naming the valid knobs, as a value that is not its
    field's type does; each value is read as its field's type (a tuple as a+b), every other knob left at the rules';
    the first variant is the rules, and --study-window pairs one step a replay with one replay of 127 steps."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import fused_variants

    overrides, variants = fused_variants.parse(["--variant", "one_chunk_max_slots=512,fold_min_ahead_share=0.1",
                                                "model=tiny", "--variant", "sliced_kinds=gate_up+down", "bs=1"])
    assert overrides == ["model=tiny", "bs=1"]
    assert [(name, extra) for name, extra, _ in variants] == [
        ("the rules", []), ("one_chunk_max_slots=512,fold_min_ahead_share=0.1", []), ("sliced_kinds=gate_up+down", [])]
    rules, chunks, sliced = (knobs for _, _, knobs in variants)
    assert rules == KNOBS
    assert chunks == dataclasses.replace(KNOBS, one_chunk_max_slots=512, fold_min_ahead_share=0.1)
    assert type(chunks.one_chunk_max_slots) is int and type(chunks.fold_min_ahead_share) is float
    assert sliced == dataclasses.replace(KNOBS, sliced_kinds=("gate_up", "down"))
    for bad, said in (("one_chunk_max_slot=512", "knob 'one_chunk_max_slot' is not one of Knobs' fields: "),
                      ("one_chunk_max_slots=many", "knob one_chunk_max_slots='many' is not a")):
        with pytest.raises(SystemExit) as exited:
            fused_variants.parse(["--variant", bad, "model=tiny"])
        message = capsys.readouterr().err
        assert exited.value.code == 2 and said in message and message.count("\n") == 1, message
        assert "one_chunk_max_slots" in message  # the valid knobs named, or the one whose value is wrong
    _, study = fused_variants.parse(["--study-window", "model=tiny"])
    assert [(extra, knobs) for _, extra, knobs in study] == [(["graph_steps=1"], KNOBS), (["graph_steps=127"], KNOBS)]
