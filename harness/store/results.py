"""result.json: each job's record, written to its job folder before anything talks to a store.

The store can be down, a sweep can die; what is on disk here is enough to rebuild the run.
"""
from __future__ import annotations

import csv
import json
import os
from datetime import datetime
from pathlib import Path

import yaml

from harness.errors import ConfigError
from harness.record import JobRecord

RESULT_FILE = "result.json"
STEPS_FILE = "steps.csv"
CONFIG_FILE = "config.yaml"  # the resolved config: `python -m harness --config-path DIR --config-name config`


class ResultFileError(ValueError):
    pass


def write(job_dir: Path, record: JobRecord) -> Path:
    """Atomically (write, then rename) so a killed job never leaves half a file."""
    job_dir.mkdir(parents=True, exist_ok=True)
    if record.config:
        (job_dir / CONFIG_FILE).write_text(yaml.safe_dump(record.config, sort_keys=False))
    if record.step_ms:
        with open(job_dir / STEPS_FILE, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "step_ms"])
            writer.writerows(enumerate(record.step_ms))
    path = job_dir / RESULT_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record.to_dict(), indent=2, default=str))
    os.replace(tmp, path)
    return path


def read(path: Path) -> JobRecord:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ResultFileError(f"{path}: not a readable result file ({err})") from err
    if not isinstance(data, dict) or "status" not in data or "label" not in data:
        raise ResultFileError(f"{path}: not a harness result (no 'status' or 'label' key)")
    return JobRecord.from_dict(data)


def read_dir(folder: Path, on_error) -> list[tuple[Path, JobRecord]]:
    """Every readable result under a folder with its path; each unreadable one goes to on_error(ResultFileError)."""
    found = []
    for path in find(folder):
        try:
            found.append((path, read(path)))
        except ResultFileError as err:
            on_error(err)
    return found


def read_all(folder: Path, on_error) -> list[JobRecord]:
    return [record for _, record in read_dir(folder, on_error)]


def read_folder(folder: Path) -> list[JobRecord]:
    """Every record under a folder a user named; none readable is an error that says why."""
    bad: list[Exception] = []
    records = read_all(Path(folder), on_error=bad.append)
    if not records:
        raise ConfigError(f"{folder} holds no readable result.json" + (f" ({bad[0]})" if bad else ""))
    return records


def find(sweep_dir: Path) -> list[Path]:
    """Every job's result file under a sweep (or run) folder, in job order."""
    paths = list(Path(sweep_dir).glob(f"**/{RESULT_FILE}"))
    return sorted(paths, key=lambda p: (len(p.parts), _job_key(p.parent.name)))


def _job_key(name: str):
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def default_dir(kind: str, name: str) -> Path:
    """Where a command's files go unless told: a folder of its own under ./outputs/KIND/ (beside the sweeps, ignored
    by git), named by the time and `name` (a run id's first characters), never a temporary folder left behind."""
    return Path("outputs") / kind / f"{datetime.now():%Y-%m-%d/%H-%M-%S}-{name[:8]}"
