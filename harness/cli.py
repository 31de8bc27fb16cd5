"""The subcommands beside the Hydra entry point: rerun, sync, ui. Thin: parse, then call down."""
from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from harness import results, tracking
from harness.config import ConfigError, to_run_config
from harness.progress import say
from harness.record import JobRecord, exit_code
from harness.summary import print_summary
from harness.runner import JobContext, execute

COMMANDS = ("rerun", "sync", "ui", "report")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harness", description="harness subcommands; "
                                     "without one, `harness [overrides]` runs a job or a sweep (-m)")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else ./mlruns")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("rerun", help="run a logged run (or a whole sweep, given its parent) again")
    p.add_argument("run_id")
    p.add_argument("overrides", nargs="*", help="key=value changes, e.g. decode_tokens=512")
    p = sub.add_parser("sync", help="log every result.json under a folder that the store lacks, once")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--experiment", default=None, help="default: the one each result names")
    p = sub.add_parser("report", help="a sweep's table, plots and summary, logged on its parent run")
    p.add_argument("sweep_run_id", nargs="?", default=None, help="default: the newest sweep")
    p.add_argument("--experiment", default="harness")
    p.add_argument("--out", type=Path, default=None, help="where to write the files (default: a temp folder)")
    p = sub.add_parser("ui", help="browse the store in MLflow's UI (bound to 127.0.0.1 unless told otherwise)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        if args.command == "rerun":
            return rerun(uri, args.run_id, args.overrides)
        if args.command == "sync":
            return sync(uri, args.output_dir, args.experiment)
        if args.command == "report":
            return report(uri, args.sweep_run_id, args.experiment, args.out)
        return ui(uri, args.host, args.port)
    except (ConfigError, tracking.StoreError) as err:
        print(f"harness {args.command}: {err}", file=sys.stderr)
        return 2


def rerun(uri: str, run_id: str, overrides: list[str]) -> int:
    source = tracking.get_run(uri, run_id)
    experiment = tracking.experiment_name(uri, source)
    runs = tracking.children(uri, source) if source.data.tags.get("harness.kind") == "sweep" else [source]
    if not runs:
        raise ConfigError(f"run {run_id} is a sweep with no job runs to rerun")
    configs = [(run, rerun_config(tracking.load_config(uri, run.info.run_id), overrides)) for run in runs]
    parent = tracking.start_parent(uri, experiment, f"rerun of {source.info.run_name}", "rerun",
                                   {"rerun_of": run_id, "overrides": " ".join(overrides)})
    out_dir = Path("outputs") / "reruns" / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    outcomes = []
    for i, (run, cfg) in enumerate(configs):
        ctx = JobContext(out_dir / str(i), uri, experiment, parent, i, overrides, progress=f"rerun {i + 1}/{len(configs)}",
                         tags={"rerun_of": run.info.run_id})
        outcomes.append(execute(cfg, ctx))
    failed = exit_code(outcomes)
    tracking.end_run(uri, parent, "FAILED" if failed else "FINISHED")
    print_summary(outcomes, f"rerun of {run_id} in {out_dir}", tracking.ui_command(uri))
    print_side_by_side(runs, outcomes)
    return failed


def rerun_config(logged: dict, overrides: list[str]):
    """A logged config is data: it must pass the schema (no unknown keys, so no `_target_`),
    before and after the overrides; nothing in it is imported or instantiated."""
    base = OmegaConf.structured(to_run_config(OmegaConf.create(logged)))
    changed = OmegaConf.merge(base, OmegaConf.from_dotlist(overrides)) if overrides else base
    return OmegaConf.structured(to_run_config(changed))


def print_side_by_side(old_runs, new_records: list[JobRecord]) -> None:
    print("old run → rerun: median step ms, wall ms/token")
    for old, new in zip(old_runs, new_records):
        o, n = old.data.metrics, new.metrics
        fmt = lambda m, k: f"{m[k]:.3f}" if k in m else "-"  # noqa: E731
        print(f"  {old.info.run_name}: {fmt(o, 'step_ms_median')} → {fmt(n, 'step_ms_median')}, "
              f"{fmt(o, 'wall_ms_per_token')} → {fmt(n, 'wall_ms_per_token')}  ({old.info.run_id} → "
              f"{new.mlflow_run_id or 'not logged'})")


def sync(uri: str, output_dir: Path, experiment: str | None) -> int:
    """Import the result files the store is missing, each exactly once (matched by result id)."""
    if not output_dir.is_dir():
        raise ConfigError(f"{output_dir} is not a folder of harness outputs")
    imported = present = bad = 0
    parents: dict[str, str] = {}
    for path in results.find(output_dir):
        try:
            record = results.read(path)
        except results.ResultFileError as err:
            say(f"error: {err}")
            bad += 1
            continue
        exp = experiment or record.experiment
        tracking.mark_abandoned(uri, exp)
        if record.status == "SKIPPED" or tracking.find_result(uri, exp, record.result_id):
            present += 1
            continue
        parent = record.parent_run_id
        if not (parent and tracking.run_exists(uri, parent)):
            if exp not in parents:
                parents[exp] = tracking.start_parent(uri, exp, f"sync {output_dir}", "sync",
                                                     {"sync_dir": str(output_dir.resolve())})
            parent = parents[exp]
        tracking.log_job(uri, exp, parent, record, path.parent)
        imported += 1
    for parent in parents.values():
        tracking.end_run(uri, parent, "FINISHED")
    print(f"sync {output_dir}: {imported} imported, {present} already in the store, {bad} unreadable")
    return 1 if bad else 0


def report(uri: str, sweep_run_id: str | None, experiment: str, out: Path | None) -> int:
    from harness import report as sweep_report

    out = out or sweep_report.default_dir()
    text, plots, parent = sweep_report.build(uri, sweep_run_id, experiment, out)
    print(text)
    print(f"wrote {out / 'summary.md'} and {', '.join(p.name for p in plots)}; logged under report/ on run {parent}")
    return 0


def ui(uri: str, host: str, port: int) -> int:
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"warning: serving the MLflow UI on {host}: anyone who can reach it can read and change the runs")
    argv = ["mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    say(" ".join(argv))
    os.execvp(argv[0], argv)
    return 0  # not reached
