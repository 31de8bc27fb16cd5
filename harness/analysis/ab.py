"""`harness ab "KEY=A ..." "KEY=B ..."`: is B faster than A, on this GPU, now?

Both arms are timed in one process (measure/ab.py), in alternating blocks (or so in each of several processes);
the ratio B / A gets a paired hierarchical bootstrap interval and a verdict at a threshold t: `slower` when the whole interval lies above 1 + t,
`faster` when below 1 - t, `same` when it lies within 1 ± t, and `ambiguous` when it straddles a bound (more
pairs would tell). The result is printed, written as ab.md and ab.json, and logged to MLflow as a run of its own
(kind `ab`), like `compare`'s files.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.config.labels import run_label
from harness.config.schema import RunConfig, identity
from harness.measure.ab import Arm, time_arms_in_processes
from harness.measure.stats import paired_ratio_interval
from harness.modes.compiled import COMPILED_EARLIER
from harness.progress import say
from harness.record import flatten
from harness.store import results, tracking
from harness.store.redact import redact


@dataclass
class AbResult:
    arm_a: str
    arm_b: str
    differs: dict  # key -> [A's value, B's value]
    median_a_ms: float
    median_b_ms: float
    ratio: float  # B / A
    low: float
    high: float
    threshold: float
    verdict: str
    pairs: int
    environment: dict
    block_spread_a_pct: float  # how far each arm's block medians scatter (sd, % of their median): the noisier arm
    block_spread_b_pct: float  # is what widens the interval
    pairs_to_decide: int | None  # where ambiguous in one process: about how many pairs would decide it (None: it
    # sits on a bound)
    processes: int = 1  # fresh processes the A/B ran in, one after another (`pairs` counts every process's)
    prepare_s: tuple[float, float] = (0.0, 0.0)  # each arm's preparation (a compile, a capture), every process's
    prepared: tuple[list, list] = ([], [])  # each compiled arm's compile cache use, a line per process
    process_ratios: list = dataclasses.field(default_factory=list)  # B's median over A's, in each process
    fresh_compiles: bool = False  # each process compiled into empty cache folders of its own
    processes_to_decide: int | None = None  # where ambiguous across processes: about how many would decide it
    # the slot of each arm's first timed step, every block's (timing.window_problem): `warmup` steps after the
    # context, whatever graph_steps, so that arms that differ in graph_steps time the same positions
    first_timed_position: tuple[int | None, int | None] = (None, None)


def verdict(low: float, high: float, threshold: float) -> str:
    if low > 1 + threshold:
        return "slower"
    if high < 1 - threshold:
        return "faster"
    if low >= 1 - threshold and high <= 1 + threshold:
        return "same"
    return "ambiguous"


def differing_keys(cfg_a: RunConfig, cfg_b: RunConfig) -> dict[str, list]:
    """The keys the arms differ in (what the A/B measures), as [A's, B's]: a value at its default is absent from an
    arm's identity, and shown as the value it has (`fused.pdl: False → True`, not `→ None`)."""
    plain_a, plain_b = _plain(cfg_a), _plain(cfg_b)
    a, b = identity(plain_a), identity(plain_b)
    full_a, full_b = flatten(plain_a), flatten(plain_b)
    return {k: [full_a.get(k, a.get(k)), full_b.get(k, b.get(k))] for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)}


def arm_label(cfg: RunConfig, differs: dict) -> str:
    """An arm's run name, led by the keys the arms differ in (`dtype=fp32 tiny bs=1 ...`), as a sweep's runs are."""
    # a model's architecture keys differ with its name: the name says them
    return run_label(flatten(_plain(cfg)), [k for k in differs if k == "model.name" or not k.startswith("model.")])


def _plain(cfg: RunConfig) -> dict:
    """The config as the plain data a record holds (enums as their values)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=lambda v: getattr(v, "value", str(v))))


def pairs_to_decide(ratio: float, low: float, high: float, threshold: float, pairs: int) -> int | None:
    """About how many pairs an ambiguous A/B needs: the interval narrows as 1/sqrt(pairs), and its side toward the
    bound it straddles (1 ± threshold, the nearer to the ratio) must shrink to the ratio's distance from that bound.
    None where the ratio sits on the bound: no number of pairs decides it."""
    bound = min((1 - threshold, 1 + threshold), key=lambda b: abs(ratio - b))
    distance, side = abs(ratio - bound), (high - ratio if bound > ratio else ratio - low)
    return math.ceil(pairs * (side / distance) ** 2) if distance > 0 else None


def block_spread_pct(blocks: list[list[float]]) -> float:
    medians = np.array([np.median(b) for b in blocks])
    return float(100 * medians.std() / np.median(medians))


def process_ratios(blocks_a: list[list[float]], blocks_b: list[list[float]], owners: list[int]) -> list[float]:
    """B's median step over A's, in each process, in the order they ran: where each process compiled afresh, how
    far apart these lie is what a compile's picks move the answer by."""
    ratios = []
    for process in dict.fromkeys(owners):
        mine = [i for i, owner in enumerate(owners) if owner == process]
        a, b = (np.concatenate([blocks[i] for i in mine]) for blocks in (blocks_a, blocks_b))
        ratios.append(float(np.median(b) / np.median(a)))
    return ratios


def result_of(arm_a: Arm, arm_b: Arm, environment: dict, threshold: float, owners: list[int] | None = None,
              fresh_compiles: bool = False) -> AbResult:
    """`owners`: the process each pair ran in, where the A/B ran in several."""
    blocks_a, blocks_b = ([t.step_ms for t in arm.blocks] for arm in (arm_a, arm_b))
    owners = owners or [0] * len(blocks_a)
    ratio, low, high = paired_ratio_interval(blocks_a, blocks_b, processes=owners)
    decided, processes = verdict(low, high, threshold), len(set(owners))
    # where ambiguous: more pairs narrow one process's interval; where processes are drawn first, more processes
    ambiguous = decided == "ambiguous"
    more_pairs = pairs_to_decide(ratio, low, high, threshold, len(blocks_a)) if ambiguous and processes == 1 else None
    more_processes = pairs_to_decide(ratio, low, high, threshold, processes) if ambiguous and processes > 1 else None
    differs = differing_keys(arm_a.cfg, arm_b.cfg)
    return AbResult(arm_label(arm_a.cfg, differs), arm_label(arm_b.cfg, differs), differs,
                    float(np.median(np.concatenate(blocks_a))), float(np.median(np.concatenate(blocks_b))),
                    ratio, low, high, threshold, decided, len(blocks_a), environment,
                    block_spread_pct(blocks_a), block_spread_pct(blocks_b), more_pairs, processes,
                    (arm_a.prepare_ms / 1e3, arm_b.prepare_ms / 1e3), (arm_a.prepared, arm_b.prepared),
                    process_ratios(blocks_a, blocks_b, owners), fresh_compiles, more_processes,
                    tuple(arm.blocks[0].first_position if arm.blocks else None for arm in (arm_a, arm_b)))


def markdown(r: AbResult) -> str:
    changed = ", ".join(f"{k}: {a} → {b}" for k, (a, b) in r.differs.items()) or "nothing (identical arms)"
    return "\n".join([
        "# A/B, paired in one process" if r.processes == 1 else f"# A/B, paired in each of {r.processes} processes", "",
        f"- A: {r.arm_a}, median {r.median_a_ms:.4f} ms/step",
        f"- B: {r.arm_b}, median {r.median_b_ms:.4f} ms/step",
        f"- B differs in: {changed}",
        f"- B / A = {r.ratio:.4f} (95% interval {r.low:.4f}-{r.high:.4f}, {r.pairs} pairs of blocks, balanced order)",
        f"- verdict at ±{100 * r.threshold:g}%: **{r.verdict}**" + _undecided(r),
        *([f"- B / A in each process{' (each compiled afresh)' * r.fresh_compiles}: "
           + ", ".join(f"{ratio:.4f}" for ratio in r.process_ratios)] if r.processes > 1 else []),
        f"- block medians scatter by {r.block_spread_a_pct:.2f}% (A) and {r.block_spread_b_pct:.2f}% (B), sd of "
        "their median: the noisier arm is what widens the interval",
        *_preparation(r),
        *([f"- every block timed from slot {r.first_timed_position[0]} (A) and {r.first_timed_position[1]} (B): "
           "`warmup` steps after the context, whatever graph_steps"] if None not in r.first_timed_position else []),
        f"- on {r.environment.get('gpu_name') or r.environment.get('device')} "
        f"{r.environment.get('gpu_uuid', '')}, torch {r.environment.get('torch')}",
        "- neither arm is verified here: run each as a job (`python -m harness KEY=...`) for its checks", ""])


def _preparation(r: AbResult) -> list[str]:
    """How each arm was prepared: seconds, and for a compiled arm whether its kernels were compiled here or read
    from the compile cache (two machines' A/Bs of one compiled config ran the same kernels only where read)."""
    how = [f"; {'; '.join(lines)}" if lines else "" for lines in r.prepared]
    lines = [f"- prepared in {r.prepare_s[0]:.1f} s (A{how[0]}) and {r.prepare_s[1]:.1f} s (B{how[1]})"]
    reused = [COMPILED_EARLIER in arm for arm in r.prepared]
    if reused[1] and not reused[0]:
        # on the H200 (torch 2.11), a regional arm ran the whole-model arm's code this way and the A/B said `same`
        lines.append("- **B compiled nothing: it ran a step compiled earlier in its process, which is A's where the arms "
                     "share a compile; where they differ in what a step computes, this A/B timed one step twice**")
    return lines


def _undecided(r: AbResult) -> str:
    if r.verdict != "ambiguous":
        return ""
    if r.processes > 1:  # the interval draws processes first: their differences, not the pairs', widen it
        if r.processes_to_decide is None:
            return " (the ratio sits on the threshold: more processes cannot decide it)"
        return (f" (about {r.processes_to_decide} processes would decide it, at this spread between them: "
                f"`--processes {r.processes_to_decide}`)")
    if r.pairs_to_decide is None:
        return " (the ratio sits on the threshold: more pairs cannot decide it)"
    return f" (about {r.pairs_to_decide} pairs would decide it, at this spread: `--pairs {r.pairs_to_decide}`)"


def run(uri: str, experiment: str, cfg_a: RunConfig, cfg_b: RunConfig, pairs: int, threshold: float,
        out_dir: Path | None, processes: int = 1, fresh_compiles: bool = False) -> int:
    """Time, print, write, log. Exit status: 1 when B is slower (a gate, as `compare`), else 0."""
    arm_a, arm_b, environment, owners = time_arms_in_processes(cfg_a, cfg_b, pairs, processes,
                                                               lambda phase: say(f"ab: {phase}"), fresh_compiles)
    result = result_of(arm_a, arm_b, environment, threshold, owners, fresh_compiles)
    text = markdown(result)
    print(text)
    out_dir = out_dir or results.default_dir("ab", "ab")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ab.md").write_text(text)
    (out_dir / "ab.json").write_text(json.dumps({**asdict(result), "blocks_a_ms": [b.step_ms for b in arm_a.blocks],
                                                 "blocks_b_ms": [b.step_ms for b in arm_b.blocks]}, indent=1))
    try:
        run_id = tracking.log_ab(uri, experiment, f"ab {result.arm_a} vs {result.arm_b}", asdict(result),
                                 [out_dir / "ab.md", out_dir / "ab.json"])
        print(f"wrote ab.md, ab.json in {out_dir}; logged as run {run_id}")
    except Exception as err:  # noqa: BLE001 - the files hold the result; the store is a convenience
        say(f"warning: could not log the A/B to {redact(uri)} ({type(err).__name__}); its files are in {out_dir}")
    return 1 if result.verdict == "slower" else 0
