"""MLflow: the only module that talks to the store. Uses MlflowClient only (no fluent API), so
no atexit hook can end a run as FINISHED behind our back: every status is set here, explicitly.
"""
from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlparse

import mlflow
import yaml
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from harness.cache import cache_root
from harness.store import retry
from harness.store.redact import redact, redact_tree

STORE_DIR = "mlruns"
PARENT_TAG = "mlflow.parentRunId"


def resolve_uri(configured: str | None, create: bool = True) -> str:
    """tracking.uri, else $MLFLOW_TRACKING_URI, else the embedded SQLite store under ./mlruns (its folder
    created unless `create` is off, for commands that only read)."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = Path.cwd() / STORE_DIR
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def _artifact_root(uri: str) -> str | None:
    """Artifacts of the embedded store go beside its database, as an absolute URI."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "artifacts").resolve().as_uri()


@functools.lru_cache(maxsize=4)
def client(uri: str) -> MlflowClient:
    for var, value in retry.http_settings().items():  # read by MLflow at each request; a user's own value wins
        os.environ.setdefault(var, value)
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    database = Path(uri[len("sqlite:///"):])
    with _file_lock(database.with_suffix(".init-lock")):  # sweeps started together
        if not database.exists():
            start_as_the_empty_store(database)
        c = MlflowClient(tracking_uri=uri)  # must not create (or migrate) the tables at the same time
        c.search_experiments(max_results=1)
    return c


def start_as_the_empty_store(database: Path) -> None:
    """A new embedded store starts as a copy of an empty one kept under the harness's cache folder, one for each
    MLflow version: MLflow builds a new SQLite store by running every schema migration since its first, about a
    second of CPU in every new sweep folder. The copy holds the tables at their schema's head and no experiment, so that
    MLflow's first open adds the Default experiment with this store's own artifact root. Where the empty store
    cannot be built (an MLflow whose internals moved), MLflow builds the new one itself, as it would anyway."""
    empty = cache_root() / "store" / f"empty-mlflow-{mlflow.__version__}.db"
    try:
        if not empty.exists():
            _build_empty_store(empty)
        database.parent.mkdir(parents=True, exist_ok=True)
        partial = database.with_suffix(".copying")
        shutil.copyfile(empty, partial)
        os.replace(partial, database)
    except Exception:  # noqa: BLE001 - the copy only saves time: MLflow's own path builds the store
        return


def _build_empty_store(empty: Path) -> None:
    """MLflow's own table set-up (every migration) on a new SQLite file, written beside and renamed into place."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    empty.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(empty.with_suffix(".lock")):
        if empty.exists():
            return
        partial = empty.with_suffix(f".{os.getpid()}.partial")
        partial.unlink(missing_ok=True)
        engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(partial, empty)


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# MLflow 3 opens an experiment without the kind tag on its GenAI overview (traces, evaluations); with it, on the
# runs table of its model-training view. The shared view (MLflow's own "share view" state, opened by the
# address runs_table_url gives) lists the job runs fastest first with the columns a reader compares.
VIEW_KEY = "harness"
RUNS_VIEW = {"selectedColumns": ["params.`mode`", "params.`bs`", "params.`dtype`", "metrics.`step_ms_median`",
                                 "metrics.`step_ms_ci_pct`", "params.`model.name`", "params.`context_len`",
                                 "params.`attn`", "metrics.`speedup_vs_eager`", "metrics.`tokens_per_s`"],
             "orderByKey": "metrics.`step_ms_median`", "orderByAsc": True}
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development",
                   f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(RUNS_VIEW)}


def experiment_id(uri: str, name: str) -> str:
    c = client(uri)
    found = c.get_experiment_by_name(name)
    if found is not None:
        for key, value in EXPERIMENT_TAGS.items():  # made by an older harness, or by hand: a user's choice stays
            if not found.tags.get(key):
                c.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id
    try:
        return c.create_experiment(name, artifact_location=_artifact_root(uri), tags=EXPERIMENT_TAGS)
    except Exception:  # noqa: BLE001 - a process beside this one created it first
        if (found := c.get_experiment_by_name(name)) is None:
            raise
        return found.experiment_id


PARENT_KINDS = ("sweep", "run", "rerun", "sync")  # what a parent run groups; its children are "job"s
MEASURED_KINDS = ("sweep", "run", "rerun")  # parents whose jobs were measured together (a sync imports)


def start_parent(uri: str, experiment: str, run_name: str, kind: str, tags: dict[str, str]) -> str:
    assert kind in PARENT_KINDS, kind
    tags = redact_tree({"harness.kind": kind, **owner(), **tags})
    return retry.with_retries(f"opening {run_name}", lambda: client(uri).create_run(
        experiment_id(uri, experiment), run_name=redact(run_name), tags=tags).info.run_id)


def log_ab(uri: str, experiment: str, run_name: str, result: dict, files: list[Path]) -> str:
    """A paired A/B as a finished run of its own (kind `ab`): the ratio, its interval and both medians as metrics,
    the verdict, the arms and what they differ in as tags, its files as artifacts."""
    c = client(uri)
    tags = redact_tree({"harness.kind": "ab", "verdict": result["verdict"], "arm_a": result["arm_a"],
                        "arm_b": result["arm_b"], "differs": json.dumps(result["differs"], default=str)[:5000],
                        **{f"env.{k}": str(v) for k, v in result["environment"].items()}})
    run_id = retry.with_retries(f"opening {run_name}", lambda: c.create_run(
        experiment_id(uri, experiment), run_name=redact(run_name)[:240], tags=tags).info.run_id)
    for key in ("ratio", "low", "high", "median_a_ms", "median_b_ms", "threshold", "pairs", "block_spread_a_pct",
                "block_spread_b_pct", "pairs_to_decide", "processes_to_decide", "processes"):
        if result.get(key) is not None:  # pairs_to_decide, processes_to_decide: only where the verdict is ambiguous
            c.log_metric(run_id, key, float(result[key]))
    for arm, position in zip("ab", result.get("first_timed_position") or ()):  # where each arm's blocks timed from
        if position is not None:
            c.log_metric(run_id, f"first_timed_position_{arm}", float(position))
    for path in files:
        c.log_artifact(run_id, str(path))
    c.set_terminated(run_id, status="FINISHED")
    return run_id


def owner() -> dict[str, str]:
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
    except Exception:  # noqa: BLE001 - reported where the store is first written to, which then tries once
        retry.mark_down()


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


def finished_runs(uri: str, experiment: str, config_hash: str, most: int = 20) -> list:
    """The latest FINISHED runs of this exact config (what `harness plan` estimates a job's time from)."""
    return _search(uri, experiment, f"tags.`harness.config_hash` = '{config_hash}' and attributes.status = 'FINISHED'",
                   max_results=most, order_by=["attributes.start_time DESC"])


def find_result(uri: str, experiment: str, result_id: str) -> str | None:
    """The run already logged from this result file, if any: what makes `harness sync` idempotent."""
    runs = _search(uri, experiment, f"tags.`harness.result_id` = '{result_id}'")
    return runs[0].info.run_id if runs else None


class StoreError(RuntimeError):
    """The store lacks what was asked for."""


ID_PREFIX = 8  # the shortest run id prefix taken for a whole id (as git takes a commit's), where it names one run


def get_run(uri: str, run_id: str):
    """A run by its id, or by the first ID_PREFIX or more characters of it where they name one run of the store."""
    try:
        if ID_PREFIX <= len(run_id) < 32 and all(ch in "0123456789abcdef" for ch in run_id):
            run_id = _whole_id(uri, run_id)
        return client(uri).get_run(run_id)
    except StoreError:
        raise
    except Exception as err:  # noqa: BLE001 - MLflow raises its own types per store
        if retry.is_transient(err):
            raise  # the store is unreachable, which says nothing of the run
        raise StoreError(f"no run {run_id!r} in {redact(uri)} ({type(err).__name__})") from err


def _whole_id(uri: str, prefix: str) -> str:
    """The one run id of the store (any experiment, deleted runs included) that starts with `prefix`."""
    from mlflow.entities import ViewType

    c = client(uri)
    experiments = [e.experiment_id for e in c.search_experiments(view_type=ViewType.ALL)]
    found = [r.info.run_id for r in c.search_runs(experiments, run_view_type=ViewType.ALL, max_results=50000)
             if r.info.run_id.startswith(prefix)]
    if len(found) > 1:
        raise StoreError(f"run id {prefix!r} is the start of {len(found)} runs' ids in {redact(uri)} "
                         f"({', '.join(sorted(f[:12] for f in found)[:4])}, ...): give more of it")
    return found[0] if found else prefix  # none: get_run says so


def run_exists(uri: str, run_id: str) -> bool:
    try:
        get_run(uri, run_id)
    except StoreError:
        return False
    return True


def experiment_name(uri: str, run) -> str:
    return client(uri).get_experiment(run.info.experiment_id).name


def newest_sweep(uri: str, experiment: str):
    """The newest parent whose jobs were measured together: a sweep, a single run or a rerun, not a sync."""
    runs = _search(uri, experiment, "tags.`harness.kind` != 'job'", max_results=200,
                   order_by=["attributes.start_time DESC"])
    runs = [r for r in runs if r.data.tags.get("harness.kind") in MEASURED_KINDS]
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


def load_result(uri: str, run_id: str):
    """The run's logged result.json as a JobRecord (config, metrics, step series, environment), with its run id
    (the file was logged before the store gave the run its id)."""
    from harness.store.results import ResultFileError, read

    with tempfile.TemporaryDirectory() as tmp:
        try:
            record = read(Path(client(uri).download_artifacts(run_id, "result.json", tmp)))
        except (ResultFileError, OSError, MlflowException) as err:
            raise StoreError(f"run {run_id} has no readable result.json artifact ({type(err).__name__})") from err
    record.mlflow_run_id = run_id
    return record


def end_run(uri: str, run_id: str, status: str, reason: str | None = None) -> None:
    if reason:
        client(uri).set_tag(run_id, "failure_reason", redact(reason)[:5000])
    client(uri).set_terminated(run_id, status=status)


def compare_url(uri: str, experiment: str, run_ids: list[str]) -> str:
    """MLflow's page comparing these runs side by side (metrics, params, charts), on the server the runs
    live on, or on the `harness ui` this store would be browsed with."""
    query = f"runs={quote(json.dumps(run_ids))}&experiments={quote(json.dumps([experiment_id(uri, experiment)]))}"
    return f"{_ui_base(uri)}/#/compare-runs?{query}"


def runs_table_url(uri: str, experiment: str, view: str = VIEW_KEY) -> str:
    """The experiment's runs table in MLflow's model-training view, in a shared view (the harness's, or a sweep's)."""
    return (f"{_ui_base(uri)}/#/experiments/{experiment_id(uri, experiment)}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={view}")


def run_url(uri: str, experiment: str, run_id: str) -> str:
    """A run's page in MLflow's model-training view (without the view's name, MLflow 3 may open its GenAI one)."""
    return (f"{_ui_base(uri)}/#/experiments/{experiment_id(uri, experiment)}/runs/{run_id}"
            "?workflowType=machine_learning")


def share_sweep_view(uri: str, experiment: str, parent: str, varying: list[str]) -> str:
    """A shared view of the runs table for one sweep: the median and its interval (MLflow shows metrics before
    params), then the keys the sweep varies, then what it held fixed; returns its key (runs_table_url opens it)."""
    key = f"sweep-{parent[:8]}"
    first = [f"params.`{k}`" for k in varying]
    metrics = ["metrics.`step_ms_median`", "metrics.`step_ms_ci_pct`", "metrics.`speedup_vs_eager`"]
    view = {**RUNS_VIEW, "selectedColumns": [*metrics, *first, *(c for c in RUNS_VIEW["selectedColumns"]
                                                                 if c.startswith("params.") and c not in first)]}
    client(uri).set_experiment_tag(experiment_id(uri, experiment), f"mlflow.sharedViewState.{key}", json.dumps(view))
    return key


def _ui_base(uri: str) -> str:
    """The UI's address: the server the runs live on (never its credentials), or the one `harness ui` serves."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return "http://127.0.0.1:5000"
    return f"{parsed.scheme}://{parsed.hostname}" + (f":{parsed.port}" if parsed.port else "") + parsed.path.rstrip("/")


def ui_command(uri: str) -> str:
    """What a person types to browse these runs."""
    if urlparse(uri).scheme in ("http", "https"):
        return f"open {redact(uri)} in a browser"
    return f"mlflow ui --backend-store-uri {redact(uri)} --host 127.0.0.1 --port 5000"
