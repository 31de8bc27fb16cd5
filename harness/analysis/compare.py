"""`harness compare BASELINE CANDIDATE`: did it get slower?

Each side is a sweep's parent run, a job run, or an outputs/ folder. Runs are matched by their config (the
keys that say what is measured, less the ones the user ignores). For each pair: both medians, the ratio
candidate / baseline, and its 95% interval from the two sides' step series (each resampled by the
two-level bootstrap of stats.py, independently). The verdict at a threshold t: `slower` when the whole
interval lies above 1 + t, `faster` when it lies below 1 - t, `same` otherwise (which includes "not sure").
The exit status is 1 when any pair is slower, so that CI can gate on it.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.store import results, tracking
from harness.config.schema import identity
from harness.errors import ConfigError
from harness.record import JobRecord, flatten
from harness.measure.stats import bootstrap_medians

@dataclass
class Side:
    given: str
    records: list[JobRecord]
    parent_run_id: str | None  # the store run that holds the side's runs, where compare's files are logged


@dataclass
class Pair:
    label: str
    baseline_ms: float
    candidate_ms: float
    ratio: float
    low: float
    high: float
    verdict: str


def load_side(uri: str, given: str) -> Side:
    if Path(given).is_dir():
        return Side(given, results.read_folder(Path(given)), None)
    run = tracking.get_run(uri, given)
    if run.data.tags.get("harness.kind") == "job":
        return Side(given, [tracking.load_result(uri, given)], given)
    runs = tracking.children(uri, run)
    if not runs:
        raise ConfigError(f"run {given} has no job runs to compare")
    return Side(given, [tracking.load_result(uri, r.info.run_id) for r in runs], given)


def match_key(record: JobRecord, ignore: list[str]) -> str:
    """What a run measured: its config less where it is stored and less the ignored keys (and their subkeys)."""
    flat = {k: v for k, v in flatten(identity(record.config)).items()
            if not any(k == i or k.startswith(f"{i}.") for i in ignore)}
    return json.dumps(flat, sort_keys=True, default=str)


def blocks(record: JobRecord) -> list[list[float]]:
    """The step series cut back into its timed blocks (of equal length: as many as the run timed, `repeats` at most)."""
    n = max(1, int(record.metrics.get("repeats") or record.config.get("repeats") or 1))
    size = len(record.step_ms) // n
    return [record.step_ms[i * size:(i + 1) * size] for i in range(n)] if size else [record.step_ms]


def pair(base: JobRecord, cand: JobRecord, threshold: float) -> Pair:
    ratios = bootstrap_medians(blocks(cand), seed=1) / bootstrap_medians(blocks(base), seed=0)
    low, high = (float(x) for x in np.percentile(ratios, [2.5, 97.5]))
    b, c = float(np.median(base.step_ms)), float(np.median(cand.step_ms))
    verdict = "slower" if low > 1 + threshold else "faster" if high < 1 - threshold else "same"
    return Pair(cand.label, b, c, c / b, low, high, verdict)


def comparable(record: JobRecord) -> bool:
    return record.status == "FINISHED" and bool(record.step_ms)


def compare(base: list[JobRecord], cand: list[JobRecord], ignore: list[str], threshold: float):
    """The pairs, and the runs of each side left without a partner (or not comparable), with why. Where a
    side holds a config twice, the first of each side pair up and the others are listed."""
    waiting: dict[str, list[JobRecord]] = {}
    for r in (r for r in base if comparable(r)):
        waiting.setdefault(match_key(r, ignore), []).append(r)
    pairs, unmatched, paired = [], [], set()
    for r in cand:
        key = match_key(r, ignore)
        if not comparable(r):
            unmatched.append(("candidate", r.label, f"not comparable: {r.status}"))
        elif key in paired or key not in waiting:
            unmatched.append(("candidate", r.label, "another run of a config already paired" if key in paired
                              else "no baseline run with this config"))
        else:
            pairs.append(pair(waiting[key].pop(0), r, threshold))
            paired.add(key)
    unmatched += [("baseline", r.label, f"not comparable: {r.status}") for r in base if not comparable(r)]
    unmatched += [("baseline", r.label, "no candidate run with this config" if key not in paired else
                   "another run of a config already paired") for key, rest in waiting.items() for r in rest]
    return pairs, unmatched


def environment_diff(base: list[JobRecord], cand: list[JobRecord], ignore: list[str]) -> dict[str, tuple]:
    """Environment keys (torch, CUDA, driver, GPU, commit, host, ...) whose values differ between the sides; the
    GPU fingerprint's measured figures apart (fingerprint_diff: they always differ a little)."""
    values = lambda side, k: sorted({str(r.environment.get(k, "-")) for r in side if r.environment})  # noqa: E731
    keys = sorted({k for r in base + cand for k in r.environment if not k.startswith(FINGERPRINT)})
    return {k: (values(base, k), values(cand, k)) for k in keys
            if f"env.{k}" not in ignore and values(base, k) != values(cand, k)}


FINGERPRINT = "fingerprint_"


def fingerprint_diff(base: list[JobRecord], cand: list[JobRecord]) -> list[dict]:
    """Each GPU-fingerprint figure of both sides (the median over each side's runs), its change in %, the noise it
    is judged against (the larger side's spread, at least the figure's floor: fingerprint.FIGURES) and whether the
    change exceeds it."""
    def side(records: list[JobRecord], name: str) -> tuple[float, float] | None:
        found = [(float(r.environment[f"{FINGERPRINT}{name}"]), float(r.environment.get(f"{FINGERPRINT}{name}_spread_pct", 0)))
                 for r in records if f"{FINGERPRINT}{name}" in r.environment]
        if not found:
            return None
        return statistics.median(v for v, _ in found), max(spread for _, spread in found)

    from harness.measure.fingerprint import FIGURES

    rows = []
    for name, (unit, floor_pct) in FIGURES.items():
        a, b = side(base, name), side(cand, name)
        if a is None or b is None:
            continue
        change = 100 * (b[0] - a[0]) / a[0]
        noise = max(a[1], b[1], floor_pct)
        rows.append(dict(figure=name, unit=unit, baseline=a[0], candidate=b[0], change_pct=change, noise_pct=noise,
                         differs=abs(change) > noise))
    return rows


def as_markdown(baseline: Side, candidate: Side, pairs, unmatched, env: dict, threshold: float,
                prints: list[dict]) -> str:
    """`env`: environment_diff's; `prints`: fingerprint_diff's."""
    lines = [f"# compare {baseline.given} → {candidate.given}", ""]
    if env:
        lines += ["Environments differ: " + "; ".join(f"{k}: {', '.join(b)} → {', '.join(c)}" for k, (b, c) in env.items()), ""]
    if prints:
        differ = [p["figure"] for p in prints if p["differs"]]
        lines += ["GPU fingerprints (baseline → candidate): " + "; ".join(
            f"{p['figure']} {p['baseline']:.4g} → {p['candidate']:.4g} {p['unit']} ({p['change_pct']:+.1f}%, noise "
            f"±{p['noise_pct']:.1f}%)" for p in prints) + ". " + (
            f"They differ beyond their noise in {', '.join(differ)}: the two sides ran on machines that behave "
            "differently, and a change of that size may be the machine's." if differ else
            "Alike within their noise."), ""]
    lines += [f"Verdict threshold ±{100 * threshold:g}%, 95% bootstrap interval of candidate / baseline.", "",
              "| run | baseline ms | candidate ms | ratio | 95% interval | verdict |", "|---|---:|---:|---:|---|---|"]
    lines += [f"| {p.label} | {p.baseline_ms:.4f} | {p.candidate_ms:.4f} | {p.ratio:.4f} | {p.low:.4f}–{p.high:.4f} | "
              f"{p.verdict} |" for p in pairs]
    if unmatched:
        lines += ["", "Unmatched:"] + [f"- {side}: {label}: {why}" for side, label, why in unmatched]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, text: str, pairs, unmatched, env: dict, prints: list[dict]) -> list[Path]:
    from harness.analysis.report import ratio_plot  # matplotlib: only when writing

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.md").write_text(text)
    data = {"pairs": [asdict(p) for p in pairs], "environment_differs": {k: list(v) for k, v in env.items()},
            "unmatched": [dict(side=s, label=label, why=why) for s, label, why in unmatched],
            "gpu_fingerprints": list(prints)}
    (out_dir / "compare.json").write_text(json.dumps(data, indent=2))
    made = [out_dir / "compare.md", out_dir / "compare.json"]
    return made + ([ratio_plot(pairs, out_dir / "compare.png")] if pairs else [])


def parse_threshold(text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise ConfigError(f"--threshold {text} is invalid: give a fraction or a percentage, e.g. 3% or 0.03")
    return value


def run(uri: str, baseline: str, candidate: str, ignore: list[str], threshold: float, out_dir: Path | None) -> int:
    """Print the comparison, write and log its files (under ./outputs/compares/ unless told, made once both sides
    are read); 1 when any pair is slower beyond the threshold."""
    base, cand = load_side(uri, baseline), load_side(uri, candidate)
    out_dir = out_dir or results.default_dir("compares", cand.parent_run_id or Path(candidate).name)
    pairs, unmatched = compare(base.records, cand.records, ignore, threshold)
    env, prints = environment_diff(base.records, cand.records, ignore), fingerprint_diff(base.records, cand.records)
    text = as_markdown(base, cand, pairs, unmatched, env, threshold, prints)
    print(text)
    files = write(out_dir, text, pairs, unmatched, env, prints)
    where = f"wrote {', '.join(p.name for p in files)} in {out_dir}"
    if cand.parent_run_id:
        for path in files:
            tracking.client(uri).log_artifact(cand.parent_run_id, str(path), "compare")
        where += f"; logged under compare/ on run {cand.parent_run_id}"
    print(where)
    slower = [p.label for p in pairs if p.verdict == "slower"]
    if slower:
        print(f"{len(slower)} of {len(pairs)} runs slower beyond {100 * threshold:g}%: {', '.join(slower)}")
    return 1 if slower else 0
