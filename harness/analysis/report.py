"""A sweep read back through MLflow's client: a table, plots and a markdown summary, logged as
artifacts of the sweep's parent run so that they show in the MLflow UI."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from harness.store import results, tracking  # noqa: E402
from harness.modes import MODES  # noqa: E402
from harness.analysis.rows import Row, caveats, row_of  # noqa: E402
from harness.analysis.summary import speedup_intervals, speedup_text, speedups  # noqa: E402
from harness.record import JobRecord  # noqa: E402


def load(uri: str, parent_id: str | None, experiment: str) -> tuple[object, list[Row]]:
    """The sweep's parent run and one row per job run (failed ones included, with their reason), each from the
    run's logged result.json. A job that a resumed sweep skipped is shown by the finished run that stood in for it."""
    parent, records = load_records(uri, parent_id, experiment)
    return parent, [row_of(record, note) for record, note in records]


def load_records(uri: str, parent_id: str | None, experiment: str) -> tuple[object, list[tuple[JobRecord, str]]]:
    """The sweep's parent run and each job's record with a note (a resumed sweep's stand-in says so)."""
    parent = tracking.get_run(uri, parent_id) if parent_id else tracking.newest_sweep(uri, experiment)
    runs = [(run.info.run_id, "") for run in tracking.children(uri, parent)]
    runs += [(twin, f" (resumed: run {twin})") for key, twin in sorted(parent.data.tags.items())
             if key.startswith("harness.resumed.")]
    return parent, [(tracking.load_result(uri, run_id), note) for run_id, note in runs]


def table_markdown(rows: list[Row]) -> str:
    """Rows: model x context_len x cache_len x bs; columns: modes and their variants (fused, flex, ...);
    cells: median ms/step, speedup over eager, efficiency against the useful floor."""
    if not rows:
        return "(no job runs in this sweep)"
    speedup, interval = speedups(rows), speedup_intervals(rows)
    modes = variant_columns(rows)
    cells: dict[tuple, dict[str, str]] = defaultdict(dict)
    shared: dict[tuple, list[str]] = defaultdict(list)  # (row, column) -> the names of the runs in that cell
    for r in rows:
        key = (r["model"] or r["name"], r["context_len"], r["cache_len"], r["bs"])  # an unrun job: its name
        text = _cell(r, speedup_text(speedup.get(r["id"]), interval.get(r["id"])))
        cells[key][r["variant"]] = f"{cells[key][r['variant']]} / {text}" if r["variant"] in cells[key] else text
        shared[(key, r["variant"])].append(r["name"])
    lines = ["| model | context_len | cache_len | bs | " + " | ".join(modes) + " |",
             "|---|---:|---:|---:|" + "---|" * len(modes)]
    for key in sorted(cells, key=lambda k: (k[0] or "", *(x or 0 for x in k[1:]))):  # an unrun job has no config
        lines.append("| " + " | ".join("-" if k is None else str(k) for k in key) + " | "
                     + " | ".join(cells[key].get(m, "") for m in modes) + " |")
    lines += [f"\nRuns sharing a cell (their configs differ in keys the table does not show): {'; '.join(names)}"
              for names in shared.values() if len(names) > 1]
    return "\n".join(lines)


def variant_columns(rows: list[Row]) -> list[str]:
    """The rows' variants as table columns: in the mode registry's order (eager first), then by name."""
    known = list(MODES)
    return sorted({r["variant"] for r in rows},
                  key=lambda v: (known.index(v.split()[0]) if v.split()[0] in known else len(known), v))


def _cell(row: Row, speedup: str) -> str:
    if row["status"] != "FINISHED":
        return f"{row['status']}: {row['reason'][:80]}"
    spread = f" ±{row['ci_pct']:.1f}%" if row.get("ci_pct") is not None else ""
    parts = [f"{row['median_ms']:.3f} ms{spread}" + caveats(row.get("noisy"), row.get("graphs_lost"))]
    if speedup != "-":
        parts.append(speedup)
    if row["efficiency"] is not None:
        parts.append(f"eff {100 * row['efficiency']:.1f}%")
    return ", ".join(parts)


PLOTS = (("latency_vs_bs", "bs", "median_ms", "median ms/step"),
         ("speedup_vs_bs", "bs", "speedup", "speedup over eager"),
         ("latency_vs_context_len", "context_len", "median_ms", "median ms/step (dashed: the useful floor)"),
         ("speedup_vs_model_size", "parameters", "speedup", "speedup over eager"),
         ("latency_vs_model_size", "parameters", "median_ms", "median ms/step (dashed: the useful floor)"))
# the other keys that split a plot's lines (a derived cache follows the context; the model is the size)
SPLIT_BY = {"context_len": ("bs",), "parameters": ("bs", "context_len")}


def plots(rows: list[Row], out_dir: Path) -> list[Path]:
    speedup = speedups(rows)
    ok = [{**r, "speedup": speedup.get(r["id"])} for r in rows if r["status"] == "FINISHED"]
    made = []
    for name, x, y, ylabel in PLOTS:
        if x in SPLIT_BY and len({r.get(x) for r in ok}) < 2:
            continue  # one context, one model: no such axis
        others = [k for k in SPLIT_BY.get(x, ("context_len", "cache_len")) if len({r[k] for r in ok}) > 1]
        model = (lambda r: ()) if x == "parameters" else (lambda r: (r["model"],))  # noqa: E731
        series: dict[tuple, list[tuple]] = defaultdict(list)
        for r in (r for r in ok if r[y] is not None):
            series[(*model(r), r["variant"], *(f"{k}={r[k]}" for k in others))].append((r[x], r[y]))
        floors: dict[tuple, set] = defaultdict(set)
        for r in (r for r in ok if y == "median_ms" and x in SPLIT_BY and r["floor_ms"] is not None):
            floors[(*model(r), "floor", *(f"{k}={r[k]}" for k in others))].add((r[x], r["floor_ms"]))
        if series:
            made.append(_draw(series, floors, x, ylabel, out_dir / f"{name}.png"))
    return made + ladder_chart(ok, out_dir / "ladder.png") + context_chart(ok, out_dir / "context.png")


def _group_key(r: dict) -> tuple:
    return (r["model"] or "", r["bs"] or 0)


def ladder_chart(ok: list[dict], path: Path) -> list[Path]:
    """The ladder as bars: for each model and bs (one context), each mode's median ms a step side by side, on a log
    axis, and the floor (the bytes a step must read at the GPU's measured copy rate) as a black line across the
    group. Drawn where the runs share one context and hold two modes or more; [] otherwise."""
    if len({r["context_len"] for r in ok}) != 1 or len({r["variant"] for r in ok}) < 2:
        return []
    fig, ax = plt.subplots(figsize=(10, 4.8))
    groups, variants = sorted({_group_key(r) for r in ok}), variant_columns(ok)
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        bars = {_group_key(r): r["median_ms"] for r in ok if r["variant"] == variant}
        xs = [g for g, key in enumerate(groups) if key in bars]
        ax.bar([g - 0.4 + width * (i + 0.5) for g in xs], [bars[groups[g]] for g in xs], width, label=variant)
    floors = {_group_key(r): r["floor_ms"] for r in ok if r["floor_ms"] is not None}
    for g, key in enumerate(groups):
        if key in floors:
            ax.hlines(floors[key], g - 0.45, g + 0.45, colors="black", linewidth=2,
                      label="floor (bytes read / copy rate)" if g == min(i for i, k in enumerate(groups) if k in floors)
                      else None)
    ax.set_xticks(range(len(groups)), [f"{model}\nbs {bs}" for model, bs in groups], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median ms per decode step (log scale)")
    ax.set_xlabel(f"model and batch size (context {ok[0]['context_len']} tokens)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=len(variants) + 1, loc="upper center", bbox_to_anchor=(0.5, 1.12), frameon=False)
    return [_save(fig, path)]


def context_chart(ok: list[dict], path: Path) -> list[Path]:
    """The context sweep as lines: one panel per bs, ms a step against the context for each mode and backend, the
    floor dashed. Drawn where the runs hold one model and two contexts or more; [] otherwise."""
    if len({r["model"] for r in ok}) != 1 or len({r["context_len"] for r in ok}) < 2:
        return []
    batches, variants = sorted({r["bs"] for r in ok}), variant_columns(ok)
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches) + 1, 4.2), squeeze=False)
    for ax, bs in zip(axes[0], batches):
        for variant in variants:
            points = sorted((r["context_len"], r["median_ms"]) for r in ok if r["bs"] == bs and r["variant"] == variant)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant)
        floor = sorted({(r["context_len"], r["floor_ms"]) for r in ok if r["bs"] == bs and r["floor_ms"] is not None})
        floor = sorted(dict(floor).items())  # one floor a context (the runs of one context share it, within a rounding)
        ax.plot([p[0] for p in floor], [p[1] for p in floor], linestyle="--", color="grey", label="floor")
        ax.set_xscale("log", base=2)
        contexts = sorted({r["context_len"] for r in ok})
        ax.set_xticks(contexts, [str(c) for c in contexts], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale("log")
        ax.set_title(f"{ok[0]['model']}, bs {bs}", fontsize=10)
        ax.set_xlabel("context (tokens in the KV cache)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("median ms per decode step (log scale)")
    axes[0][-1].legend(fontsize=8)
    return [_save(fig, path)]


def _draw(series: dict, floors: dict, x: str, ylabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(series.items(), key=lambda item: _natural(item[0])):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=" ".join(label))
    for label, points in sorted(floors.items(), key=lambda item: _natural(item[0])):
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="--", color="grey", label=" ".join(label))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log") if floors else None
    if x == "parameters":  # a tick at each model's size
        sizes = sorted({p[0] for points in series.values() for p in points})
        ax.set_xticks(sizes, [f"{v / 1e9:.3g}B" for v in sizes], fontsize=7)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _natural(label: tuple) -> list:
    """bs=8 before bs=32: numbers in a label compare as numbers."""
    return [int(part) if part.isdigit() else part for text in label for part in re.split(r"(\d+)", str(text))]


def ratio_plot(pairs, path: Path) -> Path:
    """`harness compare`'s pairs: candidate / baseline with its 95% interval, one bar per run."""
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(pairs) + 1.5))
    y = range(len(pairs))
    ax.errorbar([p.ratio for p in pairs], y, xerr=[[p.ratio - p.low for p in pairs], [p.high - p.ratio for p in pairs]],
                fmt="o", capsize=3)
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_yticks(list(y), [p.label for p in pairs], fontsize=7)
    ax.set_xlabel("candidate / baseline median step time (95% interval)")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build(uri: str, parent_id: str | None, experiment: str, out_dir: Path | None) -> tuple[str, list[Path], str]:
    """Write summary.md and the plots into out_dir (unless told, the sweep folder's report/ where it is here, else a
    folder under ./outputs/reports/) and log them on the parent
    run; returns the summary's text, the files written (summary.md first) and the parent's id."""
    parent, rows = load(uri, parent_id, experiment)
    sweep_dir = Path(parent.data.tags.get("sweep_dir") or "/nonexistent")
    out_dir = out_dir or (sweep_dir / "report" if sweep_dir.is_dir()
                          else results.default_dir("reports", parent.info.run_id))
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in rows if r["status"] != "FINISHED"]
    summary = [f"# Sweep {parent.info.run_name} ({parent.info.run_id})", "",
               f"{len(rows) - len(failed)} finished, {len(failed)} failed.", "", table_markdown(rows), ""]
    summary += [f"- {r['status']} {r['name']}: {r['reason']}" for r in failed]
    text = "\n".join(summary) + "\n"
    (out_dir / "summary.md").write_text(text)
    made = plots(rows, out_dir)
    made = [out_dir / "summary.md", *made]
    for path in made:
        tracking.client(uri).log_artifact(parent.info.run_id, str(path))  # at the top, as the sweep logs them
    return text, made, parent.info.run_id


def from_records(records, title: str, out_dir: Path, notes: list[str] = ()) -> list[Path]:
    """summary.md and the plots of a sweep that just ended, from its result files (no store query)."""
    rows = [row_of(r) for r in records]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.md").write_text("\n".join([f"# {title}", "", table_markdown(rows), "", *notes]) + "\n")
    return [out_dir / "summary.md", *plots(rows, out_dir)]


def from_folder(folder: Path, out_dir: Path | None) -> list[Path]:
    """The report of every result file under `folder` (sub-sweeps of one plan, run where no store was). A
    config that ran more than once shows its latest run; the earlier ones are listed under the table."""
    records, latest = latest_of_each_config(folder)
    kept = {id(r) for r in latest}
    why = {"SKIPPED": "skipped by resume", "KILLED": "interrupted before it measured"}
    notes = [f"- {why.get(r.status, 'ran again later')}, not in the table: "
             f"{r.label} {r.status} ({r.job_dir or '?'})" for r in records if id(r) not in kept]
    return from_records(latest, f"results under {folder}", out_dir or folder / "report", notes)


def latest_of_each_config(folder: Path) -> tuple[list[JobRecord], list[JobRecord]]:
    """Every record under the folder, oldest first, and the latest of each config among them. A resumed sweep's
    SKIPPED record, and a KILLED one (interrupted: it measured nothing), sort first, so neither replaces a run of its
    config that measured (a second sweep cut by its time limit would otherwise hide the first sweep's result)."""
    records = sorted(results.read_folder(folder), key=lambda r: (r.status not in ("SKIPPED", "KILLED"), r.started))
    return records, list({r.config_hash or r.result_id: r for r in records}.values())
