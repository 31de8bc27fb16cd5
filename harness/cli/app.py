"""The Hydra application: the task every job runs, and the callback around a sweep.

The sweep's summary and exit status come from the result files, which any launcher leaves in the
sweep folder; sweep.json holds what the jobs share (the parent run, the store, the job count).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from mlflow.entities import Metric
from omegaconf import DictConfig, OmegaConf

from harness.cli.sweep_file import read_sweep_file, set_status, update_sweep_file
from harness.store import results, tracking
from harness.config.labels import run_label, shown_key
from harness.progress import say
from harness.record import JobRecord, exit_code, failure_summary, flatten
from harness.store.redact import redact, redact_files
from harness.cli.runner import JobContext, close_parent, execute, finish, new_record, open_parent
from harness.analysis.summary import child_speedups, parent_metrics, print_summary

def run_job(cfg: DictConfig) -> JobRecord:
    """The Hydra task: one job of a run or a sweep."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    job_dir = Path(hc.runtime.output_dir)
    redact_files(job_dir, ".hydra/*.yaml")  # Hydra wrote the command line there, credentials and all
    sweep = read_sweep_file(Path(hc.sweep.dir)) if multirun else {}
    uri = tracking.resolve_uri(OmegaConf.select(cfg, "tracking.uri"))
    ctx = JobContext(job_dir, uri, cfg.tracking.experiment, sweep.get("parent_run_id"),
                     hc.job.num if multirun else 0, list(hc.overrides.task), varying=sweep.get("varying", []))
    if not multirun:
        return run_single(cfg, ctx)
    redact_files(Path(hc.sweep.dir), "multirun.yaml")
    of = f"/{sweep['n_jobs']}" if sweep.get("n_jobs") else ""
    ctx.progress = f"job {ctx.job_num + 1}{of}"
    return execute(cfg, ctx)


def run_single(cfg: DictConfig, ctx: JobContext) -> JobRecord:
    """A run outside a sweep gets a parent of its own, and the summary a sweep would print."""
    tracking.mark_abandoned_quietly(ctx.uri, ctx.experiment)
    label = run_label(flatten(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)))
    ctx.parent = open_parent(ctx.uri, ctx.experiment, f"run {label}", "run", {"run_dir": str(ctx.job_dir.resolve())})
    record = execute(cfg, ctx)  # an interrupt ends the parent KILLED in there
    close_parent(ctx.uri, ctx.parent, "FINISHED" if record.ok else "FAILED", failure_summary([record]))
    summarize([record], f"run {ctx.job_dir}", ctx.uri)
    return record


def record_unrun(sweep_cfg: DictConfig, overrides: list[str], reason: str, folder: str, job_num: int | None,
                 status: str = "FAILED") -> None:
    """A job of the sweep that left no record of its own (Hydra refused to compose it, or its process died):
    recorded FAILED with `reason`, in the sweep's `folder`, under the label its overrides give."""
    sweep_dir = Path(sweep_cfg.hydra.sweep.dir)
    sweep = read_sweep_file(sweep_dir)
    ctx = JobContext(sweep_dir / folder, tracking.resolve_uri(sweep_cfg.tracking.uri), sweep_cfg.tracking.experiment,
                     sweep.get("parent_run_id"), job_num, overrides, varying=sweep.get("varying", []))
    flat = flatten(OmegaConf.to_container(sweep_cfg, resolve=False, enum_to_str=True))
    flat.update(o.split("=", 1) for o in overrides if "=" in o)
    flat["model.name"] = flat.get("model", flat.get("model.name"))  # a model override names its preset
    record = new_record({}, ctx, label=run_label(flat, ctx.varying))
    record.status, record.reason = status, redact(reason)
    finish(record, ctx)
    say(f"{record.label}: {status}: {record.reason}")


def summarize(records: list[JobRecord], title: str, uri: str, wall_s: float | None = None) -> None:
    """Print the table of a run or sweep that ended."""
    print_summary(records, title, tracking.ui_command(uri), wall_s=wall_s)


def land(uri: str, parent: str | None, experiment: str, records: list[JobRecord], sweep_dir: Path) -> None:
    """The sweep's parent as MLflow's landing page: the figures a user would chart (median and speedup per
    mode x bs) as its metrics, the results table as its description (the first thing its page shows), the
    report's summary and plots as its first artifacts, each child's speedup over eager, and a link to the
    page comparing the finished runs."""
    if parent is None:
        return
    from harness.analysis import report  # matplotlib: only when a sweep ends
    from harness.analysis.headline import headline_markdown

    try:
        c, now = tracking.client(uri), int(time.time() * 1000)
        c.log_batch(parent, metrics=[Metric(k, v, now, 0) for k, v in parent_metrics(records).items()])
        for run_id, speedup in child_speedups(records).items():
            c.log_metric(run_id, "speedup_vs_eager", speedup, now)
        c.set_tag(parent, "mlflow.note.content", redact(headline_markdown(records, conditions_first=False))[:5000])
        for path in report.from_records(records, f"sweep {sweep_dir.name}", sweep_dir / "report"):
            c.log_artifact(parent, str(path))  # at the top: the artifacts tab opens on them, not on a folder
        if ids := [r.mlflow_run_id for r in records if r.mlflow_run_id and r.status == "FINISHED"]:
            print(f"This sweep's results table: {tracking.run_url(uri, experiment, parent)}")
            print(f"Compare this sweep's runs: {tracking.compare_url(uri, experiment, ids)}")
            varying = next((r.varying for r in records if r.varying), [])
            view = tracking.share_sweep_view(uri, experiment, parent, [shown_key(k) for k in varying])
            print(f"Every run, fastest first: {tracking.runs_table_url(uri, experiment, view)}")
    except Exception as err:  # noqa: BLE001 - the landing is a convenience; the runs are logged already
        say(f"warning: could not log the sweep's figures on its parent run ({type(err).__name__}: {redact(str(err))[:200]})")


NOT_IN_THE_NAME = ("tracking.", "resume=", "hydra.", "hydra/")


def sweep_name(task_overrides: list[str], preset_params: dict) -> str:
    """A parent run's name: the axes the sweep varied, as typed (`bs=1,2,4,8 × mode=eager,graphed`), a preset's own
    axes included unless the command line set them, then after ` · ` the keys it fixed (`model=tiny`). Where the runs
    are stored, `resume` and Hydra's own settings are not what the sweep measures: they are left out."""
    given = {o.lstrip("+").split("=", 1)[0] for o in task_overrides}
    typed = [o.lstrip("+") for o in task_overrides if not o.lstrip("+").startswith(NOT_IN_THE_NAME)]
    typed += [f"{key}={value}" for key, value in preset_params.items() if key not in given]
    swept = [o for o in typed if "," in o or "(" in o]  # a list, or a sweep function: range(...), choice(...)
    fixed = [o for o in typed if o not in swept]
    name = " · ".join(part for part in (" × ".join(swept), " ".join(fixed)) if part)
    return redact(name)[:240] or "sweep of the defaults"


def with_stand_ins(uri: str, parent: str | None, records: list[JobRecord]) -> list[JobRecord]:
    """A resumed sweep's records, each job that resume skipped replaced by the finished run that stood in for it
    (read back from the store), so that its tables show every job's numbers; the parent is tagged with the sweeps
    those runs came from (`harness.resumes`), and each of them with this one (`harness.resumed_by`)."""
    out, earlier = [], set()
    for record in records:
        twin = record.tags.get("resumed_from") if record.status == "SKIPPED" else None
        if twin is None:
            out.append(record)
            continue
        try:
            stand_in = tracking.load_result(uri, twin)
            earlier.add(tracking.get_run(uri, twin).data.tags.get("mlflow.parentRunId"))
        except Exception as err:  # noqa: BLE001 - the SKIPPED record stays, and says why
            say(f"warning: could not read the run {twin} that stood in for {record.label} ({type(err).__name__})")
            out.append(record)
            continue
        stand_in.label, stand_in.varying = record.label, record.varying  # named as this sweep names its runs
        out.append(stand_in)
    earlier.discard(None)
    if parent and earlier:
        try:
            c = tracking.client(uri)
            c.set_tag(parent, "harness.resumes", ",".join(sorted(earlier)))
            for old in earlier:
                c.set_tag(old, "harness.resumed_by", parent)
        except Exception as err:  # noqa: BLE001 - a link is a convenience
            say(f"warning: could not link the resumed sweep's runs ({type(err).__name__})")
    return out


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
        started = time.time()  # the sweep's wall clock includes any wait on the store below
        sweep_dir = Path(config.hydra.sweep.dir)
        uri = tracking.resolve_uri(config.tracking.uri)
        refuse_sqlite_across_hosts(config.hydra.launcher.get("_target_", ""), uri)
        tracking.mark_abandoned_quietly(uri, config.tracking.experiment)
        overrides = redact(" ".join(config.hydra.overrides.task))
        name = sweep_name(list(config.hydra.overrides.task), dict(config.hydra.sweeper.get("params") or {}))
        parent = open_parent(uri, config.tracking.experiment, name, "sweep",
                             {"overrides": overrides, "sweep_dir": str(sweep_dir.resolve())})
        set_status(1)  # until the sweep ends
        update_sweep_file(sweep_dir, parent_run_id=parent, tracking_uri=redact(uri), started=started,
                          experiment=config.tracking.experiment, overrides=overrides)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        redact_files(sweep_dir, "multirun.yaml")
        sweep = read_sweep_file(sweep_dir)
        uri = tracking.resolve_uri(config.tracking.uri)
        records = results.read_all(sweep_dir, on_error=lambda err: say(f"warning: {err}"))
        summarize(records, f"sweep {sweep_dir}", uri, wall_s=time.time() - sweep["started"])
        update_sweep_file(sweep_dir, exit_status=exit_code(records))
        set_status(exit_code(records))
        # the parent's table and figures show every job's numbers, a skipped one's from the run that stood in for it
        land(uri, sweep.get("parent_run_id"), config.tracking.experiment,
             with_stand_ins(uri, sweep.get("parent_run_id"), records), sweep_dir)
        close_parent(uri, sweep.get("parent_run_id"), "FAILED" if exit_code(records) else "FINISHED",
                     failure_summary(records))
