"""One job, run and recorded: its record, its measurement, result.json, then the store. Shared by the
Hydra task (harness/cli/app.py) and `harness rerun`. Every failure becomes a FAILED record with its reason;
nothing is raised to the caller but an interrupt, so one job's failure never stops a sweep."""
from __future__ import annotations

import signal
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.cli import interrupt
from harness.store import results, runlog, tracking
from harness.config.schema import config_hash
from harness.errors import ConfigError
from harness.config.validate import to_run_config
from harness.config.labels import run_label
from harness.measure.job import JobError, measure
from harness.modes.base import CaptureError
from harness.progress import say
from harness.record import JobRecord, flatten, now_utc
from harness.store.redact import redact, redact_tree


@dataclass
class JobContext:
    """Where one job's record goes: its folder, its store, its parent run."""

    job_dir: Path
    uri: str
    experiment: str
    parent: str | None
    job_num: int | None = 0
    overrides: list[str] = field(default_factory=list)
    progress: str = "run"  # the prefix of its progress lines
    tags: dict[str, str] = field(default_factory=dict)  # extra run tags (rerun_of, ...)
    varying: list[str] = field(default_factory=list)  # the keys the sweep varies (sweep.json), named in labels


def new_record(config: dict, ctx: JobContext, label: str | None = None) -> JobRecord:
    """A job's record before it runs: secrets cut from its config and overrides, its label from its config."""
    return JobRecord(label=redact(label or run_label(flatten(config), ctx.varying)), config=redact_tree(config),
                     job_num=ctx.job_num, job_dir=str(ctx.job_dir.resolve()), overrides=redact_tree(ctx.overrides),
                     tracking_uri=redact(ctx.uri), experiment=ctx.experiment, parent_run_id=ctx.parent,
                     tags=dict(ctx.tags), varying=list(ctx.varying))


def execute(cfg: DictConfig, ctx: JobContext) -> JobRecord:
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=False)
    record = new_record(config, ctx)
    progress = lambda msg: say(f"{ctx.progress} {record.label}: {msg}")  # noqa: E731
    interrupts_before = interrupt.received()
    try:
        _run(cfg, ctx, record, progress)
        if interrupt.received() > interrupts_before:  # caught inside a library and raised as another error
            raise KeyboardInterrupt(interrupt.last())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: record this job KILLED, then let the sweep stop
        with signals_held():  # a second Ctrl-C must not cut the record short
            record.status, record.reason = "KILLED", "interrupted (SIGINT or SIGTERM)"
            finish(record, ctx)
            close_parent(ctx.uri, ctx.parent, status="KILLED", reason="interrupted (SIGINT or SIGTERM)")
            progress(outcome(record))
        raise
    if record.status != "SKIPPED":
        finish(record, ctx)
    progress(outcome(record))
    return record


def _run(cfg: DictConfig, ctx: JobContext, record: JobRecord, progress) -> None:
    try:
        run_cfg = to_run_config(cfg)
        record.config.update(run_cfg.derived())  # what ran, and what a rerun repeats
        record.label = redact(run_label(flatten(record.config), record.varying))
        record.config_hash = config_hash(record.config)
        if run_cfg.resume and (done := _finished_twin(ctx, record.config_hash)):
            record.status, record.reason = "SKIPPED", f"resume: run {done} already FINISHED with this config"
            record.tags["resumed_from"] = done  # the run that stands in for this job in the sweep's tables
            results.write(ctx.job_dir, record)
            _note_resumed(ctx, done)
            return
        record.measured(measure(run_cfg, on_phase=progress, artifacts_dir=ctx.job_dir))
    except (ConfigError, JobError, CaptureError) as err:
        record.status, record.reason = "FAILED", redact(str(err))
    except Exception as err:  # noqa: BLE001 - anything else: the traceback beside the result, not on screen
        record.status, record.reason = "FAILED", redact(f"{type(err).__name__}: {err}".splitlines()[0])
        ctx.job_dir.mkdir(parents=True, exist_ok=True)
        (ctx.job_dir / "error.log").write_text(redact(traceback.format_exc()))


def _note_resumed(ctx: JobContext, twin: str) -> None:
    """The parent names the finished run that stands in for a skipped job, so that reports show it."""
    if ctx.parent is None:
        return
    try:
        tracking.client(ctx.uri).set_tag(ctx.parent, f"harness.resumed.{ctx.job_num}", twin)
    except Exception as err:  # noqa: BLE001 - the job is skipped either way
        say(f"warning: could not note the resumed run {twin} on the parent ({type(err).__name__})")


@contextmanager
def signals_held():
    """SIGINT and SIGTERM ignored for the duration (main thread only, where Python handles signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _finished_twin(ctx: JobContext, config_hash: str) -> str | None:
    try:
        return tracking.find_finished(ctx.uri, ctx.experiment, config_hash)
    except Exception as err:  # noqa: BLE001 - with the store down, run the job rather than guess
        say(f"warning: resume could not ask {redact(ctx.uri)} ({type(err).__name__}); running the job")
        return None


def finish(record: JobRecord, ctx: JobContext) -> None:
    """result.json first, then the store; a store failure costs nothing but a warning."""
    record.ended = record.ended or now_utc()
    results.write(ctx.job_dir, record)
    try:
        record.mlflow_run_id = runlog.log_job(ctx.uri, ctx.experiment, ctx.parent, record, ctx.job_dir)
    except Exception as err:  # noqa: BLE001 - the store is optional, the result file is not
        say(f"warning: could not log {record.label} to {redact(ctx.uri)} ({type(err).__name__}: "
            f"{redact(str(err))[:200]}); its result is kept in {ctx.job_dir / results.RESULT_FILE} for `harness sync`")
        return
    results.write(ctx.job_dir, record)


def outcome(record: JobRecord) -> str:
    if record.status == "FINISHED":
        m = record.metrics
        done = f"done, median {m['step_ms_median']:.3f} ms/step, {m['wall_ms_per_step']:.3f} ms/step wall"
        if (why := record.mode_tags.get("fidelity_accepted")) is not None:  # never a silent pass
            done += f"; fidelity worse than eager's, accepted: {why}"
        return done
    return f"{record.status}: {record.reason}"


def open_parent(uri: str, experiment: str, name: str, kind: str, tags: dict) -> str | None:
    try:
        return tracking.start_parent(uri, experiment, name, kind, tags)
    except Exception as err:  # noqa: BLE001
        say(f"warning: tracking store {redact(uri)} unavailable ({type(err).__name__}: {redact(str(err))[:200]}); "
            "results stay on disk")
        return None


def close_parent(uri: str, parent: str | None, status: str, reason: str | None = None) -> None:
    if parent is None:
        return
    try:
        tracking.end_run(uri, parent, status, reason)
    except Exception as err:  # noqa: BLE001
        say(f"warning: could not close parent run {parent} ({type(err).__name__}: {redact(str(err))[:200]})")
