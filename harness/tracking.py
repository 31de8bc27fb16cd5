"""MLflow: the only module that talks to the store. Uses MlflowClient only (no fluent API), so
no atexit hook can end a run as FINISHED behind our back: every status is set here, explicitly.
"""
from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

# MLflow's HTTP client retries 7 times with exponential backoff by default: minutes per call when a
# server is down. A job keeps its result.json anyway, so fail within seconds unless the user says otherwise.
for _var, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                     ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")):
    os.environ.setdefault(_var, _value)

STORE_DIR = "mlruns"
PARENT_TAG = "mlflow.parentRunId"
MAX_BATCH = 100  # MLflow's limit on params (and tags) per log_batch call


def resolve_uri(configured: str | None) -> str:
    """tracking.uri, else $MLFLOW_TRACKING_URI, else the embedded SQLite store under ./mlruns."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = Path.cwd() / STORE_DIR
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def _artifact_root(uri: str) -> str | None:
    """Artifacts of the embedded store go beside its database, as an absolute URI."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "artifacts").resolve().as_uri()


@functools.lru_cache(maxsize=4)
def client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def experiment_id(uri: str, name: str) -> str:
    c = client(uri)
    found = c.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return c.create_experiment(name, artifact_location=_artifact_root(uri))


def start_parent(uri: str, experiment: str, run_name: str, tags: dict[str, str]) -> str:
    run = client(uri).create_run(experiment_id(uri, experiment), run_name=run_name,
                                 tags={"harness.kind": "sweep", **tags})
    return run.info.run_id


def end_run(uri: str, run_id: str, status: str) -> None:
    client(uri).set_terminated(run_id, status=status)


def log_job(uri: str, experiment: str, parent_run_id: str | None, result: dict, job_dir: Path) -> str:
    """One child run per job: params, tags, metrics, the step series and the artifacts."""
    c = client(uri)
    tags = {"harness.kind": "job", **_tags(result)}
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    run_id = c.create_run(experiment_id(uri, experiment), run_name=result["label"], tags=tags).info.run_id
    now = int(time.time() * 1000)
    params = [Param(k, str(v)) for k, v in flatten(result.get("config", {})).items()]
    metrics = [Metric(k, float(v), now, 0) for k, v in result.get("metrics", {}).items() if v is not None]
    metrics += [Metric("step_ms", float(v), now, i) for i, v in enumerate(result.get("step_ms", []))]
    for i in range(0, len(params), MAX_BATCH):
        c.log_batch(run_id, params=params[i:i + MAX_BATCH])
    for i in range(0, len(metrics), 10 * MAX_BATCH):
        c.log_batch(run_id, metrics=metrics[i:i + 10 * MAX_BATCH])
    for name in ("result.json", "steps.csv", ".hydra/config.yaml", ".hydra/overrides.yaml"):
        if (job_dir / name).is_file():
            c.log_artifact(run_id, str(job_dir / name))
    c.set_terminated(run_id, status=result["status"])
    return run_id


def _tags(result: dict) -> dict[str, str]:
    tags = {f"env.{k}": v for k, v in result.get("environment", {}).items()}
    tags.update({
        "weights": result.get("weights", "unknown"),
        "weights_source": result.get("weights_source", ""),
        "overrides": " ".join(result.get("overrides", [])),
        "job_dir": result.get("job_dir", ""),
        "harness.result_id": result["result_id"],
    })
    tags.update(result.get("mode_tags", {}))
    if result.get("reason"):
        tags["failure_reason"] = result["reason"][:5000]
    return {k: str(v) for k, v in tags.items()}


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def ui_command(uri: str) -> str:
    """What a person types to browse these runs."""
    if urlparse(uri).scheme in ("http", "https"):
        return f"open {uri} in a browser"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"
