"""What a new user meets in the first hour on a CPU machine (issue: CPU numbers off by two orders of magnitude
under torch's default threads, a set-up command ending in exit 1, Hydra's own errors, folders that cannot be
written, names that lose their distinguishing key, and the smaller defects). Each test is named by the behaviour
it guards."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from harness.errors import ConfigError
from harness.measure.environment import running_threads, usable_cores
from harness.measure.job import measure
from support import FAST, REPO, run_config


@pytest.fixture
def torch_threads():
    """torch's thread count restored after the test (a job sets its own)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_cpu_job_times_on_one_thread_by_default_whatever_torch_had(torch_threads):
    """torch's default uses every core; a CPU step of small kernels then times the scheduler. A job sets
    cpu_threads (default 1) before it builds anything, and logs it."""
    torch.set_num_threads(2)
    cfg = run_config(*FAST, "device=cpu", "dtype=fp32")
    assert cfg.cpu_threads == 1
    result = measure(cfg)
    assert torch.get_num_threads() == 1
    assert result.environment["torch_threads"] == "1"
    assert result.mode_tags["cpu_cores"] == f"{usable_cores()} of {os.cpu_count()}"


def test_cpu_threads_sets_the_jobs_threads(torch_threads):
    torch.set_num_threads(1)
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "cpu_threads=2"))
    assert result.environment["torch_threads"] == "2"


def test_cpu_threads_below_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^cpu_threads=0 is invalid: it must be >= 1") as err:
        run_config("cpu_threads=0")
    assert "\n" not in str(err.value)


def result_label(threads: int) -> str:
    return run_config(*FAST, "device=cpu", "dtype=fp32", f"cpu_threads={threads}").label


def test_more_threads_than_the_usable_cores_warn_and_mark_the_run_noisy(torch_threads, capsys):
    threads = usable_cores() + 1
    result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", f"cpu_threads={threads}"))
    reason = f"cpu_threads={threads} exceeds the {usable_cores()} cores this process may use"
    assert reason in result.mode_tags["noisy"]
    assert f"warning: {result_label(threads)}: {reason}" in capsys.readouterr().err
    assert "cpu_load" in result.metrics


@pytest.mark.skipif(running_threads() is None, reason="the kernel does not report procs_running (/proc/stat)")
def test_a_machine_loaded_past_its_free_cores_while_timing_warns_and_marks_the_run_noisy(torch_threads, capsys):
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1) + 1)]
    try:
        time.sleep(0.5)  # every spinner started
        result = measure(run_config(*FAST, "device=cpu", "dtype=fp32", "stop=repeats", "repeats=2"))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    assert "the machine's load" in result.mode_tags["noisy"]
    assert result.metrics["cpu_load"] > os.cpu_count()
    assert "warning: " in capsys.readouterr().err


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


def test_a_sweeps_exclude_rules_keep_a_job_they_leave_out_from_refusing_it(tmp_path, monkeypatch):
    """A job the sweep's exclude rules leave out is never run, so its config does not refuse the sweep."""
    from harness.cli.precheck import check_sweep

    with pytest.raises(ConfigError, match="graph_steps=2 applies to mode=graphed"):
        check_sweep([*FAST, "mode=eager,graphed", "graph_steps=1,2"])
    check_sweep([*FAST, "mode=eager,graphed", "graph_steps=1,2", "hydra.sweeper.exclude=[{mode:eager,graph_steps:2}]"])


def test_the_cpu_preset_holds_the_design_cards_batch_sizes_eager_on_the_cpu_only():
    """The CPU set-up command's sweep: the design card's batch sizes, each a job a CPU can run (eager on the CPU,
    the tiny model), so that it ends with exit 0 where the design card's graphed jobs fail by design."""
    from harness.cli.plan import jobs_of

    jobs, _ = jobs_of(["+experiment=cpu"])
    runs = [run_config(*job) for job in jobs]
    card = [run_config(*job) for job in jobs_of(["+experiment=design-card"])[0]]
    assert sorted(r.bs for r in runs) == sorted({r.bs for r in card})
    assert {(r.mode, r.device, r.model.name) for r in runs} == {("eager", "cpu", "tiny")}


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


def test_a_sweeps_run_names_lead_with_the_keys_it_varies():
    from harness.config.labels import run_label
    from harness.record import flatten

    flat = flatten({"model": {"name": "tiny"}, "bs": 2, "context_len": 8, "cache_len": 64, "mode": "eager",
                    "dtype": "fp32", "attn": "sdpa"})
    names = [run_label({**flat, "bs": bs, "dtype": dtype}, ["bs", "dtype"]) for bs in (1, 2) for dtype in ("bf16", "fp32")]
    assert names[0] == "bs=1 dtype=bf16 tiny ctx=8 cache=64 eager"
    assert len({name[:25] for name in names}) == 4  # the table's first 25 characters tell the runs apart


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


@pytest.mark.slow
def test_harness_rerun_of_a_dtype_sweep_names_its_two_runs_apart(tmp_path, monkeypatch, torch_threads):
    """`harness rerun PARENT` of a bs x dtype sweep gave two children of one name, one fp32 and one bf16."""
    from harness.cli.main import main
    from support import runs_by_kind, store

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["-m", *FAST, "device=cpu", "dtype=fp32,bf16"]) == 0
    _, (sweep,), _ = runs_by_kind(store(tmp_path))
    assert main(["rerun", sweep.info.run_id]) == 0
    _, parents, children = runs_by_kind(store(tmp_path))
    (rerun,) = [p for p in parents if p.data.tags["harness.kind"] == "rerun"]
    names = sorted(c.info.run_name for c in children if c.data.tags.get("mlflow.parentRunId") == rerun.info.run_id)
    assert names == ["dtype=bf16 tiny bs=1 ctx=8 cache=64 eager", "dtype=fp32 tiny bs=1 ctx=8 cache=64 eager"]


def eager_only_records():
    """Two finished eager runs of a bs sweep, as result files hold them."""
    from harness.record import JobRecord

    return [JobRecord(label=f"bs={bs} tiny ctx=8 cache=64 eager", config={"bs": bs, "mode": "eager", "context_len": 8,
                      "cache_len": 64, "dtype": "fp32", "model": {"name": "tiny"}}, status="FINISHED", job_dir=f"/x/{bs}",
                      metrics={"step_ms_median": 2.0 * bs, "verified": 1.0}, mlflow_run_id=f"run{bs}", varying=["bs"])
            for bs in (1, 2)]


def test_an_eager_only_sweeps_description_table_has_as_many_header_cells_as_delimiters():
    from harness.analysis.headline import headline_markdown

    lines = headline_markdown(eager_only_records(), conditions_first=False).splitlines()
    header, delimiter, *rows = lines[:4]
    cells = lambda line: line.strip().strip("|").split("|")  # noqa: E731
    assert len(cells(header)) == len(cells(delimiter)) == len(cells(rows[0])) == 4, lines[:4]


def test_an_eager_only_sweep_logs_no_speedup_of_eager_over_itself():
    from harness.analysis.summary import child_speedups, parent_metrics

    metrics = parent_metrics(eager_only_records())
    assert not [k for k in metrics if k.startswith("speedup/")], metrics
    assert {"median_ms/eager/bs1", "median_ms/eager/bs2"} <= metrics.keys()
    assert child_speedups(eager_only_records()) == {}


@pytest.mark.slow
def test_an_interrupted_sweep_leaves_no_status_file_and_names_the_resume_command(tmp_path, monkeypatch, capsys,
                                                                                 torch_threads):
    """Ctrl-C in a sweep: exit 130, the line says how to resume, and /tmp keeps no harness-sweep-PID.status."""
    import signal
    import threading

    from harness.cli.main import main
    from harness.cli.sweep_file import status_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = ["-m", "model=tiny", "device=cpu", "warmup=2", "context_len=8", "decode_tokens=4000", "cache_len=4096",
            "stop=repeats", "repeats=3", "bs=1,2"]

    def interrupt_once_started():
        for _ in range(1200):  # the sweep writes its status file as it starts
            if status_path().is_file():
                time.sleep(1.0)
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    assert main(argv) == 130
    assert not status_path().exists()
    err = capsys.readouterr().err
    assert f"[harness] interrupted; to run what is left, skipping the jobs that finished: python -m harness " \
           f"{' '.join(argv)} resume=true" in err


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A temporary folder of this test's own as the process's, to see what a command leaves in it."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp


def written_sweep(folder, median: float):
    """A sweep folder holding the result files of two finished eager runs."""
    from harness.store import results

    for record in eager_only_records():
        record.step_ms = [record.metrics["step_ms_median"] * median * (1 + 0.001 * (i % 5)) for i in range(64)]
        record.config_hash = f"config-bs{record.config['bs']}"
        results.write(folder / str(record.config["bs"]), record)
    return folder


def test_report_and_compare_leave_no_harness_folder_in_tmp(tmp_path, monkeypatch, own_tmp):
    from harness.cli import commands

    monkeypatch.chdir(tmp_path)
    base, cand = written_sweep(tmp_path / "base", 1.0), written_sweep(tmp_path / "cand", 1.0)
    assert commands.main(["report", str(base)]) == 0
    assert commands.main(["compare", str(base), str(cand)]) == 0
    assert list(own_tmp.iterdir()) == []
    assert (base / "report" / "summary.md").is_file()  # kept inside the sweep folder
    assert len(list((tmp_path / "outputs" / "compares").glob("*/*/compare.md"))) == 1


@pytest.mark.slow
def test_ab_leaves_no_harness_folder_in_tmp(tmp_path, monkeypatch, own_tmp, torch_threads):
    from harness.cli import commands

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert commands.main(["ab", "dtype=fp32", "dtype=bf16", *FAST, "device=cpu", "--pairs", "2"]) in (0, 1)
    assert [p.name for p in own_tmp.iterdir() if p.name.startswith("harness-")] == []
    assert len(list((tmp_path / "outputs" / "ab").glob("*/*/ab.md"))) == 1


def test_a_run_id_prefix_of_8_characters_names_the_run_where_it_is_unique(tmp_path):
    from mlflow.tracking import MlflowClient

    from harness.store import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    runs = [c.create_run(c.create_experiment(name)).info.run_id for name in ("a", "b")]
    assert tracking.get_run(uri, runs[1][:8]).info.run_id == runs[1]  # in any experiment
    assert tracking.get_run(uri, runs[0][:12]).info.run_id == runs[0]
    with pytest.raises(tracking.StoreError, match="no run"):
        tracking.get_run(uri, runs[0][:7])  # shorter than 8: not taken as a prefix


@pytest.mark.skipif(torch.cuda.is_available(), reason="marks what a machine without a CUDA GPU cannot run")
def test_plan_on_a_cpu_marks_the_jobs_this_machine_cannot_run(capsys):
    from harness.cli import commands

    assert commands.main(["plan", "-m", "model=tiny", "mode=eager,graphed"]) == 0
    out = capsys.readouterr().out.splitlines()
    graphed = [line for line in out if "graphed" in line and "(no past run" in line]
    eager = [line for line in out if "eager" in line and "(no past run" in line]
    assert len(graphed) == len(eager) == 1
    assert graphed[0].endswith("[cannot run here: mode=graphed needs a CUDA GPU, and torch sees none]")
    assert "cannot run" not in eager[0]
    assert "1 of 2 jobs cannot run on this machine (marked below): here they would be recorded FAILED" in out


def test_every_source_path_a_config_file_names_exists():
    """conf/config.yaml pointed to harness/config.py, which became harness/config/schema.py."""
    import re

    named = {(path.relative_to(REPO), ref) for path in (REPO / "conf").glob("**/*.yaml")
             for ref in re.findall(r"\b((?:harness|docs|benchmarks|tests)/[\w./-]+\.(?:py|md))\b", path.read_text())}
    assert named and [(str(path), ref) for path, ref in named if not (REPO / ref).is_file()] == []


def test_git_ignores_no_tracked_file():
    """.gitignore listed conf/config.yaml, which git tracks: an edit of it would be easy to lose."""
    done = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()[:100]}")
    assert done.stdout.split() == []


@pytest.mark.slow
def test_a_resumed_sweeps_parent_shows_the_skipped_jobs_numbers_and_links_the_earlier_sweep(tmp_path, monkeypatch,
                                                                                             torch_threads):
    """After an interrupted sweep, `resume=true` skipped the finished jobs, and its parent's table left them out
    ("Not in the table (SKIPPED)"): the results were split over two parents, unlinked."""
    from harness.cli.main import main
    from support import runs_by_kind, store

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["-m", *FAST, "device=cpu", "bs=1"]) == 0
    _, (first,), (done,) = runs_by_kind(store(tmp_path))
    assert main(["-m", *FAST, "device=cpu", "bs=1,2", "resume=true"]) == 0
    _, parents, _ = runs_by_kind(store(tmp_path))
    (resumed,) = [p for p in parents if p.info.run_id != first.info.run_id]
    table = resumed.data.tags["mlflow.note.content"]
    assert "SKIPPED" not in table
    rows = [line for line in table.splitlines() if line.startswith("| tiny | 8 |")]
    assert len(rows) == 2 and f"{done.data.metrics['step_ms_median']:.3f}" in rows[0]
    assert resumed.data.tags["harness.resumes"] == first.info.run_id
    assert store(tmp_path).get_run(first.info.run_id).data.tags["harness.resumed_by"] == resumed.info.run_id


def test_a_jobs_median_is_logged_to_four_significant_figures_and_counts_as_they_are(tmp_path):
    from mlflow.tracking import MlflowClient

    from harness.store import runlog

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record = eager_only_records()[0]
    record.metrics = {"step_ms_median": 4.23456789, "step_ms_ci_pct": 1.23456, "parameters": 751632384.0,
                      "tokens_per_s": 236.1483}
    run_id = runlog.log_job(uri, "harness", None, record, tmp_path)
    logged = MlflowClient(uri).get_run(run_id).data.metrics
    assert (logged["step_ms_median"], logged["step_ms_ci_pct"]) == (4.235, 1.235)
    assert (logged["parameters"], logged["tokens_per_s"]) == (751632384.0, 236.1483)

