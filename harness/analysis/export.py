"""`harness export RUN_ID|DIR --format csv|json`: a sweep (or run, or outputs/ folder) as one row per run,
with its config, statistics and environment, for spreadsheets, notebooks and other tools."""
from __future__ import annotations

import csv
import io
import json

from harness.analysis.compare import load_side
from harness.analysis.rows import row_of
from harness.errors import ConfigError
from harness.record import JobRecord, flatten

FORMATS = ("csv", "json")


def row(record: JobRecord) -> dict:
    """The run's typed row (harness/analysis/rows.py), then every config key, metric and environment key."""
    typed = row_of(record)
    return {"run": typed["name"], "status": typed["status"], "reason": typed["reason"],
            "mlflow_run_id": typed["mlflow_run_id"] or "", "result_id": typed["id"], "variant": typed["variant"],
            "config_hash": record.config_hash, **{f"config.{k}": v for k, v in flatten(record.config).items()},
            **{f"metric.{k}": v for k, v in sorted(record.metrics.items())},
            **{f"env.{k}": v for k, v in sorted(record.environment.items())}}


def render(records: list[JobRecord], fmt: str) -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt} is invalid: use one of {', '.join(FORMATS)}")
    rows = [row(r) for r in records]
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str) + "\n"
    columns = list(dict.fromkeys(k for r in rows for k in r))  # every key, in first-seen order
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def run(uri: str, given: str, fmt: str) -> str:
    return render(load_side(uri, given).records, fmt)
