"""Statistics of a job's timed blocks: per-step figures, block medians, and a bootstrap interval.

A job times `repeats` blocks, each after a fresh prefill and warm-up. Steps within a block are not
independent (clocks, caches and the host drift together), so the interval resamples blocks, then steps
within each drawn block (a two-level bootstrap), and reads the 2.5th and 97.5th percentiles of the
median. With one block it falls back to resampling steps.
"""
from __future__ import annotations

import statistics

import numpy as np

from harness.measure.timing import DecodeTiming

BOOTSTRAP_SAMPLES = 2000
NOISY_PCT = 2.0  # a run whose interval is wider than ±2% of its median is tagged `noisy`


def step_stats(step_ms: list[float]) -> dict[str, float]:
    arr = np.asarray(step_ms, dtype=np.float64)
    mean = float(arr.mean())
    stdev = statistics.stdev(step_ms) if len(step_ms) > 1 else 0.0
    return {
        "mean": mean,
        "median": float(np.median(arr)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "stdev": stdev,
        "cv": stdev / mean if mean > 0 else 0.0,
    }


def bootstrap_medians(blocks: list[list[float]], seed: int = 0) -> np.ndarray:
    """BOOTSTRAP_SAMPLES medians of the step time, each of blocks drawn with replacement, then of steps
    drawn with replacement within each drawn block (the two-level bootstrap)."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(b, dtype=np.float64) for b in blocks]
    medians = np.empty(BOOTSTRAP_SAMPLES)
    for i in range(BOOTSTRAP_SAMPLES):
        medians[i] = _resampled_median(rng, arrays, rng.integers(len(arrays), size=len(arrays)))
    return medians


def _resampled_median(rng: np.random.Generator, arrays: list[np.ndarray], drawn: np.ndarray) -> float:
    """The median of the drawn blocks, each one's steps drawn with replacement."""
    return float(np.median(np.concatenate([rng.choice(arrays[j], size=arrays[j].size) for j in drawn])))


def paired_ratio_interval(blocks_a: list[list[float]], blocks_b: list[list[float]], seed: int = 0,
                          samples: int = BOOTSTRAP_SAMPLES, processes: list[int] | None = None
                          ) -> tuple[float, float, float]:
    """B's median step time over A's, and its 95% interval from a hierarchical bootstrap that keeps the pairing:
    pairs of blocks (block i of A and of B ran back to back) are drawn with replacement, then the steps within each
    drawn block. `processes`: the process each pair ran in, where the A/B ran in several; then processes are drawn
    first, then pairs within each (what differs between processes, a compile's choices, a clock, widens the
    interval as it should). Returns (ratio, low, high)."""
    if len(blocks_a) != len(blocks_b):
        raise ValueError(f"paired blocks: {len(blocks_a)} of A against {len(blocks_b)} of B")
    a = [np.asarray(b, dtype=np.float64) for b in blocks_a]
    b = [np.asarray(x, dtype=np.float64) for x in blocks_b]
    ids = np.asarray(processes if processes is not None else [0] * len(a))
    groups = [np.flatnonzero(ids == p) for p in np.unique(ids)]
    rng = np.random.default_rng(seed)
    ratios = np.empty(samples)
    for i in range(samples):
        drawn = _draw_pairs(rng, groups)  # the same pairs for both arms
        ratios[i] = _resampled_median(rng, b, drawn) / _resampled_median(rng, a, drawn)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(np.median(np.concatenate(b)) / np.median(np.concatenate(a))), float(low), float(high)


def _draw_pairs(rng: np.random.Generator, groups: list[np.ndarray]) -> np.ndarray:
    """Pairs drawn with replacement: within one process, from all; across several, processes first."""
    if len(groups) == 1:
        return rng.integers(groups[0].size, size=groups[0].size)
    drawn = rng.integers(len(groups), size=len(groups))
    return np.concatenate([rng.choice(groups[g], size=groups[g].size) for g in drawn])


def paired_mean_interval(deltas: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of the mean of paired per-step deltas (run - reference at each step: the steps
    are drawn with replacement, each keeping its pair)."""
    rng = np.random.default_rng(seed)
    means = deltas[rng.integers(len(deltas), size=(BOOTSTRAP_SAMPLES, len(deltas)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def half_width_pct(median: float, low: float, high: float) -> float:
    """An interval's wider side from the median, in % of the median."""
    return 100.0 * max(median - low, high - median) / median


def median_interval(blocks: list[list[float]], seed: int = 0) -> tuple[float, float]:
    """The two-level bootstrap 95% interval of the median step time."""
    low, high = np.percentile(bootstrap_medians(blocks, seed), [2.5, 97.5])
    return float(low), float(high)


MIN_BLOCKS = 2  # the interval rule waits for two blocks: one block's interval cannot see drift between blocks


def ci_pct(blocks: list[list[float]]) -> float:
    """The half-width of the median's 95% interval (two-level bootstrap), in % of the median: its wider side."""
    median = float(np.median(np.concatenate([np.asarray(b, dtype=np.float64) for b in blocks])))
    return half_width_pct(median, *median_interval(blocks))


# A block cut to the time budget still decodes this many steps: the lockstep's VERIFY_TOKENS, and a median of 32
# GPU-bound steps (the slow ones a cut applies to vary by 0.1-0.2% a step on the H200) resolves what ±0.5% asks
MIN_BLOCK_STEPS = 32


def block_steps(cfg, pace_ms: float | None, at_least: int = MIN_BLOCK_STEPS,
                reference_steps: int | None = None) -> tuple[int, str | None]:
    """Steps each timed block decodes, and why they are fewer than decode_tokens (else None). Under stop=adaptive,
    where the warm-up's pace (ms a step, timing.warm_up) says a block of decode_tokens would alone pass time_budget_s
    (a GPU-bound step of 40 ms and more: long context in a masked kernel, a large MoE), a block decodes what the
    budget holds, and at least MIN_BLOCK_STEPS and `at_least` (the steps the checks compare against the loop's own).
    The loop's tokens, every one of which is checked, are the fewer with it.
    `reference_steps`: the block of an earlier job of this shape whose loop is kept as a reference (plain eager's,
    cut to its slower pace). Under stop=adaptive a longer block is cut to it, whole calls and no fewer steps than the
    rules above ask, so that the kept loop serves this run's token check as it is; a longer block would have the
    check decode eager again over all of its steps, at eager's pace, to check the steps the kept loop lacks."""
    steps, why = _budget_steps(cfg, pace_ms, at_least)
    k = max(1, cfg.graph_steps)
    if (cfg.stop == "adaptive" and reference_steps is not None and reference_steps % k == 0
            and max(MIN_BLOCK_STEPS, at_least) <= reference_steps < steps):
        return reference_steps, (f"{reference_steps} steps a block, not {steps}: as many as the loop of an earlier "
                                 f"job of this shape decoded, whose logits serve as this run's reference")
    return steps, why


def _budget_steps(cfg, pace_ms: float | None, at_least: int) -> tuple[int, str | None]:
    if cfg.stop != "adaptive" or not pace_ms:
        return cfg.decode_tokens, None
    fit = int(cfg.time_budget_s * 1e3 / pace_ms)
    k = max(1, cfg.graph_steps)
    steps = -(-max(fit, MIN_BLOCK_STEPS, at_least) // k) * k  # whole calls of a K-step graph
    if steps >= cfg.decode_tokens:
        return cfg.decode_tokens, None
    return steps, (f"{steps} steps a block, not decode_tokens={cfg.decode_tokens}: at the warm-up's "
                   f"{pace_ms:.1f} ms a step, time_budget_s={cfg.time_budget_s:g} holds {fit}")


def stop_reason(cfg, blocks: list[list[float]], spent_s: float, next_block_s: float) -> str | None:
    """Why timing stops after these blocks (the run's `stopped_by` tag), or None to time another. `spent_s`: the
    job's timed decode so far, each block with its rewind and warm-up; `next_block_s`: what one more would add."""
    n = len(blocks)
    if n >= cfg.repeats:
        return f"repeats: {n} block{'s' * (n > 1)} (repeats={cfg.repeats})"
    if cfg.stop == "repeats":
        return None
    if n >= MIN_BLOCKS and (pct := ci_pct(blocks)) <= cfg.target_ci_pct:
        return f"interval: ±{pct:.2f}% after {n} blocks, within target_ci_pct={cfg.target_ci_pct:g}"
    if spent_s + next_block_s > cfg.time_budget_s:
        return (f"time budget: a block more would take the timed decode from {spent_s:.1f} s to about "
                f"{spent_s + next_block_s:.1f} s, past time_budget_s={cfg.time_budget_s:g}")
    return None


def decode_metrics(blocks: list[DecodeTiming], bs: int) -> dict[str, float]:
    """Everything derived from the timed blocks, as flat metric names."""
    steps = [ms for b in blocks for ms in b.step_ms]
    stats = step_stats(steps)
    low, high = median_interval([b.step_ms for b in blocks])
    # a step decodes one token of every row: times are per step; tokens/s counts every row
    wall_ms, n_steps = sum(b.wall_ms for b in blocks), sum(b.n_tokens for b in blocks)
    wall_per_step = wall_ms / n_steps
    metrics = {f"step_ms_{k}": v for k, v in stats.items()}
    metrics.update({f"block_{i}_step_ms_median": float(np.median(b.step_ms)) for i, b in enumerate(blocks)})
    metrics.update(
        step_ms_ci_low=low, step_ms_ci_high=high,
        step_ms_ci_pct=half_width_pct(stats["median"], low, high),
        wall_ms_per_step=wall_per_step,
        tokens_per_s=bs * 1000.0 / stats["median"],
        tokens_per_s_wall=bs * 1000.0 / wall_per_step,
        # the host's time outside the timed GPU work, per step: feeding and, for graphs, the replay's
        # launch. Eager launches inside its events (the GPU waits for the host), so there this is not
        # eager's host cost; the gap between eager's step time and graphed's is.
        wall_minus_gpu_ms_per_step=wall_per_step - sum(ms * b.tokens_per_call for b in blocks for ms in b.step_ms)
        / n_steps,
        decode_wall_ms=wall_ms,
        repeats=float(len(blocks)),
        timed_over_wall_max=max(timed_over_wall(b) for b in blocks),
    )
    if blocks[0].first_position is not None:  # the slot of the first timed step's token (timing.to_the_window)
        metrics["first_timed_position"] = float(blocks[0].first_position)
    return metrics


# The timed calls of a block lie inside its wall clock (events recorded after the block's start, one sync at its
# end), so their sum can pass the wall only by the clocks' resolution; 1% leaves room for that and nothing else.
TIMED_OVER_WALL_LIMIT = 1.01


def timed_over_wall(block: DecodeTiming) -> float:
    """The block's timed ms (each call's per-token time x the tokens of a call, summed) over its wall ms."""
    return sum(ms * block.tokens_per_call for ms in block.step_ms) / block.wall_ms


def clock_failure(metrics: dict[str, float]) -> str | None:
    """A run whose timed calls add up to more than the wall clock around them measured with a wrong clock (a
    unit, the tokens of a call, events on another stream): its step times cannot be trusted."""
    ratio = metrics["timed_over_wall_max"]
    if ratio <= TIMED_OVER_WALL_LIMIT:
        return None
    return (f"the timed calls of a block add up to {ratio:.3f}x the block's wall clock (at most "
            f"{TIMED_OVER_WALL_LIMIT} can be right): the step times are not what the GPU did")


def is_noisy(metrics: dict[str, float]) -> bool:
    return metrics.get("step_ms_ci_pct", 0.0) > NOISY_PCT
