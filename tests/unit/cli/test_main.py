"""The command line's entry (harness/cli/main.py) in process: Hydra's own errors and bad sweeps are one line and
exit 2 with nothing created; the CPU set-up command ends with exit 0; a run reruns from its saved Hydra config."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.support import FAST, logging_as_it_was, run_in_process, runs_by_kind, store


@pytest.fixture(autouse=True)
def logging_kept():
    """main() run in process lets Hydra configure logging: put back after each test (tests/support.py)."""
    with logging_as_it_was():
        yield


def refused(argv: list[str], where, capsys) -> str:
    """main()'s answer to a command line that must be refused: exit 2, one line on stderr, nothing printed on
    stdout, nothing created in `where` (the working folder: no store, no outputs). Returns the line."""
    from harness.cli.main import main

    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    assert list(where.iterdir()) == []
    return out.err.strip()


@pytest.mark.parametrize("argv, says", [
    (["-m", "+experiment=nosuch"], "harness: In 'config': Could not find 'experiment/nosuch' Available options in "
                                   "'experiment': capacity context cpu design-card"),
    (["-m", "experiment=ladder"], "To append to your default list use +experiment=ladder"),
    (["+experiment=nosuch"], "Could not find 'experiment/nosuch'"),
])
def test_hydras_own_errors_are_one_line_and_exit_2_with_nothing_created(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    assert says in refused(argv, tmp_path, capsys)


def test_a_sweep_holding_one_bad_batch_size_exits_2_before_any_job_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = refused(["-m", *FAST, "bs=1,0"], tmp_path, capsys)
    assert line == ("harness: bs=0 is invalid: the batch size must be >= 1 (in the sweep's job "
                    f"{' '.join(FAST)} bs=0; nothing ran)")


@pytest.mark.slow
def test_the_cpu_set_up_command_ends_with_exit_0_on_a_cpu(tmp_path, monkeypatch, torch_threads):
    from harness.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["-m", "+experiment=cpu"]) == 0


@pytest.mark.parametrize("argv", [
    [*FAST, "device=cpu", "hydra.run.dir={file}/run"],
    ["-m", *FAST, "device=cpu", "bs=1,2", "hydra.sweep.dir={file}/sweep/${{now:%H-%M-%S}}"],
])
def test_an_output_folder_under_a_file_is_one_line_exit_2_and_no_stray_parent_run(tmp_path, monkeypatch, capsys,
                                                                                  argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    from harness.cli.main import main

    assert main([a.format(file=tmp_path / "notes.txt") for a in argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in out.err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # no store (so no parent run), no folder


@pytest.mark.parametrize("overrides, says", [
    (["bs=0"], "harness: bs=0 is invalid: the batch size must be >= 1"),
    (["cache_len=10"], "harness: cache_len=10 is too short"),
    (["buckets=[4,2]"], "harness: buckets=[4, 2] is invalid"),
    (["model=qwen3-06b"], "harness: In 'config': Could not find 'model/qwen3-06b' Available options in 'model':"),
    (["bs=abc"], "could not be converted to Integer"),
    (["model=tiny", "context_len=100000"], "context_len=100000 is too long for model=tiny"),
    (["bs=1000000", "device=cpu"], "KV cache for model=qwen3-0.6b in bf16, more than the"),
    (["tracking.uri=foo://bar"], "is not a store MLflow can use"),
])
def test_a_bad_run_is_refused_in_one_line_before_anything_is_created(workdir, capsys, overrides, says):
    """In process: main() is what `python -m harness` runs (tests/e2e/test_cli.py runs the real CLI's refusals)."""
    from harness.cli.main import main

    assert main(overrides) == 2
    out = capsys.readouterr()
    assert says in out.err, out.err
    assert len(out.err.strip().splitlines()) == 1 and out.out == ""
    assert list(workdir.iterdir()) == []  # no store, no outputs folder


@pytest.mark.usefixtures("fresh_model_cache")
@pytest.mark.parametrize("flags", [["--cfg", "job"], ["--cfg", "hydra"], ["--cfg", "all"], ["--info"],
                                   ["-m", "bs=1,2", "mode=eager,graphed", "--cfg", "job"],
                                   ["-m", "+experiment=capacity", "--cfg", "job"]])
def test_hydras_own_flags_exit_0(workdir, capsys, flags):
    from harness.cli.main import main

    assert main(flags) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and not (workdir / "mlruns").exists()
    if flags[-2:] == ["--cfg", "job"] and "bs=1,2" in flags:
        assert re.search(r"^bs: 1$", out.out, re.M) and "the sweep holds 4 jobs" in out.err


@pytest.mark.parametrize("value", ["2GB", "-1", "nan"])
def test_a_budget_that_is_not_a_size_is_refused_in_one_line_before_anything_is_created(workdir, monkeypatch, capsys,
                                                                                     value):
    from harness.cli.main import main

    monkeypatch.setenv("HARNESS_SAVED_STEPS_MAX_MB", value)
    assert main([*FAST, "device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"harness: HARNESS_SAVED_STEPS_MAX_MB={value!r} is not a size: give the MB the "
                           "saved compiled steps may take, a number >= 0 (default 2048; 0 keeps only the step "
                           "saved last)")
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("bad, says", [
    ("bs=0,1", "bs=0 is invalid: the batch size must be >= 1 (in the sweep's job"),
    ("mode=eager,bogus", "mode=bogus is invalid: use one of eager, graphed, bucketed"),
    ("dtype=bf16,int3", "Invalid value 'int3', expected one of [bf16, fp16, fp32]"),
])
@pytest.mark.slow
def test_a_sweep_with_a_bad_value_in_any_job_is_refused_before_anything_is_created(workdir, capsys, bad, says):
    """A bad value is refused as a single run's is (one line, exit 2, no store, no folder), whichever job holds it.
    A job that fails as it runs (no GPU, out of memory) is recorded FAILED and the rest run:
    tests/unit/cli/test_app.py::test_an_oom_in_one_job_leaves_the_others_finished."""
    from harness.cli.main import main

    assert main(["-m", *FAST, bad]) == 2
    out = capsys.readouterr()
    assert says in out.err, out.err
    assert len(out.err.strip().splitlines()) == 1 and out.out == ""
    assert list(workdir.iterdir()) == []


@pytest.mark.slow
def test_a_run_reruns_from_its_saved_hydra_config(workdir, capfd, monkeypatch):
    first = run_in_process(capfd, monkeypatch, *FAST, "bs=3", "seed=5")
    assert first.returncode == 0, first.stderr
    (run_dir,) = (workdir / "outputs" / "runs").glob("*/*")
    saved = run_dir / ".hydra"
    again = run_in_process(capfd, monkeypatch, "--config-path", str(saved), "--config-name", "config")
    assert again.returncode == 0, again.stderr
    results = [json.loads(p.read_text()) for p in (workdir / "outputs").glob("**/result.json")]
    assert len(results) == 2
    assert results[0]["config"] == results[1]["config"]
    assert yaml.safe_load((saved / "config.yaml").read_text())["bs"] == 3
    _, parents, children = runs_by_kind(store(workdir))
    assert len(parents) == 2 and len(children) == 2  # a single run gets its own parent too
