"""The real CLI in subprocesses, as a user runs it: one-line refusals before anything is created, Hydra's own
flags, help and version, what a CPU run records."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import FAST, one_line_error, run_harness


def test_new_keys_are_refused_in_one_line_naming_the_nearest(workdir):
    typo = run_harness("model=tiny", "+decode_token=8", cwd=workdir)
    assert typo.returncode == 2
    assert typo.stderr.strip() == "harness: decode_token is not a config key: did you mean decode_tokens?"
    unknown = run_harness("-m", "foo=1,2", cwd=workdir)
    assert unknown.returncode == 2 and unknown.stderr.startswith("harness: foo is not a config key; the keys are")
    assert not (workdir / "outputs").exists() and not (workdir / "mlruns").exists()


def test_help_and_version_are_the_harness_own(workdir):
    helped = run_harness("--help", cwd=workdir)
    assert helped.returncode == 0 and "harness report" in helped.stdout and "powered by Hydra" not in helped.stdout
    # the presets and the tiny model, as conf/ holds them (a new preset lists itself)
    listed = lambda prefix: next(l for l in helped.stdout.splitlines() if l.startswith(prefix))  # noqa: E731
    presets = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "experiment").glob("*.yaml"))
    assert listed("named sweeps (+experiment=NAME): ").split(": ", 1)[1].startswith(", ".join(presets) + " (")
    models = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "model").glob("*.yaml"))
    assert "tiny" in models and listed("models (model=NAME): ").split(": ", 1)[1].split(";")[0] == ", ".join(models)
    assert "python -m harness -m model=tiny device=cpu" in helped.stdout
    assert run_harness("--version", cwd=workdir).stdout.startswith("harness 0.1.0")


def test_a_read_command_creates_no_store(workdir, capsys):
    assert "no tracking store at sqlite:///" in one_line_error(capsys, "report")
    assert not (workdir / "mlruns").exists()


def test_the_threads_that_move_a_cpu_run_are_recorded(workdir):
    proc = run_harness(*FAST, "device=cpu", cwd=workdir, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = (workdir / "outputs").glob("**/result.json")
    env = json.loads(result.read_text())["environment"]
    assert env["OMP_NUM_THREADS"] == "1" and env["torch_threads"] == "1" and "torch_interop_threads" in env


@pytest.mark.usefixtures("fresh_model_cache")
def test_a_preset_sweeps_without_m_and_a_tiny_run_warns_of_nothing_deprecated(workdir):
    proc = run_harness("+experiment=design-card", *FAST, "device=cpu", "bs=1,2", "mode=eager", cwd=workdir,
                       env={"PYTHONWARNINGS": "default"})  # every warning shown, once
    assert proc.returncode == 0, proc.stderr
    assert "sweep: 2 jobs, 2 to run" in proc.stderr and "2 finished, 0 failed" in proc.stdout
    deprecated = [line for line in proc.stderr.splitlines()
                  if re.search(r"(FutureWarning|DeprecationWarning)", line) and re.search(r"torch|transformers", line)]
    assert deprecated == []
