"""The Hydra side of the harness: the task every job runs, and the callback around a sweep.

A job validates its config, measures, writes result.json to its job folder, and only then logs
to MLflow. Every failure becomes a FAILED record with its reason; nothing is raised to Hydra, so
one job's failure never stops the sweep. The sweep's summary and exit status come from the
result files, which any launcher leaves in the sweep folder.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness import results, tracking
from harness.config import VARIANT_KEYS, ConfigError, RunConfig, config_hash, run_label, run_variant, to_run_config
from harness.job import JobError, measure
from harness.progress import say
from harness.summary import print_summary

SWEEP_FILE = "sweep.json"
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
_failures = 0


def exit_status() -> int:
    return 1 if _failures else 0


def compose_config(*overrides: str) -> DictConfig:
    """The config a command line with these overrides would run, composed from conf/ in code."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_run_config(*overrides: str) -> RunConfig:
    return to_run_config(compose_config(*overrides))


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


def run_job(cfg: DictConfig) -> dict:
    """The Hydra task: one job of a run or a sweep."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    sweep = read_sweep_file(Path(hc.sweep.dir)) if multirun else {}
    uri = sweep.get("tracking_uri") or tracking.resolve_uri(OmegaConf.select(cfg, "tracking.uri"))
    experiment = sweep.get("experiment") or OmegaConf.select(cfg, "tracking.experiment", default="harness")
    ctx = JobContext(Path(hc.runtime.output_dir), uri, experiment, sweep.get("parent_run_id"),
                     hc.job.num if multirun else 0, list(hc.overrides.task))
    if not multirun:
        return run_single(cfg, ctx)
    of = f"/{sweep['n_jobs']}" if sweep.get("n_jobs") else ""
    ctx.progress = f"job {ctx.job_num + 1}{of}"
    return execute(cfg, ctx)


def run_single(cfg: DictConfig, ctx: JobContext) -> dict:
    """A run outside a sweep gets a parent of its own, and the summary a sweep would print."""
    tracking.mark_abandoned_quietly(ctx.uri, ctx.experiment)
    label = new_record(cfg, ctx)["label"]
    ctx.parent = _open_parent(ctx.uri, ctx.experiment, f"run {label}", {"run_dir": str(ctx.job_dir.resolve())})
    outcome = execute(cfg, ctx)  # an interrupt ends the parent KILLED in there
    _close_parent(ctx.uri, ctx.parent, status="FINISHED" if outcome["status"] in ("FINISHED", "SKIPPED") else "FAILED")
    print_summary([results.read(ctx.job_dir / results.RESULT_FILE)], f"run {ctx.job_dir}", tracking.ui_command(ctx.uri))
    return outcome


def execute(cfg: DictConfig, ctx: JobContext) -> dict:
    record = new_record(cfg, ctx)
    say_ = lambda msg: say(f"{ctx.progress} {record['label']}: {msg}")  # noqa: E731
    try:
        run_cfg = to_run_config(cfg)
        record["config_hash"] = config_hash(record["config"])
        if run_cfg.resume and (done := _finished_twin(ctx, record["config_hash"])):
            record.update(status="SKIPPED", reason=f"resume: run {done} already FINISHED with this config")
            results.write(ctx.job_dir, record)
            say_(f"skipped, {record['reason']}")
            return {"status": "SKIPPED"}
        measured = measure(run_cfg, on_phase=say_, artifacts_dir=ctx.job_dir)
        reason = measured.pop("failure", None)
        record.update(measured, status="FAILED" if reason else "FINISHED", reason=reason)
    except (ConfigError, JobError) as err:
        record.update(status="FAILED", reason=str(err))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: record this job KILLED, then let the sweep stop
        record.update(status="KILLED", reason="interrupted (SIGINT or SIGTERM)")
        finish(record, ctx)
        _close_parent(ctx.uri, ctx.parent, status="KILLED")
        raise
    except Exception as err:  # anything else: keep the traceback beside the result, not on screen
        record.update(status="FAILED", reason=f"{type(err).__name__}: {err}".splitlines()[0])
        ctx.job_dir.mkdir(parents=True, exist_ok=True)
        (ctx.job_dir / "error.log").write_text(traceback.format_exc())
    finish(record, ctx)
    say_(_outcome(record))
    return {"status": record["status"], "reason": record.get("reason")}


def _finished_twin(ctx: JobContext, config_hash: str) -> str | None:
    try:
        return tracking.find_finished(ctx.uri, ctx.experiment, config_hash)
    except Exception as err:  # noqa: BLE001 - with the store down, run the job rather than guess
        say(f"warning: resume could not ask {tracking.redact(ctx.uri)} ({type(err).__name__}); running the job")
        return None


def new_record(cfg: DictConfig, ctx: JobContext) -> dict:
    def sel(key: str):
        value = OmegaConf.select(cfg, key, default="?", throw_on_missing=False)
        return getattr(value, "value", value)  # enums by their value

    return {
        "result_id": uuid.uuid4().hex,
        "label": run_label(sel("model.name"), sel("bs"), sel("cache_len"),
                           run_variant({key: sel(key) for key in VARIANT_KEYS})),
        "job_num": ctx.job_num,
        "job_dir": str(ctx.job_dir.resolve()),
        "overrides": ctx.overrides,
        "tracking_uri": tracking.redact(ctx.uri),
        "experiment": ctx.experiment,
        "parent_run_id": ctx.parent,
        "tags": dict(ctx.tags),
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=False),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def finish(record: dict, ctx: JobContext) -> None:
    """result.json first, then the store; a store failure costs nothing but a warning."""
    global _failures
    _failures += record["status"] not in ("FINISHED", "SKIPPED")
    results.write(ctx.job_dir, record)
    try:
        record["mlflow_run_id"] = tracking.log_job(ctx.uri, ctx.experiment, ctx.parent, record, ctx.job_dir)
    except Exception as err:  # noqa: BLE001 - the store is optional, the result file is not
        say(f"warning: could not log {record['label']} to {tracking.redact(ctx.uri)} ({type(err).__name__}: "
            f"{str(err)[:200]}); its result is kept in {ctx.job_dir / results.RESULT_FILE} for `harness sync`")
        return
    results.write(ctx.job_dir, record)


def _outcome(record: dict) -> str:
    if record["status"] == "FINISHED":
        m = record["metrics"]
        return f"done, median {m['step_ms_median']:.3f} ms/step, {m['wall_ms_per_token']:.3f} ms/token wall"
    return f"{record['status']}: {record['reason']}"


def _open_parent(uri: str, experiment: str, name: str, tags: dict) -> str | None:
    try:
        return tracking.start_parent(uri, experiment, name, tags)
    except Exception as err:  # noqa: BLE001
        say(f"warning: tracking store {tracking.redact(uri)} unavailable ({type(err).__name__}: {str(err)[:200]}); "
            "results stay on disk")
        return None


def _close_parent(uri: str, parent: str | None, status: str) -> None:
    if parent is None:
        return
    try:
        tracking.end_run(uri, parent, status)
    except Exception as err:  # noqa: BLE001
        say(f"warning: could not close parent run {parent} ({type(err).__name__}: {str(err)[:200]})")


def read_sweep_file(sweep_dir: Path) -> dict:
    path = sweep_dir / SWEEP_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def update_sweep_file(sweep_dir: Path, **fields) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    data = {**read_sweep_file(sweep_dir), **fields}
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(data, indent=2))


def record_rejected(sweep_cfg: DictConfig, overrides: list[str], reason: str, index: int) -> None:
    """A job whose overrides Hydra refused to compose: recorded FAILED with Hydra's own message."""
    sweep_dir = Path(sweep_cfg.hydra.sweep.dir)
    sweep = read_sweep_file(sweep_dir)
    ctx = JobContext(sweep_dir / f"rejected-{index}", sweep.get("tracking_uri") or tracking.resolve_uri(sweep_cfg.tracking.uri),
                     sweep.get("experiment", sweep_cfg.tracking.experiment), sweep.get("parent_run_id"), None, overrides)
    values = dict(o.split("=", 1) for o in overrides if "=" in o)
    default_mode = getattr(sweep_cfg.mode, "value", sweep_cfg.mode)
    record = new_record(OmegaConf.create({}), ctx)
    record.update(label=run_label(values.get("model", sweep_cfg.model.name), values.get("bs", sweep_cfg.bs),
                                  values.get("cache_len", sweep_cfg.cache_len), values.get("mode", default_mode)),
                  status="FAILED", reason=reason, config={})
    finish(record, ctx)
    say(f"rejected {' '.join(overrides)}: {reason}")


def summarize(sweep_dir: Path, uri: str, wall_s: float | None = None) -> list[dict]:
    records = []
    for path in results.find(sweep_dir):
        try:
            records.append(results.read(path))
        except results.ResultFileError as err:
            say(f"warning: {err}")
    print_summary(records, f"sweep {sweep_dir}", tracking.ui_command(uri), wall_s=wall_s)
    return records


REMOTE_LAUNCHERS = ("SlurmLauncher",)  # launchers whose jobs run on other hosts


def refuse_sqlite_across_hosts(launcher: str, uri: str) -> None:
    """SQLite's file locks don't hold across hosts: jobs on other nodes must log to a server."""
    if uri.startswith("sqlite:") and any(name in launcher for name in REMOTE_LAUNCHERS):
        say(f"error: this sweep's jobs run on other hosts ({launcher.rsplit('.', 1)[-1]}), and they cannot share "
            f"the SQLite store {uri} safely. Start a tracking server, e.g. `mlflow server --backend-store-uri "
            "sqlite:///ABS/PATH/mlflow.db --host 0.0.0.0 --port 5000` (or a postgresql:// URI for a team), then "
            "set MLFLOW_TRACKING_URI=http://THAT_HOST:5000 (or tracking.uri=...).")
        sys.exit(2)


class SweepCallback(Callback):
    """Opens the sweep's parent run before any job, closes it and prints the table after the last."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        uri = tracking.resolve_uri(config.tracking.uri)
        refuse_sqlite_across_hosts(config.hydra.launcher.get("_target_", ""), uri)
        tracking.mark_abandoned_quietly(uri, config.tracking.experiment)
        overrides = " ".join(config.hydra.overrides.task)
        parent = _open_parent(uri, config.tracking.experiment, f"sweep {sweep_dir.name}",
                              {"overrides": overrides, "sweep_dir": str(sweep_dir.resolve())})
        update_sweep_file(sweep_dir, parent_run_id=parent, tracking_uri=uri, started=time.time(),
                          experiment=config.tracking.experiment, overrides=overrides)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        global _failures
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep = read_sweep_file(sweep_dir)
        records = summarize(sweep_dir, sweep["tracking_uri"], wall_s=time.time() - sweep["started"])
        _failures = sum(r.get("status") not in ("FINISHED", "SKIPPED") for r in records)
        _close_parent(sweep["tracking_uri"], sweep.get("parent_run_id"), "FAILED" if _failures else "FINISHED")
