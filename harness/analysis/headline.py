"""The results a reader sees first (the README's opening table): per model x context x bs, each mode's median
ms/step and its speedup over eager, under one line of the conditions every run shares. Built from result
records only, so a README block can be regenerated from committed result folders and checked against them."""
from __future__ import annotations

from collections import defaultdict

from harness.analysis.report import variant_columns
from harness.analysis.rows import Row, row_of
from harness.analysis.summary import speedups
from harness.record import JobRecord

# what every run of the table must share, or the line names each value it took
CONDITIONS = (("GPU", lambda r: r.environment.get("gpu_name") or r.environment.get("device")),
              ("dtype", lambda r: r.config.get("dtype")),
              ("cache_len", lambda r: r.config.get("cache_len")),
              ("torch", lambda r: r.environment.get("torch")),
              ("transformers", lambda r: r.environment.get("transformers")),
              ("date", lambda r: (r.started or "")[:10]),
              ("GPU id", lambda r: (r.environment.get("gpu_uuid") or "")[:12] or None))


def conditions_line(records: list[JobRecord]) -> str:
    parts = []
    for name, value_of in CONDITIONS:
        values = sorted({str(v) for v in map(value_of, records) if v not in (None, "")})
        if values:
            parts.append(f"{name} {', '.join(values)}")
    verified = sum(r.metrics.get("verified") == 1.0 for r in records)
    return "; ".join(parts) + f"; {verified} of {len(records)} runs passed verification"


def headline_markdown(records: list[JobRecord], conditions_first: bool = True) -> str:
    """The conditions, then one row per model x context x bs: each mode's median ms/step, then each non-eager
    mode's speedup over the eager run of the same config. Only finished runs; the others are named below."""
    done = sorted((r for r in records if r.status == "FINISHED" and r.metrics.get("step_ms_median")),
                  key=lambda r: r.started or "")
    if not done:
        return "(no finished runs)"
    rows = [row_of(r) for r in done]
    variants = variant_columns(rows)
    # the row's key: model, context, bs, and cache_len or dtype where the runs differ in them (never a merge)
    extra = [k for k in ("cache_len", "dtype") if len({r[k] for r in rows}) > 1]
    cells, shared = _cells(rows, lambda r: (r["model"], r["context_len"], *(r[k] for k in extra), r["bs"]))
    faster = [v for v in variants if v != "eager"]
    header = ["model", "context", *extra, "bs", *(f"{v} ms/step" for v in variants), *(f"{v} speedup" for v in faster)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    speedup = speedups(rows)
    for key in sorted(cells, key=lambda k: tuple(x if isinstance(x, str) else (x or 0) for x in k)):
        by_variant = cells[key]
        ms = [f"{by_variant[v]['median_ms']:.3f}" if v in by_variant else "-" for v in variants]
        ratio = [f"{speedup[by_variant[v]['id']]:.2f}x" if v in by_variant and by_variant[v]["id"] in speedup
                 else "-" for v in faster]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(ms + ratio) + " |")
    lines += [f"\nShown once, the later of two runs of one cell (their configs differ in keys the table does not "
              f"show): {pair}" for pair in shared]
    lines += [f"\nNot in the table ({r.status}): {r.label}" for r in records if r.status != "FINISHED"]
    # (a parent run's description shows its first lines only, until "Show more": there the table goes first)
    return "\n".join([conditions_line(done), "", *lines] if conditions_first else [*lines, "", conditions_line(done)])


def _cells(rows: list[Row], key_of) -> tuple[dict[tuple, dict[str, Row]], list[str]]:
    """(row key -> variant -> row), and the pairs of runs that fell into one cell (the later one is kept)."""
    cells: dict[tuple, dict[str, Row]] = defaultdict(dict)
    shared = []
    for r in rows:
        if r["variant"] in cells[key_of(r)]:
            shared.append(f"{cells[key_of(r)][r['variant']]['name']} and {r['name']}")
        cells[key_of(r)][r["variant"]] = r
    return cells, shared
