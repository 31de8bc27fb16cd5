"""The subcommands beside the Hydra entry point: report, rerun, sync, compare, export, ui. Thin: parse, then call down.
Every error is one line on stderr with a non-zero exit; its traceback goes to a log file the line names."""
from __future__ import annotations

import argparse
import os
import socket
import sys
import traceback
from datetime import datetime
from pathlib import Path

from harness.cache import cache_root
from harness.cli import COMMANDS
from harness.errors import ConfigError
from harness.progress import say
from harness.record import JobRecord
from harness.store import results, retry, runlog, tracking
from harness.store.redact import redact


class UsageError(ValueError):
    """A command line argparse refused."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _gpu_count(text: str) -> int:
    """--gpus: a whole number of 1 or more, else argparse's one line naming the value."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of GPUs: use a whole number of 1 or more")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--tracking-uri", default=argparse.SUPPRESS, help="default: $MLFLOW_TRACKING_URI, else ./mlruns")
    parser = Parser(prog="harness", parents=[store], description="harness subcommands; without one, "
                    "`harness [overrides]` runs a job or a sweep (-m)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("rerun", parents=[store], help="run a logged run (or a whole sweep, given its parent) again")
    p.add_argument("run_id")
    p.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="changes, e.g. decode_tokens=512")
    p = sub.add_parser("sync", parents=[store], help="log every result.json under a folder that the store lacks, once")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--experiment", default=None, help="default: the one each result names")
    p = sub.add_parser("report", parents=[store], help="a sweep's table, plots and summary, logged on its parent run "
                       "(or of every result under an outputs/ folder, several sweeps' included)")
    p.add_argument("sweep_run_id", nargs="?", default=None, help="a parent run id or a folder (default: the newest sweep)")
    p.add_argument("--experiment", default="harness")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the files (default: the sweep folder's report/, else outputs/reports/)")
    p.add_argument("--headline", action="store_true", help="print only the results table the README opens with "
                   "(each mode's median and speedup, the runs' shared conditions above it) and write nothing")
    p = sub.add_parser("compare", parents=[store], help="two sweeps (runs, outputs/ folders) matched by config: "
                       "ratios with intervals, verdicts; exit 1 when any run is slower")
    p.add_argument("baseline")
    p.add_argument("candidate")
    p.add_argument("--ignore", action="append", default=[], metavar="KEY", help="a config key to match across")
    p.add_argument("--threshold", default="3%", help="a change smaller than this is `same` (default: 3%%)")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write compare.md/.json/.png (default: a folder under outputs/compares/)")
    _add_ab(sub, store)
    p = sub.add_parser("export", parents=[store], help="a sweep (run, outputs/ folder) as CSV or JSON, one row per run")
    p.add_argument("run_id")
    p.add_argument("--format", default="csv", choices=("csv", "json"))
    p.add_argument("--out", type=Path, default=None, help="a file to write (default: stdout)")
    _add_plan(sub, store)
    p = sub.add_parser("ui", parents=[store], help="browse the store in MLflow's UI (on 127.0.0.1 unless told otherwise)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    return parser


def _add_plan(sub, store) -> None:
    p = sub.add_parser("plan", parents=[store], help="the jobs a command would run, with each one's time from the "
                       "store's past runs of the same config, and the total (runs nothing)")
    p.add_argument("-m", "--multirun", action="store_true", help="accepted as the sweep would take it (ignored)")
    p.add_argument("--experiment", default="harness")
    p.add_argument("--past", type=Path, action="append", default=[], metavar="DIR",
                   help="a folder of result files (a sweep's, or docs/results/...) whose finished runs estimate too")
    p.add_argument("--gpus", type=_gpu_count, metavar="N",
                   help="also the sweep's wall on N GPUs of one node, one job each at a time (hydra/launcher=gpus)")
    p.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="as the sweep's command line")


def _add_ab(sub, store) -> None:
    p = sub.add_parser("ab", parents=[store], help="two configs timed against each other in one process, in "
                       "alternating blocks (AB BA ...): B / A with a paired 95%% interval and a verdict; exit 1 when "
                       "B is slower")
    p.add_argument("arm_a", help='arm A\'s overrides in one argument, e.g. "+inductor.triton.enable_pdl=false"')
    p.add_argument("arm_b", help="arm B's overrides, the same way")
    p.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="overrides common to both arms")
    p.add_argument("--pairs", type=int, default=4, help="pairs of timed blocks, at least 2 (default: 4)")
    p.add_argument("--threshold", default="1%", help="a change inside ±this is `same` (default: 1%%)")
    p.add_argument("--processes", type=int, default=1, help="repeat the paired A/B in this many fresh processes, one "
                   "after another, and resample processes too (default: 1, this process)")
    p.add_argument("--fresh-compiles", action="store_true", help="each process compiles into empty cache folders of "
                   "its own (deleted after): Inductor autotunes again in each, so that the interval covers what its "
                   "picks change, as across machines that each compiled the config")
    p.add_argument("--experiment", default="harness")
    p.add_argument("--out", type=Path, default=None, help="where to write ab.md and ab.json (default: a folder under outputs/ab/)")


def main(argv: list[str]) -> int:
    command, uri = next((a for a in argv if a in COMMANDS), ""), None
    try:
        args = build_parser().parse_args(argv)
        # a command given a run id reads a store that must exist: asking a missing one would create it empty
        named = [getattr(args, k, None) for k in ("sweep_run_id", "baseline", "candidate", "run_id")]
        reads_store = args.command == "rerun" or args.command == "report" and not _is_dir(args.sweep_run_id) or \
            args.command in ("compare", "export") and any(n is not None and not _is_dir(n) for n in named)
        uri = _store_uri(getattr(args, "tracking_uri", None), must_exist=reads_store,
                         create=args.command not in ("compare", "export", "report", "plan"))
        return _run(args, uri)
    except Exception as err:  # noqa: BLE001 - one line for any error, the traceback in a file
        if uri is not None and retry.is_transient(err):
            err = tracking.StoreError(f"cannot reach the tracking store {uri} ({type(err).__name__}); is it up? "
                                      "Results kept on disk can be logged later with `harness sync`")
        return _fail(command, err)


def _run(args, uri: str) -> int:
    if args.command == "rerun":
        from harness.cli.rerun import rerun

        return rerun(uri, args.run_id, args.overrides)
    if args.command == "sync":
        return sync(uri, args.output_dir, args.experiment)
    if args.command == "report":
        return report(uri, args.sweep_run_id, args.experiment, args.out, args.headline)
    if args.command == "compare":
        from harness.analysis import compare

        threshold = compare.parse_threshold(args.threshold)
        return compare.run(uri, args.baseline, args.candidate, args.ignore, threshold, args.out)
    if args.command == "ab":
        return _ab(uri, args)
    if args.command == "export":
        return export(uri, args.run_id, args.format, args.out)
    if args.command == "plan":
        from harness.cli.plan import plan

        has_store = not uri.startswith("sqlite:///") or Path(uri[len("sqlite:///"):]).is_file()
        return plan(uri if has_store else None, args.experiment, args.overrides, args.past, args.gpus)
    return ui(uri, args.host, args.port)


def export(uri: str, given: str, fmt: str, out: Path | None) -> int:
    from harness.analysis import export as sweep_export

    text = sweep_export.run(uri, given, fmt)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}")
    return 0


def _fail(command: str, err: Exception) -> int:
    known = isinstance(err, (ConfigError, UsageError, tracking.StoreError))
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    line = f"harness {command}: " if command else "harness: "
    line += redact(message if known else f"{type(err).__name__}: {message}")
    if not known:  # a user's error (a bad value, a missing run or folder) needs no traceback
        log = _write_log(command, traceback.format_exc())
        line += f" (traceback: {log})" if log else ""
    print(line, file=sys.stderr)
    return 2


def _write_log(command: str, text: str) -> Path | None:
    try:
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"{datetime.now():%Y-%m-%d_%H-%M-%S}-{command or 'harness'}.log"
        path.write_text(redact(text))
        return path
    except OSError:
        return None


def _store_uri(given: str | None, must_exist: bool, create: bool = True) -> str:
    """The store to use; a command that only reads refuses to create an empty one."""
    uri = tracking.resolve_uri(given, create=create and not must_exist)
    if must_exist and uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise tracking.StoreError(f"no tracking store at {uri}: run a sweep here first, or pass --tracking-uri "
                                  "(or set MLFLOW_TRACKING_URI)")
    return uri


def sync(uri: str, output_dir: Path, experiment: str | None) -> int:
    """Import the result files the store is missing, each exactly once (matched by result id); first,
    mark the abandoned runs of every experiment the folder names (a sweep killed before any job ended too)."""
    if not output_dir.is_dir():
        raise ConfigError(f"{output_dir} is not a folder of harness outputs")
    bad: list[Exception] = []
    found = results.read_dir(output_dir, on_error=bad.append)
    for err in bad:
        say(f"error: {err}")
    for exp in {experiment} if experiment else _experiments(output_dir, [r for _, r in found]):
        tracking.mark_abandoned(uri, exp)
    imported = present = 0
    parents: dict[str, str] = {}
    for path, record in found:
        exp = experiment or record.experiment
        if record.status == "SKIPPED" or tracking.find_result(uri, exp, record.result_id):
            present += 1
            continue
        parent = record.parent_run_id
        if not (parent and tracking.run_exists(uri, parent)):
            if exp not in parents:
                parents[exp] = tracking.start_parent(uri, exp, f"sync {output_dir}", "sync",
                                                     {"sync_dir": str(output_dir.resolve())})
            parent = parents[exp]
        runlog.log_job(uri, exp, parent, record, path.parent)
        imported += 1
    for parent in parents.values():
        tracking.end_run(uri, parent, "FINISHED")
    print(f"sync {output_dir}: {imported} imported, {present} already in the store, {len(bad)} unreadable")
    return 1 if bad else 0


def _experiments(output_dir: Path, records: list[JobRecord]) -> set[str]:
    from harness.cli.sweep_file import SWEEP_FILE, read_sweep_file

    names = {r.experiment for r in records} | {"harness"}
    return names | {read_sweep_file(p.parent).get("experiment", "harness") for p in output_dir.glob(f"**/{SWEEP_FILE}")}


def report(uri: str, sweep_run_id: str | None, experiment: str, out: Path | None, headline: bool = False) -> int:
    from harness.analysis import report as sweep_report

    if headline:
        from harness.analysis.headline import headline_markdown

        records = (sweep_report.latest_of_each_config(Path(sweep_run_id))[1] if _is_dir(sweep_run_id) else
                   [record for record, _ in sweep_report.load_records(uri, sweep_run_id, experiment)[1]])
        print(headline_markdown(records))
        return 0
    if _is_dir(sweep_run_id):  # the output folder (a temporary one unless told) is made once the input is read
        made = sweep_report.from_folder(Path(sweep_run_id), out)
        print(made[0].read_text())
        print(f"wrote {', '.join(p.name for p in made)} in {made[0].parent} (from the result files; logged nowhere)")
        return 0
    text, made, parent = sweep_report.build(uri, sweep_run_id, experiment, out)
    print(text)
    print(f"wrote {', '.join(p.name for p in made)} in {made[0].parent}; logged on run {parent}")
    return 0


def _ab(uri: str, args) -> int:
    from harness.analysis import ab, compare  # torch and the measurement: only for this command
    from harness.cli import interrupt
    from harness.cli.precheck import compose_single_run
    from harness.measure.job import JobError

    if args.pairs < 2:
        raise ConfigError(f"--pairs={args.pairs}: use at least 2 (one AB and one BA, so that order favours neither)")
    if args.processes < 1:
        raise ConfigError(f"--processes={args.processes}: use at least 1")
    cfg_a, cfg_b = (compose_single_run([*args.overrides, *arm.split()]) for arm in (args.arm_a, args.arm_b))
    interrupt.install()  # a scheduler's SIGTERM stops the A/B as Ctrl-C does, its fresh interpreters with it
    try:
        return ab.run(uri, args.experiment, cfg_a, cfg_b, args.pairs, compare.parse_threshold(args.threshold), args.out,
                      args.processes, args.fresh_compiles)
    except JobError as err:  # an arm that cannot run here (graphed on a CPU): the user's to change, in one line
        raise ConfigError(str(err)) from err


def _is_dir(given: str | None) -> bool:
    return given is not None and Path(given).is_dir()


def ui(uri: str, host: str, port: int) -> int:
    """MLflow's UI from this interpreter's own mlflow (no PATH needed), on a port that must be free, in one worker
    process: one reader needs no more, and each of MLflow's default four imports the whole server, which on a small
    machine adds half again to the wait before the page opens."""
    with socket.socket() as probe:
        if probe.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0:
            raise ConfigError(f"port {port} on {host} is already in use: pass --port with a free one")
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"warning: serving the MLflow UI on {host}: anyone who can reach it can read and change the runs")
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
            "--workers", "1"]
    say(redact(f"mlflow ui --backend-store-uri {uri} --host {host} --port {port} --workers 1"))
    os.execv(argv[0], argv)
    return 0  # not reached
