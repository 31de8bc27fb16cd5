"""Hydra's BasicSweeper, made to keep going and to build each model once.

BasicSweeper composes every job before launching any, and one bad value (`mode=eager,bogus`)
aborts the whole sweep. This sweeper records such a job as FAILED with Hydra's own error and
launches the rest. It also orders jobs by model, then by the context they fill (in_run_order), so a process builds
each model once and a job can decode from the context the one before it filled.
"""
# No `from __future__ import annotations` here: Hydra imports plugin modules by path, outside
# sys.modules, and dataclasses then cannot resolve string annotations.
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore


@dataclass
class HarnessSweeperConf:
    _target_: str = "hydra_plugins.harness_sweeper.harness_sweeper.HarnessSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None
    # combinations left out of the grid: a job whose config matches every key of one rule (harness/config/exclude.py)
    exclude: Optional[List[Dict[str, Any]]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="harness", node=HarnessSweeperConf, provider="harness")


class HarnessSweeper(BasicSweeper):
    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[Dict[str, str]] = None,
                 exclude: Optional[List[Dict[str, Any]]] = None):
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.rejected = 0
        self.exclude = exclude or []

    def get_job_batch(self) -> List[List[str]]:
        from harness.cli.plugin_api import in_run_order, note_sweep_size, one_line, record_rejected, say
        from harness.config.exclude import excluding_rule

        batch = in_run_order(super().get_job_batch())  # by model, Hydra's order within one
        note_sweep_size(self._sweep_dir(), len(batch), 0, batch)  # the varying keys, before any job is recorded
        legal, excluded = [], []
        for overrides in batch:
            try:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            except Exception as err:  # noqa: BLE001 - Hydra's message is the reason we record
                self.rejected += 1
                record_rejected(self.config, list(overrides), one_line(err), self.rejected)
                continue
            if excluding_rule(cfg, self.exclude) is not None:
                excluded.append(overrides)
                continue
            legal.append(overrides)
        total = sum(len(b) for b in self.overrides)
        # the keys that name runs vary over every recorded job, the rejected included; an excluded job is not recorded
        note_sweep_size(self._sweep_dir(), len(legal), self.rejected, [b for b in batch if b not in excluded])
        left_out = f", {len(excluded)} excluded by hydra.sweeper.exclude" if excluded else ""
        say(f"sweep: {total} jobs, {len(legal)} to run, {self.rejected} rejected{left_out} → {self._sweep_dir()}")
        return legal

    def validate_batch_is_legal(self, batch) -> None:
        """get_job_batch has composed every job of the batch already: don't compose them twice."""

    def _sweep_dir(self) -> Path:
        return Path(self.config.hydra.sweep.dir)
