"""The timed decode loop and its statistics: the only place the harness takes time.

On CUDA every step's forward is bracketed by a pair of CUDA events recorded on the stream,
and the whole loop by the host clock; the host waits for the GPU once, after the last step.
On CPU, execution is synchronous and each step is timed by the host clock.
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    from harness.modes.base import Stepper

MiB = 1024 * 1024


@dataclass
class DecodeTiming:
    step_ms: list[float]  # per-token forward time: CUDA events on GPU, host clock on CPU
    wall_ms: float  # the whole loop on the host clock, argmax and feeding included
    clock: str  # "cuda_event" | "host"

    @property
    def tokens(self) -> int:
        return len(self.step_ms)


def feed_argmax(stepper: Stepper, logits: torch.Tensor) -> None:
    """Greedy decoding: the next step reads the argmax, written in place (no host sync)."""
    stepper.input_ids.copy_(logits.argmax(dim=-1, keepdim=True))


def advance(stepper: Stepper) -> torch.Tensor:
    """One call of the stepper with greedy feedback (unless its graph feeds itself)."""
    logits = stepper.step()
    if not stepper.feeds_itself:
        feed_argmax(stepper, logits)
    return logits


def calls_for(stepper: Stepper, tokens: int) -> int:
    return math.ceil(tokens / stepper.tokens_per_step)


def run_steps(stepper: Stepper, tokens: int) -> None:
    for _ in range(calls_for(stepper, tokens)):
        advance(stepper)


def timed_decode(stepper: Stepper, tokens: int, device: torch.device) -> DecodeTiming:
    calls, per_call = calls_for(stepper, tokens), stepper.tokens_per_step
    call_ms, wall_ms, clock = (_timed_cuda if device.type == "cuda" else _timed_host)(stepper, calls)
    step_ms = [ms / per_call for ms in call_ms for _ in range(per_call)]  # a K-step call: K tokens
    return DecodeTiming(step_ms, wall_ms, clock)


def _timed_cuda(stepper: Stepper, calls: int) -> tuple[list[float], float, str]:
    feed = None if stepper.feeds_itself else (lambda logits: feed_argmax(stepper, logits))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call_ms = cuda_event_ms(stepper.step, calls, after=feed)  # the loop's one and only sync is at its end
    return call_ms, (time.perf_counter() - t0) * 1e3, "cuda_event"


def _timed_host(stepper: Stepper, calls: int) -> tuple[list[float], float, str]:
    call_ms = []
    t0 = time.perf_counter()
    for _ in range(calls):
        s = time.perf_counter()
        logits = stepper.step()
        call_ms.append((time.perf_counter() - s) * 1e3)
        if not stepper.feeds_itself:
            feed_argmax(stepper, logits)
    return call_ms, (time.perf_counter() - t0) * 1e3, "host"


def cuda_event_ms(fn: Callable[[], object], calls: int, after: Callable[[object], None] | None = None) -> list[float]:
    """CUDA-event time of each of `calls` back-to-back calls of fn; `after(output)` runs between calls,
    outside the events. The host waits for the device once, after the last call."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for start, end in zip(starts, ends):
        start.record()
        out = fn()
        end.record()
        if after is not None:
            after(out)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def median_call_ms(fn: Callable[[], object], calls: int) -> float:
    """Median CUDA-event time of `calls` back-to-back calls of fn (a side measurement, not the run's)."""
    return statistics.median(cuda_event_ms(fn, calls))


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


def decode_metrics(timing: DecodeTiming, bs: int) -> dict[str, float]:
    """Everything derived from one timed loop, as flat metric names."""
    stats = step_stats(timing.step_ms)
    wall_per_token = timing.wall_ms / timing.tokens
    metrics = {f"step_ms_{k}": v for k, v in stats.items()}
    metrics.update(
        wall_ms_per_token=wall_per_token,
        tokens_per_s=bs * 1000.0 / stats["median"],
        tokens_per_s_wall=bs * 1000.0 / wall_per_token,
        cpu_overhead_ms_per_token=wall_per_token - sum(timing.step_ms) / timing.tokens,
        decode_wall_ms=timing.wall_ms,
    )
    return metrics


@contextmanager
def stopwatch(device: torch.device, out: dict[str, float], key: str):
    """Time a phase outside the timed loop (prefill, capture, ...), waiting for the device at both ends."""
    _sync(device)
    start = time.perf_counter()
    yield
    _sync(device)
    out[key] = (time.perf_counter() - start) * 1e3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
