"""sweep.json: what the jobs of one sweep share (its parent run, store, job count, start), and how it ended (its
exit status, written by the sweep callback in the launching process, whichever launcher ran the jobs). Light:
the command line reads it without loading MLflow."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

SWEEP_FILE = "sweep.json"


def status_path() -> Path:
    """Where this process's sweep leaves its exit status for the command line: the sweep callback runs in the
    launching process whatever the launcher (in-process, submitit, the GPU pool), so this process's id names it."""
    return Path(tempfile.gettempdir()) / f"harness-sweep-{os.getpid()}.status"


def set_status(code: int) -> None:
    status_path().write_text(str(code))


def take_status() -> int | None:
    """The exit status this process's sweep left (removing it), or None where no sweep ran."""
    path = status_path()
    if not path.is_file():
        return None
    code = int(path.read_text() or 1)
    path.unlink()
    return code


def read_sweep_file(sweep_dir: Path) -> dict:
    path = sweep_dir / SWEEP_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def update_sweep_file(sweep_dir: Path, **fields) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    data = {**read_sweep_file(sweep_dir), **fields}
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(data, indent=2))
