"""The timed decode loop and its statistics: the only place the harness takes time.

On CUDA every step's forward is bracketed by a pair of CUDA events recorded on the stream,
and the whole loop by the host clock; the host waits for the GPU once, after the last step.
On CPU, execution is synchronous and each step is timed by the host clock.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from harness.modes import Stepper


@dataclass
class DecodeTiming:
    step_ms: list[float]  # per-step forward time: CUDA events on GPU, host clock on CPU
    wall_ms: float  # the whole loop on the host clock, argmax and feeding included
    clock: str  # "cuda_event" | "host"

    @property
    def steps(self) -> int:
        return len(self.step_ms)


def feed_argmax(stepper: Stepper, logits: torch.Tensor) -> None:
    """Greedy decoding: the next step reads the argmax, written in place (no host sync)."""
    stepper.input_ids.copy_(logits.argmax(dim=-1, keepdim=True))


def run_steps(stepper: Stepper, n: int) -> None:
    for _ in range(n):
        feed_argmax(stepper, stepper.step())


def timed_decode(stepper: Stepper, n: int, device: torch.device) -> DecodeTiming:
    if device.type == "cuda":
        return _timed_cuda(stepper, n)
    return _timed_host(stepper, n)


def _timed_cuda(stepper: Stepper, n: int) -> DecodeTiming:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for start, end in zip(starts, ends):
        start.record()
        logits = stepper.step()
        end.record()
        feed_argmax(stepper, logits)
    torch.cuda.synchronize()  # the loop's one and only sync
    wall_ms = (time.perf_counter() - t0) * 1e3
    return DecodeTiming([s.elapsed_time(e) for s, e in zip(starts, ends)], wall_ms, "cuda_event")


def _timed_host(stepper: Stepper, n: int) -> DecodeTiming:
    step_ms = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        logits = stepper.step()
        step_ms.append((time.perf_counter() - s) * 1e3)
        feed_argmax(stepper, logits)
    return DecodeTiming(step_ms, (time.perf_counter() - t0) * 1e3, "host")


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
    wall_per_token = timing.wall_ms / timing.steps
    metrics = {f"step_ms_{k}": v for k, v in stats.items()}
    metrics.update(
        wall_ms_per_token=wall_per_token,
        tokens_per_s=bs * 1000.0 / stats["median"],
        tokens_per_s_wall=bs * 1000.0 / wall_per_token,
        cpu_overhead_ms_per_token=wall_per_token - sum(timing.step_ms) / timing.steps,
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
