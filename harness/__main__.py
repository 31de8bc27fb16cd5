"""`python -m harness [overrides]` / `harness [overrides]`: one Hydra job per call, or a sweep with -m.
`harness rerun|sync|ui ...`: the subcommands in cli.py."""
from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import DictConfig

import harness.config  # noqa: F401 - registers the schema in Hydra's ConfigStore
from harness import app


@hydra.main(version_base="1.3", config_path=app.CONF_DIR, config_name="config")
def _job(cfg: DictConfig) -> None:
    app.run_job(cfg)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in _commands():
        from harness import cli

        sys.exit(cli.main(sys.argv[1:]))
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM ends runs KILLED, as Ctrl-C does
    try:
        _job()
    except KeyboardInterrupt:
        print("[harness] interrupted: the current run and its sweep are recorded KILLED", file=sys.stderr)
        sys.exit(130)
    sys.exit(app.exit_status())


def _commands() -> tuple[str, ...]:
    from harness.cli import COMMANDS

    return COMMANDS


if __name__ == "__main__":
    main()
