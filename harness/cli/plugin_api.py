"""What the Hydra plugins under hydra_plugins/ may call of the harness, and nothing more: the sweeper records a
job that Hydra could not compose, orders the jobs as `harness plan` lists them, and says how many jobs a sweep holds.
Everything else stays free to change."""
from __future__ import annotations

from pathlib import Path

from harness.cli.interrupt import on_signal  # a job process's SIGTERM ends its run KILLED, remembered
from harness.cli.precheck import one_line  # Hydra's error on one line, as the command line gives it
from harness.cli.sweep_file import update_sweep_file
from harness.config.labels import in_run_order, varying_keys
from harness.progress import say


def record_rejected(sweep_cfg, overrides: list[str], reason: str, index: int) -> None:
    """A job whose overrides Hydra refused to compose: recorded FAILED (result file and store) with `reason`."""
    from harness.cli.app import record_unrun

    record_unrun(sweep_cfg, overrides, reason, f"rejected-{index}", None)


def record_died(sweep_cfg, overrides: list[str], reason: str, job_num: int, status: str = "FAILED") -> None:
    """A job whose process died before it recorded itself (SIGKILL, a crash; KILLED: stopped by Ctrl-C), recorded
    in its own folder."""
    from harness.cli.app import record_unrun

    record_unrun(sweep_cfg, overrides, reason, str(job_num), job_num, status)


def outcome(record) -> str:
    """A job's last progress line: its label and median, or its status and reason."""
    from harness.cli.runner import outcome as line

    return f"{record.label}: {line(record)}"


def note_sweep_size(sweep_dir: Path, n_jobs: int, n_rejected: int, jobs: list[list[str]] = ()) -> None:
    """The job count every job's progress line shows, and the keys its jobs vary (named in every run's label),
    kept in the sweep's sweep.json."""
    update_sweep_file(sweep_dir, n_jobs=n_jobs, n_rejected=n_rejected, varying=varying_keys([list(j) for j in jobs]))


__all__ = ["in_run_order", "note_sweep_size", "on_signal", "one_line", "outcome", "record_died", "record_rejected",
           "say"]
