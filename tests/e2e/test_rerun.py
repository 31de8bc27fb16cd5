"""`harness rerun` and resume through the real CLI against real SQLite stores."""
from __future__ import annotations

import yaml

from harness.cli import commands as cli, rerun
from tests.support import FAST, child_runs, one_line_error, run_harness, runs_by_kind, store


def test_rerun_errors_are_one_line_and_a_resumed_run_measures_again(workdir, capsys):
    assert run_harness("-m", *FAST, "resume=true", "bs=1", cwd=workdir).returncode == 0
    (child,) = runs_by_kind(store(workdir))[2]
    run_id = child.info.run_id
    for bad, says in (("foo=1", "foo is not a config key"), ("decode_tokens", "'decode_tokens' is not KEY=VALUE"),
                      ("model=llama-9000", "model=llama-9000 is not a model preset: use one of llama-3.1-8b, llama-3.2-1b, qwen3-0.6b"),
                      ("mode=foo", "mode=foo is invalid: use one of eager"),
                      ("bs=abc", "Value 'abc' of type 'str' could not be converted to Integer")):
        assert says in one_line_error(capsys, "rerun", run_id, bad)
    logged = yaml.safe_load(next(workdir.glob("outputs/**/config.yaml")).read_text())
    swapped = rerun.rerun_config(logged, ["model=qwen3-0.6b"])  # the issue's `model=qwen3-0.6b`: another preset
    assert swapped.model.num_hidden_layers == 28 and swapped.bs == 1
    assert "required: run_id (see `harness rerun --help`)" in one_line_error(capsys, "rerun")
    assert cli.main(["rerun", run_id, "decode_tokens=4"]) == 0  # resume=true in its config: not its own twin
    again = next(c for c in runs_by_kind(store(workdir))[2] if c.info.run_id != run_id)
    assert again.info.status == "FINISHED" and again.data.params["resume"] == "False"
    assert again.data.tags["rerun_of"] == run_id


def test_a_rerun_reproduces_the_config_and_applies_overrides_and_a_sweep_reruns_whole(workdir, capsys):
    assert run_harness("-m", *FAST, "bs=1,2", "seed=7", cwd=workdir).returncode == 0
    _, (parent,), children = runs_by_kind(store(workdir))
    old = next(c for c in children if c.data.params["bs"] == "1")
    proc = run_harness("rerun", old.info.run_id, "decode_tokens=12", cwd=workdir)
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


def test_a_logged_config_is_data_and_target_is_refused(workdir, tmp_path, capsys):
    client = store(workdir)
    assert run_harness(*FAST, cwd=workdir).returncode == 0  # creates the store and experiment
    exp = client.get_experiment_by_name("harness")
    evil = client.create_run(exp.experiment_id, tags={"harness.kind": "job"}).info.run_id
    marker = tmp_path / "pwned"
    config = yaml.safe_load((next((workdir / "outputs").glob("**/config.yaml"))).read_text())
    config["_target_"] = "os.system"
    config["command"] = f"touch {marker}"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    client.log_artifact(evil, str(tmp_path / "config.yaml"))
    assert cli.main(["rerun", evil]) == 2
    err = capsys.readouterr().err
    assert "_target_ is not a config key" in err and "Traceback" not in err
    assert not marker.exists()
