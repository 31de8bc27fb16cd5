"""What a new user runs into: one-line errors, the README's commands, the store's failures. The CLI runs in
real subprocesses (or, for a subcommand's error path, through cli.main in process) against real SQLite stores and a real `mlflow server`."""
from __future__ import annotations

import json
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
import torch
import yaml

from harness.cli import commands as cli, rerun
from harness.errors import ConfigError
from harness.store import retry
from tests.support import FAST, QUICK_STORE, SECRET, harness_env, run_harness, runs_by_kind, store

pytestmark = pytest.mark.e2e


def one_line_error(capsys, *argv: str) -> str:
    """Run a subcommand in process; it must fail with exit 2 and exactly one line on stderr."""
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def test_no_secret_reaches_a_store_a_file_or_the_console(served_sweep):
    proc, root = served_sweep.sweep, served_sweep.root
    assert proc.returncode == 0, proc.stderr
    report = run_harness("--tracking-uri", served_sweep.uri, "report", "--out", "rep", cwd=root)  # a server too
    assert report.returncode == 0 and "| tiny | 8 | 64 | 1 |" in report.stdout and "| tiny | 8 | 64 | 2 |" in report.stdout
    assert SECRET not in proc.stdout + proc.stderr + report.stdout + report.stderr
    leaks = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []  # the server's database and artifacts, outputs/ (result.json, .hydra, sweep.json)
    assert len(list(root.glob("server/artifacts/**/config.yaml"))) == 2  # the scan saw the artifacts
    assert len(list(root.glob("server/artifacts/*/*/artifacts/summary.md"))) == 1  # on the parent, at the top
    assert not (root / "mlruns").exists()  # everything went to the server


def test_sweeps_started_together_never_share_a_folder(workdir):
    procs = [subprocess.Popen([sys.executable, "-m", "harness", "-m", *FAST, "bs=1,2"], cwd=workdir,
                              env=harness_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    sweeps = sorted((workdir / "outputs" / "sweeps").glob("*/*"))
    assert len(sweeps) == 3 and all(len(list(s.glob("*/result.json"))) == 2 for s in sweeps)
    _, parents, children = runs_by_kind(store(workdir))
    assert len(parents) == 3 and all(p.info.status == "FINISHED" for p in parents)
    per_parent = sorted(sum(c.data.tags["mlflow.parentRunId"] == p.info.run_id for c in children) for p in parents)
    assert per_parent == [2, 2, 2]


def test_new_keys_are_refused_in_one_line_naming_the_nearest(workdir):
    typo = run_harness("model=tiny", "+decode_token=8", cwd=workdir)
    assert typo.returncode == 2
    assert typo.stderr.strip() == "harness: decode_token is not a config key: did you mean decode_tokens?"
    unknown = run_harness("-m", "foo=1,2", cwd=workdir)
    assert unknown.returncode == 2 and unknown.stderr.startswith("harness: foo is not a config key; the keys are")
    assert not (workdir / "outputs").exists() and not (workdir / "mlruns").exists()


def test_two_ctrl_c_presses_leave_nothing_running(workdir):
    args = ["model=tiny", "warmup=2", "context_len=8", "decode_tokens=1000", "cache_len=1100", "repeats=1", "bs=1,2"]
    proc = subprocess.Popen([sys.executable, "-m", "harness", "-m", *args], cwd=workdir, env=harness_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "job 1/2" in line and ": decode" in line:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            break
    proc.communicate(timeout=120)
    _, parents, children = runs_by_kind(store(workdir))
    assert [p.info.status for p in parents] == ["KILLED"] and [c.info.status for c in children] == ["KILLED"]


def test_sync_marks_an_abandoned_sweep_that_had_no_finished_job(workdir):
    killed = run_harness("-m", *FAST, "bs=1,2", cwd=workdir, env={"HARNESS_INJECT_FAULT": "sigkill:bs=1 "})
    assert killed.returncode == -signal.SIGKILL
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "RUNNING" and children == []
    assert cli.main(["sync", "outputs"]) == 0
    marked = store(workdir).get_run(parent.info.run_id)
    assert marked.info.status == "FAILED" and marked.data.tags["failure_reason"] == "abandoned"


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


def test_a_down_or_hung_store_costs_seconds_and_one_line(workdir, capsys, monkeypatch):
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections (the kernel completes them) and never answers
    start = time.monotonic()
    proc = run_harness(*FAST, cwd=workdir, env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{hung.getsockname()[1]}"})
    elapsed = time.monotonic() - start
    hung.close()
    # MLflow's own settings (7 retries of 120 s) would hold the job for minutes; the harness's budget (a 5 s
    # request timeout, 15 s of retries) for under 20 s. 60 s leaves room for a loaded machine's start-up.
    assert proc.returncode == 3 and elapsed < 60, (elapsed, proc.stderr)  # 3: measured, not logged
    (result,) = (workdir / "outputs").glob("**/result.json")
    assert json.loads(result.read_text())["status"] == "FINISHED"
    last = proc.stdout.strip().splitlines()[-1]  # the last line says so, and how to log it later
    assert last.startswith("NOT LOGGED: 1 of 1 results did not reach the store") and "harness sync " in last
    assert f"harness sync {result.parent.parent}" in last
    not_a_database = sqlite3.DatabaseError("file is not a database")  # not transient: raised at once
    assert not retry.is_transient(not_a_database) and retry.is_transient(ConnectionError("Connection refused"))
    calls = []
    with pytest.raises(sqlite3.DatabaseError):
        retry.with_retries("logging", lambda: calls.append(1) or (_ for _ in ()).throw(not_a_database))
    assert calls == [1] and "retrying" not in capsys.readouterr().err
    for var, value in {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", **QUICK_STORE}.items():
        monkeypatch.setenv(var, value)
    for argv in (["report"], ["sync", "outputs"], ["rerun", "0123abcd"]):
        assert "cannot reach the tracking store http://127.0.0.1:9" in one_line_error(capsys, *argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the graphed jobs that fail without CUDA")
def test_report_on_a_resumed_sweep(workdir, capsys):
    sweep = ["-m", *FAST, "bs=1,2", "cache_len=64,128", "mode=eager,graphed"]
    first = run_harness(*sweep, cwd=workdir)
    assert first.returncode == 1  # the graphed jobs need CUDA
    link = next(line for line in first.stdout.splitlines() if line.startswith("Compare this sweep's runs: "))
    finished = [c for c in runs_by_kind(store(workdir))[2] if c.info.status == "FINISHED"]
    assert len(finished) == 4 and sorted(re.findall(r"%22([0-9a-f]{32})%22", link)) == sorted(
        c.info.run_id for c in finished)  # the failed graphed runs are left out of the comparison
    again = run_harness(*sweep, "resume=true", cwd=workdir)
    assert "0 finished, 4 failed, 4 skipped (resume)" in again.stdout
    assert [line for line in again.stdout.splitlines() if line.endswith(" ")] == []  # no padding into a pipe
    db = workdir / "mlruns" / "mlflow.db"
    report = run_harness("--tracking-uri", f"sqlite:///{db}", "report", "--out", "rep", cwd=workdir)
    assert report.returncode == 0, report.stderr
    for bs, cache in ((1, 64), (2, 64), (1, 128), (2, 128)):  # the skipped jobs shown by their original runs
        row = next(line for line in report.stdout.splitlines() if line.startswith(f"| tiny | 8 | {cache} | {bs} |"))
        assert " ms ±" in row and "1.00x" in row and "FAILED: mode=graphed needs a CUDA GPU" in row
    assert "wrote summary.md, latency_vs_bs.png, speedup_vs_bs.png in" in report.stdout  # one context: no context plot
    for png in ("latency_vs_bs.png", "speedup_vs_bs.png"):
        image = matplotlib.image.imread(workdir / "rep" / png)
        assert image.ndim == 3 and image.shape[0] > 100
    resumed_parent = max(runs_by_kind(store(workdir))[1], key=lambda p: p.info.start_time)
    logged = {a.path for a in store(workdir).list_artifacts(resumed_parent.info.run_id)}
    assert {"summary.md", "latency_vs_bs.png"} <= logged
    client = store(workdir)
    empty = client.create_run(client.get_experiment_by_name("harness").experiment_id,
                              tags={"harness.kind": "sweep"}).info.run_id
    assert cli.main(["report", empty, "--out", str(workdir / "rep2")]) == 0
    assert "(no job runs in this sweep)" in capsys.readouterr().out
    assert "No such file or directory: '/proc/nope'" in one_line_error(capsys, "report", "--out", "/proc/nope")


def test_ui_refuses_a_busy_port(workdir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main(["ui", "--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_help_and_version_are_the_harness_own(workdir):
    helped = run_harness("--help", cwd=workdir)
    assert helped.returncode == 0 and "harness report" in helped.stdout and "powered by Hydra" not in helped.stdout
    # the presets and the tiny model, as conf/ holds them (a new preset lists itself)
    listed = lambda prefix: next(l for l in helped.stdout.splitlines() if l.startswith(prefix))  # noqa: E731
    presets = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml"))
    assert listed("named sweeps (+experiment=NAME): ").split(": ", 1)[1].startswith(", ".join(presets) + " (")
    models = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "model").glob("*.yaml"))
    assert "tiny" in models and listed("models (model=NAME): ").split(": ", 1)[1].split(";")[0] == ", ".join(models)
    assert "python -m harness -m model=tiny device=cpu" in helped.stdout
    assert run_harness("--version", cwd=workdir).stdout.startswith("harness 0.1.0")


def test_a_read_command_creates_no_store(workdir, capsys):
    assert "no tracking store at sqlite:///" in one_line_error(capsys, "report")
    assert not (workdir / "mlruns").exists()


def test_installing_keeps_a_torch_already_in_the_supported_range(tmp_path):
    """`pip install -e .` next to a CUDA torch of another supported version must not replace it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    purelib = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    dist = Path(purelib) / "torch-2.11.0.dist-info"  # as the H200's torch 2.11.0+cu130 declares itself
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    (dist / "RECORD").write_text("")
    report = tmp_path / "report.json"
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--dry-run", "--report", report, "-e", str(Path(__file__).parents[1])],
                   check=True, capture_output=True)
    installs = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "torch" not in installs and "harness" in installs


def test_only_a_whole_5xx_status_counts_as_a_passing_store_error():
    """A port such as 45045 holds "504": a busy port is the user's error, never a store to wait for."""
    assert not retry.is_transient(ConfigError("port 45045 on 127.0.0.1 is already in use: pass --port"))
    assert retry.is_transient(RuntimeError("API request failed with error code 503 != 200"))
    assert retry.is_transient(RuntimeError("504 Gateway Time-out")) and not retry.is_transient(RuntimeError("run 5040"))
