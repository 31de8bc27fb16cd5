"""`python -m harness [overrides]` / `harness [overrides]`: one Hydra job per call, or a sweep with -m.
`harness report|rerun|sync|compare|export|ui ...`: the subcommands in cli.py."""
from __future__ import annotations

import signal
import sys
from importlib.metadata import PackageNotFoundError, version

import hydra
from omegaconf import DictConfig

from harness.config import CONF_DIR, ConfigError  # light: no torch before the checks
from harness.validate import check_overrides

USAGE = """usage: harness [KEY=VALUE ...]                 one run (python -m harness works the same)
       harness -m KEY=A,B ... [+experiment=NAME]  a sweep: every combination, one MLflow child run each
       harness report [SWEEP_RUN_ID] | rerun RUN_ID [KEY=VALUE ...] | sync OUTPUT_DIR | ui
       harness compare BASELINE CANDIDATE [--ignore KEY] [--threshold 3%]   exit 1 when a run got slower
       harness export RUN_ID|DIR [--format csv|json]   one row per run: config, statistics, environment
       harness --tracking-uri URI COMMAND ...     any subcommand against another store
       harness --version | --help | --hydra-help  (Hydra's own flags, --cfg job among them, work as in any Hydra app)

The keys, their defaults and meanings are in the README's table (the schema is harness/config.py);
`harness COMMAND --help` describes a subcommand."""


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _job(cfg: DictConfig) -> None:
    from harness import app

    app.run_job(cfg)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _version() -> str:
    try:
        return version("harness")
    except PackageNotFoundError:  # run from a checkout that was not pip-installed
        return "unknown (not installed)"


COMMANDS = ("report", "rerun", "sync", "compare", "export", "ui")  # cli.py's subcommands


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] in (["--help"], ["-h"]):
        sys.exit(print(USAGE))
    if argv[:1] == ["--version"]:
        sys.exit(print(f"harness {_version()}"))
    if argv and (argv[0] in COMMANDS or argv[0].startswith("--tracking-uri")):
        from harness import cli

        sys.exit(cli.main(argv))
    try:
        check_overrides(argv)
    except ConfigError as err:
        sys.exit(print(f"harness: {err}", file=sys.stderr) or 2)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM ends runs KILLED, as Ctrl-C does
    try:
        _job()
    except KeyboardInterrupt:
        print("[harness] interrupted", file=sys.stderr)
        sys.exit(130)
    from harness import app

    sys.exit(app.exit_status())


if __name__ == "__main__":
    main()
