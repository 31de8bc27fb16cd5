"""Ctrl-C and SIGTERM: a sweep, a rerun and an A/B end killed, keep what finished and leave nothing running."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import FAST, REPO, compose_cfg, harness_env, run_in_process, runs_by_kind, store


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


def test_sigterm_ends_a_rerun_killed_as_it_ends_a_sweep(workdir, capfd, monkeypatch):
    assert run_in_process(capfd, monkeypatch, "-m", *FAST, "bs=1,2").returncode == 0  # the sweep to rerun
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
