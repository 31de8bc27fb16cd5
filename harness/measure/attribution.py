"""Where a decode step's time goes: a torch.profiler (CUPTI) pass over a few extra steps, run after
the timed ones so it never touches the timed numbers."""
from __future__ import annotations

import csv
import gzip
import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from harness.measure.timing import advance

TOP_KERNELS = 10


def profile_steps(stepper, steps: int, out_dir: Path | None) -> dict[str, float]:
    """Kernels per step, GPU busy against wall time, and, into out_dir, the top kernels
    (top_kernels.csv) and the Chrome/Perfetto trace (trace.json.gz) of `steps` decode tokens."""
    calls = max(1, steps // stepper.tokens_per_step)
    tokens = calls * stepper.tokens_per_step
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            advance(stepper)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and _is_kernel(e)]
    busy_ms = _union_ms([(k.time_range.start, k.time_range.end) for k in kernels])
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_top(kernels, tokens, out_dir / "top_kernels.csv")
        _write_trace(prof, out_dir / "trace.json.gz")
    per_token = len(kernels) / tokens
    return {
        "kernels_per_step": per_token,
        "gpu_busy_ms_per_step": busy_ms / tokens,
        "profiled_wall_ms_per_step": wall_ms / tokens,
        "profiled_gpu_idle_fraction": max(0.0, 1.0 - busy_ms / wall_ms),
        "mean_kernel_us": busy_ms * 1e3 / len(kernels) if kernels else 0.0,
    }


def _is_kernel(event) -> bool:
    name = event.name.lower()
    return not name.startswith(("memcpy", "memset", "cudagraph", "[memory]"))


def _union_ms(intervals_us: list[tuple[float, float]]) -> float:
    """Time with at least one kernel running (overlaps counted once), in ms."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals_us):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def _write_top(kernels, tokens: int, path: Path) -> None:
    by_name: dict[str, list[float]] = defaultdict(list)
    for k in kernels:
        by_name[k.name].append((k.time_range.end - k.time_range.start) / 1e3)
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "calls_per_step", "ms_per_step", "mean_us"])
        for name, times in rows:
            w.writerow([name[:200], len(times) / tokens, sum(times) / tokens, 1e3 * sum(times) / len(times)])


def _write_trace(prof, path: Path) -> None:
    plain = path.with_suffix("")  # trace.json
    prof.export_chrome_trace(str(plain))
    with open(plain, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


@contextmanager
def nvtx_range(name: str, enabled: bool):
    """A named range for Nsight Systems (`nsys profile`) to show the job's phases."""
    if enabled:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if enabled:
            torch.cuda.nvtx.range_pop()
