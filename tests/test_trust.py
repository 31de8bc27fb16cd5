"""Runs to trust: reruns by id, resume, faults survived, nothing lost, nothing executed from a store.
Real subprocesses of the CLI against real SQLite stores."""
from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from harness.cli import commands as cli
from harness.store.redact import redact
from tests.support import FAST, compose_cfg, QUICK_STORE, REPO, free_port, harness_env, run_harness, runs_by_kind, stop_group, store, wait_for_http

pytestmark = pytest.mark.e2e  # real subprocesses of the CLI: run with `-m e2e`, left out of `-m "not e2e"`


def child_runs(workdir: Path):
    return runs_by_kind(store(workdir))[2]


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


def test_resume_runs_only_what_a_killed_sweep_left_missing(workdir):
    killed = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env={"HARNESS_INJECT_FAULT": "sigkill:bs=2 "})
    assert killed.returncode == -signal.SIGKILL
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "RUNNING" and [c.data.params["bs"] for c in children] == ["1"]

    again = run_harness("-m", *FAST, "bs=1,2,3", "resume=true", cwd=workdir)
    assert again.returncode == 0, again.stderr
    assert "2 finished, 0 failed, 1 skipped (resume)" in again.stdout
    client = store(workdir)
    abandoned = client.get_run(parent.info.run_id)
    assert abandoned.info.status == "FAILED" and abandoned.data.tags["failure_reason"] == "abandoned"
    finished = [c for c in child_runs(workdir) if c.info.status == "FINISHED"]
    assert sorted(c.data.params["bs"] for c in finished) == ["1", "2", "3"]  # bs=1 once, not twice


def test_an_oom_in_one_job_leaves_the_others_finished(workdir):
    proc = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env={"HARNESS_INJECT_FAULT": "oom:bs=2 "})
    assert proc.returncode == 1
    by_bs = {c.data.params["bs"]: c for c in child_runs(workdir)}
    assert by_bs["1"].info.status == by_bs["3"].info.status == "FINISHED"
    assert by_bs["2"].info.status == "FAILED"
    assert by_bs["2"].data.tags["failure_reason"].startswith("out of memory at bs=2 cache_len=64 mode=eager")
    assert by_bs["2"].data.tags["failure_reason"].endswith("memory back at the post-load baseline: not measured off a GPU")


def test_sigterm_ends_the_sweep_killed_and_keeps_finished_results(workdir):
    args = ["model=tiny", "warmup=2", "context_len=8", "decode_tokens=1000", "cache_len=1100", "repeats=1", "bs=1,2,3,4"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "harness", "-m", *args], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until the second job decodes, then stop the sweep as a scheduler would
        if "job 2/4" in line and ": decode" in line:
            proc.send_signal(signal.SIGTERM)
            break
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    _, (parent,), children = runs_by_kind(store(workdir))
    assert parent.info.status == "KILLED"
    statuses = {c.data.params["bs"]: c.info.status for c in children}
    assert statuses == {"1": "FINISHED", "2": "KILLED"}
    for path in (workdir / "outputs").glob("**/result.json"):
        assert json.loads(path.read_text())["status"] in ("FINISHED", "KILLED")


def test_sigterm_ends_a_rerun_killed_as_it_ends_a_sweep(workdir):
    assert run_harness("-m", *FAST, "bs=1,2", cwd=workdir).returncode == 0
    _, (parent,), _ = runs_by_kind(store(workdir))
    proc = subprocess.Popen([sys.executable, "-m", "harness", "rerun", parent.info.run_id, "decode_tokens=1000",
                             "cache_len=1100"], cwd=workdir, env=harness_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the rerun's first job decodes: a scheduler's time limit comes
        if "rerun 1/2" in line and ": decode" in line:
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "[harness] interrupted" in err and "Traceback" not in err
    _, parents, children = runs_by_kind(store(workdir))
    rerun_parent = next(p for p in parents if p.data.tags.get("rerun_of") == parent.info.run_id)
    reruns = [c for c in children if c.data.tags["mlflow.parentRunId"] == rerun_parent.info.run_id]
    assert rerun_parent.info.status == "KILLED" and [c.info.status for c in reruns] == ["KILLED"]  # the second never ran


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended and not yet reaped by whoever adopted it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _spawned_children(pid: int) -> list[int]:
    """The multiprocessing interpreters that process `pid` spawned (its resource tracker left out)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_sigterm_ends_an_ab_and_the_fresh_interpreter_timing_it(workdir):
    """`harness ab --processes` times in a spawned interpreter. A scheduler's SIGTERM to the command must end that
    interpreter too: left running, it held the GPU to the end of an A/B no one would read. Bugs caught, each seen
    to fail it: no handler of ours (the command ran on, its interpreter with it), or one that waited for the
    interpreter."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ab", "cache_len=512", "cache_len=1024", "model=tiny",
                             "device=cpu", "warmup=2", "context_len=8", "decode_tokens=400", "--pairs", "200",
                             "--processes", "2"], cwd=workdir, env=harness_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        for line in proc.stderr:  # the spawned interpreter times its blocks: a scheduler's time limit comes
            if "ab: block 2/400" in line:
                break
        workers = _spawned_children(proc.pid)
        assert len(workers) == 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "[harness] interrupted" in err
        deadline = time.time() + 10
        while _alive(workers[0]) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(workers[0]), "the A/B's interpreter outlived the command"
    finally:  # a failed run leaves nothing behind to slow the tests after it
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def test_a_sigterm_that_a_library_turned_into_another_error_still_ends_the_job_killed_and_stops_the_sweep(
        workdir, monkeypatch):
    """torch.compile catches the KeyboardInterrupt a signal raises inside its trace and raises BackendCompilerFailed
    (with its dispatch modes half popped): the job must still end KILLED, and the sweep stop there, rather than count
    one more failure and run the next jobs in a broken process."""
    from harness.cli import interrupt, runner

    def compile_that_swallows_the_interrupt(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's time limit, arriving mid-compile
            time.sleep(5)
        except KeyboardInterrupt:
            raise RuntimeError("Attempted to unset ProxyTorchDispatchMode, but there wasn't one active.") from None
        raise AssertionError("the signal never came")

    monkeypatch.setattr(interrupt, "_RECEIVED", [])
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # pytest's own, put back below
    monkeypatch.setattr(runner, "measure", compile_that_swallows_the_interrupt)
    ctx = runner.JobContext(job_dir=workdir / "job", uri=f"sqlite:///{workdir}/mlflow.db", experiment="interrupted",
                            parent=None)
    try:
        interrupt.install()
        with pytest.raises(KeyboardInterrupt):
            runner.execute(compose_cfg(*FAST, "device=cpu"), ctx)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    result = json.loads((workdir / "job" / "result.json").read_text())
    assert result["status"] == "KILLED" and result["reason"] == "interrupted (SIGINT or SIGTERM)"
    assert "ProxyTorchDispatchMode" in (workdir / "job" / "error.log").read_text()  # what the library raised, kept


def test_sync_imports_what_an_unreachable_store_missed_exactly_once_and_names_a_corrupt_file(workdir):
    down = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", **QUICK_STORE}
    proc = run_harness("-m", *FAST, "bs=1,2,3", cwd=workdir, env=down)
    assert proc.returncode == 3 and "kept in" in proc.stderr  # a store that is down fails no job: 3, not logged
    results = sorted((workdir / "outputs").glob("**/result.json"))
    assert len(results) == 3 and not (workdir / "mlruns").exists()
    results[2].write_text('{"status": "FINI')  # a partial write
    for expected in ("2 imported, 0 already in the store, 1 unreadable", "0 imported, 2 already in the store, 1 unreadable"):
        synced = run_harness("sync", "outputs", cwd=workdir)
        assert synced.returncode == 1 and expected in synced.stdout, synced.stdout + synced.stderr
        assert f"{results[2].relative_to(workdir)}: not a readable result file" in synced.stderr
    children = child_runs(workdir)
    assert sorted(c.data.params["bs"] for c in children) == ["1", "2"]
    assert all(len(store(workdir).get_metric_history(c.info.run_id, "step_ms")) == 8 for c in children)


def test_credentials_in_a_tracking_uri_are_redacted():
    assert redact("https://user:tok3n@mlflow.example:5000/x") == "https://mlflow.example:5000/x"
    assert redact("sqlite:////tmp/mlruns/mlflow.db") == "sqlite:////tmp/mlruns/mlflow.db"
    assert redact("tracking.uri=http://a:b@h:1/p?x=1&access_token=abc&sig=d#f") == "tracking.uri=http://h:1/p?x=1&access_token=***&sig=***#f"
    assert redact("bs=4 mode=graphed") == "bs=4 mode=graphed"


def test_harness_ui_serves_the_store_on_loopback_only_without_mlflow_on_path(workdir):
    port = free_port()
    bare_path = {"PATH": "/usr/bin:/bin"}  # no venv bin/ (a user's PATH without the venv): mlflow comes from this interpreter
    proc = subprocess.Popen([sys.executable, "-m", "harness", "ui", "--port", str(port)], cwd=workdir,
                            env=harness_env(bare_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc)  # fails at once if the server exits
    finally:
        stop_group(proc)
        _, err = proc.communicate(timeout=30)
    assert f"mlflow ui --backend-store-uri sqlite:///{workdir}/mlruns/mlflow.db --host 127.0.0.1 --port {port}" in err
