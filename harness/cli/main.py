"""`python -m harness [overrides]` / `harness [overrides]`: one Hydra job per call, or a sweep with -m.
`harness report|rerun|sync|compare|export|ui ...`: the subcommands in commands.py.

The exit status is returned, never kept in a global: a single run's comes from the record its task returned,
a sweep's from its sweep.json (written by the sweep callback, whichever launcher ran the jobs), and a command
that ran no job (`--cfg job`, `--info`, `--help`) exits 0 unless Hydra itself refused it."""
from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from harness.cli import COMMANDS, interrupt
from harness.cli.sweep_file import take_status
from harness.config.schema import CONF_DIR  # light: no torch before the checks
from harness.errors import ConfigError
from harness.config.validate import check_overrides
from harness.kernels.triton_runtime import interpret_without_gpu, persistent_compile_caches

USAGE = """usage: harness [KEY=VALUE ...]                 one run (python -m harness works the same)
       harness -m KEY=A,B ... [+experiment=NAME]  a sweep: every combination, one MLflow child run each
       harness report [SWEEP_RUN_ID|DIR] | rerun RUN_ID [KEY=VALUE ...] | sync OUTPUT_DIR | ui
       harness compare BASELINE CANDIDATE [--ignore KEY] [--threshold 3%]   exit 1 when a run got slower
       harness ab "KEY=A ..." "KEY=B ..." [KEY=VALUE ...] [--pairs 4]   B against A in one process: ratio, verdict
       harness export RUN_ID|DIR [--format csv|json]   one row per run: config, statistics, environment
       harness plan [-m] KEY=A,B ... [+experiment=NAME]   the jobs a sweep would run, each one's past time, the total
       harness --tracking-uri URI COMMAND ...     any subcommand against another store
       harness --version | --help | --hydra-help  (Hydra's own flags, --cfg job|hydra|all and --info among them, exit 0)

The keys, their defaults and meanings are in the README's table (the schema is harness/config/schema.py);
`harness COMMAND --help` describes a subcommand."""


def usage() -> str:
    """USAGE, then what the axes take, read from conf/ and the registries (so a new preset lists itself)."""
    from harness.config.fused import switches_help
    from harness.kernels import ATTENTION
    from harness.modes import MODES

    presets = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
    models = sorted(p.stem for p in (Path(CONF_DIR) / "model").glob("*.yaml"))
    return "\n".join([USAGE, "",
                      f"models (model=NAME): {', '.join(models)}; `tiny` is 2 layers, for a CPU smoke test:",
                      "  python -m harness -m model=tiny device=cpu bs=1,2 decode_tokens=16 warmup=2 repeats=1",
                      f"named sweeps (+experiment=NAME): {', '.join(presets)} (conf/experiment/NAME.yaml says what each answers)",
                      f"modes (mode=NAME): {', '.join(MODES)}",
                      f"attention backends (attn=NAME): {', '.join(ATTENTION)}",
                      "mode=fused's switches (fused.NAME=true|false; [needs] the hardware a technique needs):",
                      *switches_help()])


def _version() -> str:
    try:
        return version("harness")
    except PackageNotFoundError:  # run from a checkout that was not pip-installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """The command line, to its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    interpret_without_gpu()  # before anything imports triton: Triton kernels on a CPU run in its interpreter
    persistent_compile_caches()  # compiles of one sweep serve the next (jobs in other processes inherit it)
    if argv[:1] in (["--help"], ["-h"]):
        print(usage())
        return 0
    if argv[:1] == ["--version"]:
        print(f"harness {_version()}")
        return 0
    if argv and (argv[0] in COMMANDS or argv[0].startswith("--tracking-uri")):
        from harness.cli import commands

        try:
            return commands.main(argv)
        except KeyboardInterrupt:  # a rerun's job recorded itself KILLED, and its parent
            print("[harness] interrupted", file=sys.stderr)
            return 130
    try:
        check_overrides(argv)
        # (a saved config, --config-path/--config-name, is validated as the job starts: its keys are not conf/'s)
        if not any(a.split("=", 1)[0] in SHOW_FLAGS + CONFIG_FLAGS for a in argv):
            from harness.cli.precheck import precheck

            precheck(argv, multirun=any(a in MULTIRUN_FLAGS or a.startswith("+experiment=") for a in argv))
    except ConfigError as err:
        print(f"harness: {err}", file=sys.stderr)
        return 2
    return run_hydra(argv)


SHOW_FLAGS = ("--cfg", "-c", "--info", "-i", "--hydra-help", "--help", "-h")
MULTIRUN_FLAGS = ("-m", "--multirun")
CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")


def without_multirun_when_showing(argv: list[str]) -> list[str]:
    """Hydra refuses `-m` beside `--cfg`/`--info` (one command at a time). What a user asks there is to see a
    job's config: the first job of the sweep, as Hydra's own sweeper would order them, is shown."""
    if not (any(a.split("=", 1)[0] in SHOW_FLAGS for a in argv) and any(a in MULTIRUN_FLAGS for a in argv)):
        return argv
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0]
    if len(jobs) > 1:
        print(f"harness: the sweep holds {len(jobs)} jobs; the config of the first: {' '.join(jobs[0])}",
              file=sys.stderr)
    return [a for a in argv if a not in MULTIRUN_FLAGS and a not in overrides] + list(jobs[0])


def run_hydra(argv: list[str]) -> int:
    """Hand the command line to Hydra: a run, a sweep, or one of Hydra's own flags."""
    import hydra

    finished = []  # the records of the jobs this process ran (a single run's one)

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
    def task(cfg):
        from harness.cli import app  # MLflow, torch: only once a job runs

        finished.append(app.run_job(cfg))
        return finished[-1]  # a launcher that ran the job elsewhere gets its record back

    interrupt.install()  # SIGTERM ends runs KILLED, as Ctrl-C does, even where a library swallowed the interrupt
    take_status()  # a status left by an earlier process of this id (killed hard) is not this run's
    sys.argv = [sys.argv[0], *without_multirun_when_showing(argv)]  # Hydra reads its command line from sys.argv
    try:
        task()
    except KeyboardInterrupt:
        take_status()  # the interrupted sweep's status file: 130 says how it ended
        print(f"[harness] interrupted; to run what is left, skipping the jobs that finished: {resume_command(argv)}",
              file=sys.stderr)
        return 130
    except BaseException:
        take_status()  # Hydra's own exit (SystemExit) or a crash: the status file is no one's now
        raise
    if any(a.split("=", 1)[0] in SHOW_FLAGS for a in argv):
        return 0  # Hydra showed what was asked (it exits non-zero itself where it could not)
    return exit_status(finished)


def resume_command(argv: list[str]) -> str:
    """The command line again with resume=true: the jobs whose config already FINISHED in the store are skipped."""
    import shlex

    kept = [a for a in argv if not a.lstrip("+").startswith("resume=")]
    return " ".join(["python -m harness", *map(shlex.quote, kept), "resume=true"])


def exit_status(finished: list) -> int:
    """A sweep's exit status, which its callback left for this process (1 from its start until its end: a sweep
    that does not end has failed); else the single run's, from its record: 1 where a job needs attention."""
    swept = take_status()
    if swept is not None:
        return swept
    from harness.record import exit_code

    return exit_code(finished)
