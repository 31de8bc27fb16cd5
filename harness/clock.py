"""The clocks every layer shares: CUDA events around back-to-back calls (the host waits once, at the end), a
stopwatch for untimed phases, and the device a config names. No harness import: modes and measurement use it."""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable

import torch

MiB = 1024 * 1024


def resolve_device(name: str) -> torch.device:
    """`auto` is cuda when a GPU is visible, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_index(device: torch.device) -> int:
    """The CUDA index a device names, `cuda` alone being the current one."""
    return device.index if device.index is not None else torch.cuda.current_device()


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


def block_ms(fn: Callable[[], object], calls: int) -> float:
    """Mean CUDA-event time of one call over `calls` back-to-back calls of fn between one pair of events (a
    benchmark's block: no event per call; the host waits once, at the end)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def median_call_ms(fn: Callable[[], object], calls: int) -> float:
    """Median CUDA-event time of `calls` back-to-back calls of fn (a side measurement, not the run's)."""
    return statistics.median(cuda_event_ms(fn, calls))


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
