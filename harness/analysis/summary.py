"""The compact table printed at the end of a run or sweep, built from its result files."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.analysis.rows import Row, caveats, graphs_lost, row_of
from harness.record import JobRecord, unlogged


def eager_twins(rows: list[Row]) -> dict[str, Row]:
    """id -> the eager run of the same model, cache_len, bs, context_len and dtype, for finished runs that
    have one. Where a sweep holds several eager variants (fused, another attn), the plain one is the
    baseline."""
    twin = lambda r: (r["model"], r["cache_len"], r["bs"], r["context_len"], r.get("dtype"))  # noqa: E731
    done = [r for r in rows if r["status"] == "FINISHED" and r["median_ms"]]
    eager: dict[tuple, dict] = {}
    for r in (r for r in done if r["mode"] == "eager"):
        if twin(r) not in eager or r.get("variant", "eager") == "eager":
            eager[twin(r)] = r
    return {r["id"]: eager[twin(r)] for r in done if twin(r) in eager}


def speedups(rows: list[Row]) -> dict[str, float]:
    """id -> eager's median / this run's."""
    by_id = {r["id"]: r for r in rows}
    return {i: e["median_ms"] / by_id[i]["median_ms"] for i, e in eager_twins(rows).items()}


def own_speedups(rows: list[Row]) -> dict[str, float]:
    """speedups() less each eager baseline's over itself (1 by definition, which a metric would present as found)."""
    twins = eager_twins(rows)
    return {i: s for i, s in speedups(rows).items() if twins[i]["id"] != i}


def speedup_intervals(rows: list[Row]) -> dict[str, tuple[float, float]]:
    """id -> a conservative 95% interval of the speedup: the ends of eager's median interval over the
    opposite ends of this run's (rows with `ci_low` and `ci_high`)."""
    by_id = {r["id"]: r for r in rows}
    return {i: (e["ci_low"] / by_id[i]["ci_high"], e["ci_high"] / by_id[i]["ci_low"])
            for i, e in eager_twins(rows).items()
            if all(x.get(k) for x in (e, by_id[i]) for k in ("ci_low", "ci_high"))}


def speedup_text(speedup: float | None, interval: tuple[float, float] | None) -> str:
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x" + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")


def median_text(metrics: dict, mode_tags: dict) -> str:
    """A run's median ms/step, its interval, and what to keep in mind beside it (noisy; no CUDA graph replayed)."""
    if "step_ms_median" not in metrics:
        return "-"
    text = f"{metrics['step_ms_median']:.3f}"
    if "step_ms_ci_pct" in metrics:
        text += f" ±{metrics['step_ms_ci_pct']:.1f}%"
    return text + caveats("noisy" in mode_tags, graphs_lost(mode_tags))


def parent_metrics(records: list[JobRecord]) -> dict[str, float]:
    """What a sweep's parent run carries, so that MLflow's runs page charts it at first sight: per mode and
    variant x bs (and model and context where the sweep varies them), the median and the speedup over eager."""
    rows = [row_of(r) for r in records]
    speedup = own_speedups(rows)
    varied = [k for k in ("model", "context_len") if len({r[k] for r in rows}) > 1]
    metrics = {"jobs_finished": float(sum(r["status"] == "FINISHED" for r in rows)),
               "jobs_failed": float(sum(not rec.ok for rec in records))}
    for r in (r for r in rows if r["status"] == "FINISHED" and r["median_ms"]):
        name = "/".join([r["variant"].replace(" ", "_").replace("=", ""), *(f"{k}{r[k]}" for k in varied), f"bs{r['bs']}"])
        metrics[f"median_ms/{name}"] = float(f"{r['median_ms']:.4g}")  # as known (MLflow shows all digits)
        if r["id"] in speedup:
            metrics[f"speedup/{name}"] = round(speedup[r["id"]], 3)
    return metrics


def child_speedups(records: list[JobRecord]) -> dict[str, float]:
    """MLflow run id -> the run's speedup over the eager run of its config in the same sweep (rounded as printed),
    for the logged runs that have one: a metric MLflow's compare page can chart beside the median."""
    rows = [row_of(r) for r in records]
    speedup = own_speedups(rows)
    return {r["mlflow_run_id"]: round(speedup[r["id"]], 3) for r in rows if r["id"] in speedup and r["mlflow_run_id"]}


def table(results: list[JobRecord]) -> Table:
    rows = [row_of(r) for r in results]
    speedup, interval = speedups(rows), speedup_intervals(rows)
    attns = {str(r.config.get("attn")) for r in results}
    t = Table()
    columns = [("#", "right"), ("run", "left"), ("status", "left"), ("step ms (median, 95% CI)", "right"),
               ("wall ms/step", "right"), ("tokens/s", "right"), ("vs eager", "right"), ("vs floor", "right"),
               ("reason", "left")]
    if len(attns) > 1:  # the label names a backend other than sdpa; with several, say each
        columns.insert(2, ("attn", "left"))
    for name, justify in columns:
        t.add_column(name, justify=justify, overflow="fold")
    for r in results:
        m = r.metrics
        cells = ["-" if r.job_num is None else str(r.job_num), r.label, r.status, median_text(m, r.mode_tags),
                 f"{m['wall_ms_per_step']:.3f}" if "wall_ms_per_step" in m else "-",
                 f"{m['tokens_per_s']:.1f}" if "tokens_per_s" in m else "-",
                 speedup_text(speedup.get(r.result_id), interval.get(r.result_id)),
                 f"{100 * m['efficiency']:.0f}%" if "efficiency" in m else "-",
                 "" if r.status == "FINISHED" else _short(r.reason or "")]
        if len(attns) > 1:
            cells.insert(2, str(r.config.get("attn")))
        t.add_row(*map(Text, cells))
    return t


# release: the memory check after a job (a GPU's only), its collection and the allocator's cache emptied
PHASES = ("build_ms", "prefill_ms", "prepare_ms", "warmup_ms", "decode_wall_ms", "verify_ms", "release_ms")


def time_breakdown(results: list[JobRecord], wall_s: float | None = None) -> str:
    """Where a sweep's time went: each phase summed over its jobs; what the jobs spent outside those phases (GPU
    readings, the job's figures computed: the part to profile when it grows); and, given the sweep's wall, the time
    between jobs (each job's result written and logged to the store after its end, the launcher's own), or the job
    walls where jobs ran side by side (a GPU pool), whose sum then exceeds the wall."""
    totals = {p: sum(r.metrics.get(p, 0.0) for r in results) / 1e3 for p in PHASES}
    parts = ", ".join(f"{p.removesuffix('_ms').replace('_wall', '')} {s:.1f} s" for p, s in totals.items())
    ended = [r for r in results if r.wall_s is not None]
    in_jobs_s = sum(r.wall_s for r in ended)
    if ended:
        phases_s = sum(r.metrics.get(p, 0.0) for r in ended for p in PHASES) / 1e3
        parts += f", outside these phases {max(in_jobs_s - phases_s, 0.0):.1f} s"
    head = f"sweep wall {wall_s:.1f} s; " if wall_s is not None else ""
    tail = ""
    if wall_s is not None and ended:
        tail = (f"; between jobs {wall_s - in_jobs_s:.1f} s" if in_jobs_s <= wall_s
                else f"; {in_jobs_s:.1f} s of job walls, side by side")
    return f"time: {head}in jobs: {parts}{tail}"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def print_summary(results: list[JobRecord], title: str, ui_hint: str, wall_s: float | None = None) -> None:
    # a terminal's own width; into a pipe or file, lines as long as their content (up to 160), never padded
    console = Console(width=None if sys.stdout.isatty() else 160)
    line = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    line(title)
    with console.capture() as captured:
        console.print(table(results))
    print("\n".join(row.rstrip() for row in captured.get().splitlines()))
    for r in results:
        if not r.ok:
            line(f"{r.status}: {r.label}: {r.reason}")
    count = lambda *s: sum(r.status in s for r in results)  # noqa: E731
    line(time_breakdown(results, wall_s))
    skipped = f", {count('SKIPPED')} skipped (resume)" if count('SKIPPED') else ""
    lost = unlogged(results)
    line(f"{count('FINISHED')} finished, {sum(not r.ok for r in results)} failed{skipped}. "
         + (f"Browse: {ui_hint}" if not lost else "Results on disk only."))
    if lost:
        folders = sorted({str(Path(r.job_dir).parent) for r in lost if r.job_dir})
        line(f"NOT LOGGED: {len(lost)} of {len(results)} results did not reach the store; they are kept on disk: "
             f"harness sync {' '.join(folders) or '.'}")
