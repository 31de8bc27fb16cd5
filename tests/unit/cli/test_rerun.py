"""`harness rerun` (harness/cli/rerun.py): a rerun keeps the keys its runs differ in."""
from __future__ import annotations

import pytest

from tests.support import FAST, run_config


@pytest.mark.slow
def test_a_rerun_of_a_sweep_keeps_the_key_its_runs_differ_in():
    from harness.cli.rerun import rerun_config, varying_in
    from harness.config.labels import run_label
    from harness.record import flatten
    from omegaconf import OmegaConf

    logged = [OmegaConf.to_container(OmegaConf.structured(run_config(*FAST, f"dtype={d}")), enum_to_str=True)
              for d in ("fp32", "bf16")]
    configs = [rerun_config(c, []) for c in logged]
    varying = varying_in(configs)
    assert varying == ["dtype"]
    names = [run_label(flatten(OmegaConf.to_container(c, enum_to_str=True)), varying) for c in configs]
    assert names == ["dtype=fp32 tiny bs=1 ctx=8 cache=64 eager", "dtype=bf16 tiny bs=1 ctx=8 cache=64 eager"]


@pytest.mark.slow
def test_harness_rerun_of_a_dtype_sweep_names_its_two_runs_apart(tmp_path, monkeypatch, torch_threads):
    """`harness rerun PARENT` of a bs x dtype sweep gave two children of one name, one fp32 and one bf16."""
    from harness.cli.main import main
    from tests.support import runs_by_kind, store

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["-m", *FAST, "device=cpu", "dtype=fp32,bf16"]) == 0
    _, (sweep,), _ = runs_by_kind(store(tmp_path))
    assert main(["rerun", sweep.info.run_id]) == 0
    _, parents, children = runs_by_kind(store(tmp_path))
    (rerun,) = [p for p in parents if p.data.tags["harness.kind"] == "rerun"]
    names = sorted(c.info.run_name for c in children if c.data.tags.get("mlflow.parentRunId") == rerun.info.run_id)
    assert names == ["dtype=bf16 tiny bs=1 ctx=8 cache=64 eager", "dtype=fp32 tiny bs=1 ctx=8 cache=64 eager"]
