"""`harness rerun` (harness/cli/rerun.py): a rerun keeps the keys its runs differ in; its errors, overrides and
reruns of whole sweeps against real SQLite stores (the runs and sweeps in this process)."""
from __future__ import annotations

import pytest
import yaml

from harness.cli import commands as cli, rerun
from tests.support import FAST, child_runs, one_line_error, run_config, run_in_process, runs_by_kind, store


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
def test_harness_rerun_of_a_dtype_sweep_names_its_two_runs_apart(workdir, capfd, monkeypatch):
    """`harness rerun PARENT` of a bs x dtype sweep gave two children of one name, one fp32 and one bf16."""
    assert run_in_process(capfd, monkeypatch, "-m", *FAST, "device=cpu", "dtype=fp32,bf16").returncode == 0
    _, (sweep,), _ = runs_by_kind(store(workdir))
    assert run_in_process(capfd, monkeypatch, "rerun", sweep.info.run_id).returncode == 0
    _, parents, children = runs_by_kind(store(workdir))
    (rerun,) = [p for p in parents if p.data.tags["harness.kind"] == "rerun"]
    names = sorted(c.info.run_name for c in children if c.data.tags.get("mlflow.parentRunId") == rerun.info.run_id)
    assert names == ["dtype=bf16 tiny bs=1 ctx=8 cache=64 eager", "dtype=fp32 tiny bs=1 ctx=8 cache=64 eager"]


@pytest.mark.slow
def test_rerun_errors_are_one_line_and_a_resumed_run_measures_again(workdir, capfd, monkeypatch, torch_threads):
    assert run_in_process(capfd, monkeypatch, "-m", *FAST, "resume=true", "bs=1").returncode == 0
    (child,) = runs_by_kind(store(workdir))[2]
    run_id = child.info.run_id
    for bad, says in (("foo=1", "foo is not a config key"), ("decode_tokens", "'decode_tokens' is not KEY=VALUE"),
                      ("model=llama-9000", "model=llama-9000 is not a model preset: use one of llama-3.1-8b, llama-3.2-1b, qwen3-0.6b"),
                      ("mode=foo", "mode=foo is invalid: use one of eager"),
                      ("bs=abc", "Value 'abc' of type 'str' could not be converted to Integer")):
        assert says in one_line_error(capfd, "rerun", run_id, bad)
    logged = yaml.safe_load(next(workdir.glob("outputs/**/config.yaml")).read_text())
    swapped = rerun.rerun_config(logged, ["model=qwen3-0.6b"])  # the issue's `model=qwen3-0.6b`: another preset
    assert swapped.model.num_hidden_layers == 28 and swapped.bs == 1
    assert "required: run_id (see `harness rerun --help`)" in one_line_error(capfd, "rerun")
    assert cli.main(["rerun", run_id, "decode_tokens=4"]) == 0  # resume=true in its config: not its own twin
    again = next(c for c in runs_by_kind(store(workdir))[2] if c.info.run_id != run_id)
    assert again.info.status == "FINISHED" and again.data.params["resume"] == "False"
    assert again.data.tags["rerun_of"] == run_id


@pytest.mark.slow
def test_a_rerun_reproduces_the_config_and_applies_overrides_and_a_sweep_reruns_whole(workdir, capfd, monkeypatch,
                                                                                       torch_threads):
    assert run_in_process(capfd, monkeypatch, "-m", *FAST, "bs=1,2", "seed=7").returncode == 0
    _, (parent,), children = runs_by_kind(store(workdir))
    old = next(c for c in children if c.data.params["bs"] == "1")
    proc = run_in_process(capfd, monkeypatch, "rerun", old.info.run_id, "decode_tokens=12")
    assert proc.returncode == 0, proc.stderr
    assert f"({old.info.run_id} → " in proc.stdout  # old and new side by side
    assert "inside" in proc.stdout or "OUTSIDE" in proc.stdout  # the new median against the old interval
    new = next(r for r in child_runs(workdir) if r.data.tags.get("rerun_of") == old.info.run_id)
    assert new.info.status == "FINISHED"
    changed = {k: (v, new.data.params.get(k)) for k, v in old.data.params.items() if new.data.params.get(k) != v}
    assert changed == {"decode_tokens": ("8", "12")}
    assert len(store(workdir).get_metric_history(new.info.run_id, "step_ms")) == 12

    assert cli.main(["rerun", parent.info.run_id]) == 0  # a sweep's parent: every job again, under a new parent
    _, parents, children = runs_by_kind(store(workdir))
    new_parent = next(p for p in parents if p.data.tags.get("rerun_of") == parent.info.run_id)
    reruns = [c for c in children if c.data.tags["mlflow.parentRunId"] == new_parent.info.run_id]
    assert sorted(c.data.params["bs"] for c in reruns) == ["1", "2"]


@pytest.mark.slow
def test_a_logged_config_is_data_and_target_is_refused(workdir, tmp_path, capfd, monkeypatch):
    client = store(workdir)
    assert run_in_process(capfd, monkeypatch, *FAST).returncode == 0  # creates the store and experiment
    exp = client.get_experiment_by_name("harness")
    evil = client.create_run(exp.experiment_id, tags={"harness.kind": "job"}).info.run_id
    marker = tmp_path / "pwned"
    config = yaml.safe_load((next((workdir / "outputs").glob("**/config.yaml"))).read_text())
    config["_target_"] = "os.system"
    config["command"] = f"touch {marker}"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    client.log_artifact(evil, str(tmp_path / "config.yaml"))
    assert cli.main(["rerun", evil]) == 2
    err = capfd.readouterr().err
    assert "_target_ is not a config key" in err and "Traceback" not in err
    assert not marker.exists()
