"""One run as every table, plot, parent metric and export shows it: a typed row built from its JobRecord only,
whether the record comes from a result file or from the store (its logged result.json)."""
from __future__ import annotations

from typing import TypedDict

from harness.config.labels import run_variant
from harness.record import JobRecord, flatten


class Row(TypedDict):
    id: str  # the record's result_id
    name: str  # the run's label (plus a note, e.g. that it stood in for a resumed job)
    status: str
    reason: str
    mode: str | None
    variant: str  # the mode and every option that changes what a step runs, e.g. `compiled max-autotune fused`
    model: str | None
    bs: int | None
    context_len: int | None
    cache_len: int | None
    dtype: str | None
    median_ms: float | None  # the median time of one decode step (one call of bs rows), ms
    ci_low: float | None  # its 95% interval, ms
    ci_high: float | None
    ci_pct: float | None  # the interval's half-width, % of the median
    noisy: bool
    graphs_lost: bool  # a compiled run whose mode records CUDA graphs but whose step replayed none (graphs_lost)
    efficiency: float | None  # the useful floor / the median
    floor_ms: float | None
    parameters: float | None
    mlflow_run_id: str | None


GRAPHS_LOST_NOTE = "no CUDA graph replayed"  # beside such a run's median in every table


def caveats(noisy: bool, lost_graphs: bool) -> str:
    """What every table writes after a run's median: that it is noisy, that its step replayed no CUDA graph."""
    return (" noisy" if noisy else "") + (f" {GRAPHS_LOST_NOTE}" if lost_graphs else "")


def graphs_lost(mode_tags: dict) -> bool:
    """Whether a run's compile mode records CUDA graphs but its step replayed none (its `cuda_graphs` tag): its times
    are kernels launched one by one, and every table says so beside them."""
    return mode_tags.get("cuda_graphs", "").startswith("NONE replayed")


def row_of(record: JobRecord, note: str = "") -> Row:
    c, m = record.config, record.metrics
    model = c.get("model") or {}
    return Row(id=record.result_id, name=record.label + note, status=record.status, reason=record.reason or "",
               mode=c.get("mode"), variant=run_variant(flatten(c), record.varying), model=model.get("name"), bs=c.get("bs"),
               context_len=c.get("context_len", c.get("prompt_len")), cache_len=c.get("cache_len"),
               dtype=c.get("dtype"), median_ms=m.get("step_ms_median"), ci_low=m.get("step_ms_ci_low"),
               ci_high=m.get("step_ms_ci_high"), ci_pct=m.get("step_ms_ci_pct"), noisy="noisy" in record.mode_tags,
               graphs_lost=graphs_lost(record.mode_tags),
               efficiency=m.get("efficiency"), floor_ms=m.get("floor_ms"), parameters=m.get("parameters"),
               mlflow_run_id=record.mlflow_run_id)
