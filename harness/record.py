"""JobRecord: one job's typed record, from `execute` to result.json, the store, the summary and sync."""
from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

OK_STATUSES = ("FINISHED", "SKIPPED")  # a job that needs no attention; anything else fails the sweep


@dataclass
class Measurement:
    """What measure() found; `failure` is set when the run measured but must not pass (a wrong decode)."""

    metrics: dict[str, float]
    step_ms: list[float]
    step_clock: str
    weights: str  # "random" | "checkpoint" | "hub"
    weights_source: str
    model_reused: bool
    mode_tags: dict[str, str]
    architecture: dict[str, Any]
    environment: dict[str, str]
    failure: str | None = None


@dataclass
class JobRecord:
    label: str
    config: dict[str, Any]
    result_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    job_num: int | None = 0
    job_dir: str = ""
    overrides: list[str] = field(default_factory=list)
    tracking_uri: str = ""  # redacted
    experiment: str = "harness"
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # extra run tags (rerun_of, ...)
    varying: list[str] = field(default_factory=list)  # the keys its sweep varies, named in its label and row
    started: str = field(default_factory=lambda: now_utc())  # when the job started, to the millisecond
    ended: str = ""  # when it ended (measured, failed or was killed): with `started`, where a GPU was busy
    status: str = "RUNNING"
    reason: str | None = None
    config_hash: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    step_ms: list[float] = field(default_factory=list)
    step_clock: str = ""
    weights: str = ""  # empty where the job failed before building its model
    weights_source: str = ""
    model_reused: bool = False
    mode_tags: dict[str, str] = field(default_factory=dict)
    architecture: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    mlflow_run_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    @property
    def wall_s(self) -> float | None:
        """Seconds from the job's start to its end; None while it has no end (running, or killed unrecorded)."""
        if not (self.started and self.ended):
            return None
        return (datetime.fromisoformat(self.ended) - datetime.fromisoformat(self.started)).total_seconds()

    def measured(self, m: Measurement) -> None:
        """Take a measurement's fields; a failure makes the record FAILED with it as the reason."""
        for f in fields(Measurement):
            if f.name != "failure":
                setattr(self, f.name, getattr(m, f.name))
        self.status, self.reason = ("FAILED", m.failure) if m.failure else ("FINISHED", None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        """A record from result.json; keys that older harness versions wrote and this one lacks are dropped."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def failure_summary(records: list[JobRecord]) -> str | None:
    """A parent's failure reason: how many of its jobs failed, and the first ones' reasons."""
    failed = [r for r in records if not r.ok]
    if not failed:
        return None
    return f"{len(failed)} of {len(records)} jobs failed: " + "; ".join(f"{r.label}: {r.reason}" for r in failed[:3])


NOT_LOGGED = 3  # the exit status of a run or sweep whose jobs all ran but not all reached the store


def unlogged(records: list[JobRecord]) -> list[JobRecord]:
    """The records the store does not hold (it was down, or refused them): kept on disk for `harness sync`."""
    return [r for r in records if r.status != "SKIPPED" and not r.mlflow_run_id]


def exit_code(records: list[JobRecord]) -> int:
    """A run or sweep exits 1 when any job needs attention (failed, killed), else 3 when a result did not reach
    the store, 0 otherwise."""
    if not all(r.ok for r in records):
        return 1
    return NOT_LOGGED if unlogged(records) else 0
