"""Run identity (harness/config/labels.py): every key a sweep varies is in its runs' labels; nothing is merged or
dropped silently."""
from __future__ import annotations

from harness.config.labels import run_label, varying_keys
from harness.record import flatten


FLAT = flatten({"model": {"name": "tiny"}, "bs": 1, "context_len": 8, "cache_len": 64, "mode": "eager",
                "dtype": "fp32", "seed": 3, "attn": "sdpa"})


def test_the_keys_a_sweep_varies_are_named_in_every_label():
    jobs = [["model=tiny", "dtype=bf16", "bs=1"], ["model=tiny", "dtype=fp32", "bs=1"], ["model=tiny", "dtype=fp32", "bs=2"]]
    assert varying_keys(jobs) == ["bs", "dtype"]
    assert varying_keys([["+inductor.a=1", "model=x"], ["+inductor.a=2", "model=y"]]) == ["inductor.a", "model.name"]
    assert run_label(FLAT, ["bs", "dtype"]) == "bs=1 dtype=fp32 tiny ctx=8 cache=64 eager"  # the varying keys lead
    assert run_label(FLAT, ["dtype", "seed"]) == "dtype=fp32 seed=3 tiny bs=1 ctx=8 cache=64 eager"
    assert run_label(FLAT) == "tiny bs=1 ctx=8 cache=64 eager"


def test_a_sweeps_run_names_lead_with_the_keys_it_varies():
    from harness.config.labels import run_label
    from harness.record import flatten

    flat = flatten({"model": {"name": "tiny"}, "bs": 2, "context_len": 8, "cache_len": 64, "mode": "eager",
                    "dtype": "fp32", "attn": "sdpa"})
    names = [run_label({**flat, "bs": bs, "dtype": dtype}, ["bs", "dtype"]) for bs in (1, 2) for dtype in ("bf16", "fp32")]
    assert names[0] == "bs=1 dtype=bf16 tiny ctx=8 cache=64 eager"
    assert len({name[:25] for name in names}) == 4  # the table's first 25 characters tell the runs apart
