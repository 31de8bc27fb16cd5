"""A sweep read back through MLflow's client: a table, plots and a markdown summary, logged as
artifacts of the sweep's parent run so that they show in the MLflow UI."""
from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness import tracking  # noqa: E402
from harness.labels import run_variant  # noqa: E402
from harness.modes import MODES  # noqa: E402
from harness.summary import speedup_intervals, speedup_text, speedups  # noqa: E402


def load(uri: str, parent_id: str | None, experiment: str) -> tuple[object, list[dict]]:
    """The sweep's parent run and one row per job run (failed ones included, with their reason). A job
    that a resumed sweep skipped is shown by the finished run that stood in for it."""
    parent = tracking.get_run(uri, parent_id) if parent_id else tracking.newest_sweep(uri, experiment)
    runs = [(run, "") for run in tracking.children(uri, parent)]
    for key, twin in sorted(parent.data.tags.items()):
        if key.startswith("harness.resumed."):
            runs.append((tracking.get_run(uri, twin), f" (resumed: run {twin})"))
    return parent, [_row(run, note) for run, note in runs]


def _row(run, note: str) -> dict:
    p, m, t = run.data.params, run.data.metrics, run.data.tags
    return {
        "id": run.info.run_id, "name": run.info.run_name + note, "status": run.info.status,
        "model": p.get("model.name", "?"), "mode": p.get("mode", "?"), "bs": _int(p.get("bs")),
        "variant": run_variant(p),
        "cache_len": _int(p.get("cache_len")), "context_len": _int(p.get("context_len", p.get("prompt_len"))), "dtype": p.get("dtype"),
        "median_ms": m.get("step_ms_median"), "ci_low": m.get("step_ms_ci_low"), "ci_high": m.get("step_ms_ci_high"),
        "ci_pct": m.get("step_ms_ci_pct"), "noisy": "noisy" in t,
        "efficiency": m.get("efficiency"), "floor_ms": m.get("floor_ms"),
        "reason": t.get("failure_reason", ""),
    }


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def table_markdown(rows: list[dict]) -> str:
    """Rows: model x cache_len x bs; columns: modes and their variants (fused, steps=4, ...);
    cells: median ms/step, speedup over eager, efficiency."""
    if not rows:
        return "(no job runs in this sweep)"
    speedup, interval = speedups(rows), speedup_intervals(rows)
    known = list(MODES)
    order = lambda v: (known.index(v.split()[0]) if v.split()[0] in known else len(known), v)  # noqa: E731
    modes = sorted({r["variant"] for r in rows}, key=order)
    cells: dict[tuple, dict[str, str]] = defaultdict(dict)
    for r in rows:
        key = (r["model"], r["cache_len"], r["bs"])
        cells[key][r["variant"]] = _cell(r, speedup_text(speedup.get(r["id"]), interval.get(r["id"])))
    lines = ["| model | cache_len | bs | " + " | ".join(modes) + " |", "|---|---:|---:|" + "---|" * len(modes)]
    for key in sorted(cells, key=lambda k: (k[0], k[1] or 0, k[2] or 0)):
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells[key].get(m, "") for m in modes) + " |")
    return "\n".join(lines)


def _cell(row: dict, speedup: str) -> str:
    if row["status"] != "FINISHED":
        return f"{row['status']}: {row['reason'][:80]}"
    spread = f" ±{row['ci_pct']:.1f}%" if row.get("ci_pct") is not None else ""
    parts = [f"{row['median_ms']:.3f} ms{spread}" + (" noisy" if row.get("noisy") else "")]
    if speedup != "-":
        parts.append(speedup)
    if row["efficiency"] is not None:
        parts.append(f"eff {100 * row['efficiency']:.1f}%")
    return ", ".join(parts)


def plots(rows: list[dict], out_dir: Path) -> list[Path]:
    ok = [r for r in rows if r["status"] == "FINISHED"]
    speedup = speedups(rows)
    made = []
    for name, x, y, ylabel in (("latency_vs_bs", "bs", lambda r: r["median_ms"], "median ms/step"),
                               ("speedup_vs_bs", "bs", lambda r: speedup.get(r["id"]), "speedup over eager"),
                               ("latency_vs_cache_len", "cache_len", lambda r: r["median_ms"], "median ms/step")):
        other = "cache_len" if x == "bs" else "bs"
        series: dict[tuple, list[tuple]] = defaultdict(list)
        for r in ok:
            if y(r) is not None:
                series[(r["model"], r["variant"], f"{other}={r[other]}")].append((r[x], y(r)))
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=" ".join(label))
        ax.set_xscale("log", base=2)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def build(uri: str, parent_id: str | None, experiment: str, out_dir: Path) -> tuple[str, list[Path], str]:
    """Write summary.md and the plots into out_dir and log them on the parent run."""
    parent, rows = load(uri, parent_id, experiment)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in rows if r["status"] != "FINISHED"]
    summary = [f"# Sweep {parent.info.run_name} ({parent.info.run_id})", "",
               f"{len(rows) - len(failed)} finished, {len(failed)} failed.", "", table_markdown(rows), ""]
    summary += [f"- {r['status']} {r['name']}: {r['reason']}" for r in failed]
    text = "\n".join(summary) + "\n"
    (out_dir / "summary.md").write_text(text)
    made = plots(rows, out_dir)
    for path in [out_dir / "summary.md", *made]:
        tracking.client(uri).log_artifact(parent.info.run_id, str(path), "report")
    return text, made, parent.info.run_id


def default_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="harness-report-"))
