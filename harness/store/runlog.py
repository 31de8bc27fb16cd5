"""One job's record logged as an MLflow child run: params, tags, metrics, the step series, artifacts."""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from mlflow.entities import Metric, Param

from harness.store import retry
from harness.record import JobRecord, flatten
from harness.store.redact import redact
from harness.store.tracking import PARENT_TAG, owner, client, experiment_id, find_result

MAX_BATCH = 100  # MLflow's limit on params (and tags) per log_batch call


def log_job(uri: str, experiment: str, parent_run_id: str | None, record: JobRecord, job_dir: Path) -> str:
    """Log one job, retrying while the store is down. Idempotent: a partly logged attempt is removed
    before the next, so a result becomes exactly one run."""
    attempts = 0

    def attempt() -> str:
        nonlocal attempts
        attempts += 1
        if attempts > 1 and (partial := find_result(uri, experiment, record.result_id)) is not None:
            client(uri).delete_run(partial)  # only a failed attempt can have left one
        return _log_job(uri, experiment, parent_run_id, record, job_dir)

    return retry.with_retries(f"logging {record.label}", attempt)


def _log_job(uri: str, experiment: str, parent_run_id: str | None, record: JobRecord, job_dir: Path) -> str:
    """One child run per job: params, tags, metrics, the step series and the artifacts."""
    c = client(uri)
    tags = {"harness.kind": "job", **owner(), **_tags(record)}  # owned: a kill before its end is repaired
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    # the run spans the job (not its logging), so MLflow's Duration column reads the job's own time
    run_id = c.create_run(experiment_id(uri, experiment), run_name=record.label, tags=tags,
                          start_time=_epoch_ms(record.started)).info.run_id
    now = int(time.time() * 1000)
    params = [Param(k, redact(str(v))) for k, v in flatten(record.config).items()]
    metrics = [Metric(k, as_known(k, float(v)), now, 0) for k, v in record.metrics.items() if v is not None]
    metrics += [Metric("step_ms", float(v), now, i) for i, v in enumerate(record.step_ms)]
    for i in range(0, len(params), MAX_BATCH):
        c.log_batch(run_id, params=params[i:i + MAX_BATCH])
    for i in range(0, len(metrics), 10 * MAX_BATCH):
        c.log_batch(run_id, metrics=metrics[i:i + 10 * MAX_BATCH])
    for name in ("result.json", "steps.csv", "config.yaml", ".hydra/overrides.yaml", "top_kernels.csv",
                 "trace.json.gz"):
        if (job_dir / name).is_file():
            c.log_artifact(run_id, str(job_dir / name))
    c.set_terminated(run_id, status=record.status, end_time=_epoch_ms(record.ended))
    return run_id


SIGNIFICANT = 4  # a median of two-level bootstrapped blocks is known to a few parts in ten thousand at best


def as_known(key: str, value: float) -> float:
    """A time (ms) or a percentage metric at the precision it is known to, SIGNIFICANT figures, so that MLflow's
    table does not print eight decimals of noise; counts, ratios and flags as they are."""
    if not (key.endswith(("_ms", "_pct")) or "_ms_" in key or key.startswith("ms_")) or value == 0:
        return value
    return float(f"{value:.{SIGNIFICANT}g}")


def _epoch_ms(iso_time: str | None) -> int | None:
    """An ISO 8601 time of the record (`YYYY-MM-DDThh:mm:ss.sss+00:00`) as MLflow's epoch ms; None: now."""
    return int(datetime.fromisoformat(iso_time).timestamp() * 1000) if iso_time else None


def _tags(record: JobRecord) -> dict[str, str]:
    tags = {f"env.{k}": v for k, v in record.environment.items()}
    tags.update({
        "overrides": " ".join(record.overrides),
        "job_dir": record.job_dir,
        "harness.result_id": record.result_id,
        "harness.config_hash": record.config_hash,
    })
    if record.weights:  # unknown where the job failed before building its model
        tags.update(weights=record.weights, weights_source=record.weights_source)
    tags.update(record.tags)
    tags.update(record.mode_tags)
    if record.reason:
        tags["failure_reason"] = record.reason[:5000]
    return {k: redact(str(v)) for k, v in tags.items()}
