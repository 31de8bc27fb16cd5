"""`python -m harness [overrides]` / `harness [overrides]`: one Hydra job per call, or a sweep with -m."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

import harness.config  # noqa: F401 - registers the schema in Hydra's ConfigStore
from harness import sweep


@hydra.main(version_base="1.3", config_path=sweep.CONF_DIR, config_name="config")
def _job(cfg: DictConfig) -> dict:
    return sweep.run_job(cfg)


def main() -> None:
    _job()
    sys.exit(sweep.exit_status())


if __name__ == "__main__":
    main()
