"""MLflow: the only module that talks to the store. Uses MlflowClient only (no fluent API), so
no atexit hook can end a run as FINISHED behind our back: every status is set here, explicitly.
"""
from __future__ import annotations

import functools
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import yaml
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

# MLflow's HTTP client retries 7 times with exponential backoff by default: minutes per call when a
# server is down. with_retries below does the retrying, with a budget of about 30 s, unless the user
# sets these variables otherwise.
for _var, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                     ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30"), ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")):
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
    tags = {"harness.kind": "sweep", **_owner(), **tags}
    return with_retries(f"opening {run_name}", lambda: client(uri).create_run(
        experiment_id(uri, experiment), run_name=run_name, tags=tags).info.run_id)


def _owner() -> dict[str, str]:
    """Which process holds a RUNNING run, so that a later process can tell it was abandoned."""
    return {"harness.host": socket.gethostname(), "harness.pid": str(os.getpid())}


def _search(uri: str, experiment: str, filter_string: str, max_results: int = 1, **kwargs) -> list:
    """Runs of an experiment by an MLflow filter; none where the experiment does not exist yet."""
    found = client(uri).get_experiment_by_name(experiment)
    if found is None:
        return []
    return client(uri).search_runs([found.experiment_id], filter_string, max_results=max_results, **kwargs)


def mark_abandoned(uri: str, experiment: str) -> list[str]:
    """RUNNING runs whose process on this host is gone (killed hard) end FAILED, reason `abandoned`.
    Runs held by other hosts are left alone: from here there is no telling whether they still run."""
    c = client(uri)
    marked = []
    for run in _search(uri, experiment, "attributes.status = 'RUNNING'", max_results=1000):
        tags = run.data.tags
        if tags.get("harness.host") != socket.gethostname() or _alive(int(tags.get("harness.pid", "0"))):
            continue
        c.set_tag(run.info.run_id, "failure_reason", "abandoned")
        c.set_terminated(run.info.run_id, status="FAILED")
        marked.append(run.info.run_id)
    return marked


def mark_abandoned_quietly(uri: str, experiment: str) -> None:
    try:
        mark_abandoned(uri, experiment)
    except Exception:  # noqa: BLE001 - an unreachable store is reported where it is first written to
        pass


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_finished(uri: str, experiment: str, config_hash: str) -> str | None:
    """The id of a FINISHED run of this exact config, if the store has one."""
    runs = _search(uri, experiment, f"tags.`harness.config_hash` = '{config_hash}' and attributes.status = 'FINISHED'")
    return runs[0].info.run_id if runs else None


def find_result(uri: str, experiment: str, result_id: str) -> str | None:
    """The run already logged from this result file, if any: what makes `harness sync` idempotent."""
    runs = _search(uri, experiment, f"tags.`harness.result_id` = '{result_id}'")
    return runs[0].info.run_id if runs else None


class StoreError(RuntimeError):
    """The store lacks what was asked for."""


def get_run(uri: str, run_id: str):
    try:
        return client(uri).get_run(run_id)
    except Exception as err:  # noqa: BLE001 - MLflow raises its own types per store
        raise StoreError(f"no run {run_id!r} in {redact(uri)} ({type(err).__name__})") from err


def run_exists(uri: str, run_id: str) -> bool:
    try:
        get_run(uri, run_id)
    except StoreError:
        return False
    return True


def experiment_name(uri: str, run) -> str:
    return client(uri).get_experiment(run.info.experiment_id).name


def newest_sweep(uri: str, experiment: str):
    runs = _search(uri, experiment, "tags.`harness.kind` = 'sweep'", order_by=["attributes.start_time DESC"])
    if not runs:
        raise StoreError(f"no sweep in experiment {experiment!r} of {redact(uri)}")
    return runs[0]


def children(uri: str, parent) -> list:
    runs = client(uri).search_runs([parent.info.experiment_id],
                                   f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'", max_results=10000)
    return sorted(runs, key=lambda r: r.info.start_time)


def load_config(uri: str, run_id: str) -> dict:
    """The run's logged config.yaml, parsed as plain data (yaml.safe_load: no tags, no objects)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client(uri).download_artifacts(run_id, "config.yaml", tmp)
        except Exception as err:  # noqa: BLE001
            raise StoreError(f"run {run_id} has no config.yaml artifact to rerun from ({type(err).__name__})") from err
        data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not data:
        raise StoreError(f"run {run_id}'s config.yaml holds no config")
    return data


def redact(uri: str) -> str:
    """A URI without its user:password@ part, fit to print or log."""
    parts = urlparse(uri)
    if parts.password is None and parts.username is None:
        return uri
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()


def end_run(uri: str, run_id: str, status: str) -> None:
    client(uri).set_terminated(run_id, status=status)


RETRY_DELAYS_S = (1, 2, 4, 8, 16)  # backoff between attempts when the store fails: about 30 s in all
STILL_DOWN_S = 300  # after a call gave up, later calls in this process try once until one succeeds
_gave_up_at: float | None = None


def with_retries(what: str, fn, delays=RETRY_DELAYS_S):
    """Call fn, retrying transient store errors with exponential backoff; the last error is raised.
    Once a call has given up, the store is taken for down: the next calls try once (a job then costs
    one failed call, not another 30 s), until one succeeds or STILL_DOWN_S have passed."""
    global _gave_up_at
    if _gave_up_at is not None and time.monotonic() - _gave_up_at < STILL_DOWN_S:
        delays = ()
    for delay in (*delays, None):
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - MLflow raises many types for a store that is down
            if delay is None:
                _gave_up_at = time.monotonic()
                raise
            print(f"[harness] {what}: {type(err).__name__}, retrying in {delay} s", file=sys.stderr, flush=True)
            time.sleep(delay)
        else:
            _gave_up_at = None
            return result


def log_job(uri: str, experiment: str, parent_run_id: str | None, result: dict, job_dir: Path) -> str:
    """Log one job, retrying while the store is down. Idempotent: a partly logged attempt is removed
    before the next, so a result becomes exactly one run."""
    attempts = 0

    def attempt() -> str:
        nonlocal attempts
        attempts += 1
        if attempts > 1 and (partial := find_result(uri, experiment, result["result_id"])) is not None:
            client(uri).delete_run(partial)  # only a failed attempt can have left one
        return _log_job(uri, experiment, parent_run_id, result, job_dir)

    return with_retries(f"logging {result['label']}", attempt)


def _log_job(uri: str, experiment: str, parent_run_id: str | None, result: dict, job_dir: Path) -> str:
    """One child run per job: params, tags, metrics, the step series and the artifacts."""
    c = client(uri)
    tags = {"harness.kind": "job", **_tags(result)}
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    run_id = c.create_run(experiment_id(uri, experiment), run_name=result["label"], tags=tags).info.run_id
    now = int(time.time() * 1000)
    params = [Param(k, redact(str(v)) if k == "tracking.uri" else str(v))
              for k, v in flatten(result.get("config", {})).items()]
    metrics = [Metric(k, float(v), now, 0) for k, v in result.get("metrics", {}).items() if v is not None]
    metrics += [Metric("step_ms", float(v), now, i) for i, v in enumerate(result.get("step_ms", []))]
    for i in range(0, len(params), MAX_BATCH):
        c.log_batch(run_id, params=params[i:i + MAX_BATCH])
    for i in range(0, len(metrics), 10 * MAX_BATCH):
        c.log_batch(run_id, metrics=metrics[i:i + 10 * MAX_BATCH])
    for name in ("result.json", "steps.csv", "config.yaml", ".hydra/overrides.yaml", "top_kernels.csv",
                 "trace.json.gz"):
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
        "harness.config_hash": result.get("config_hash", ""),
    })
    tags.update(result.get("tags", {}))
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
