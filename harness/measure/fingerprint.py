"""A GPU's fingerprint: a short calibration, once per process, of what the machine under a sweep does.

Two leases of the same GPU model are different GPUs, and one compiled config can measure several per cent apart:
a name and a driver version do not tell two machines apart, their behaviour does. Each figure is the median of
REPEATS measurements, with their spread (max - min, in % of the median) as its noise; `compare` says where two
sweeps' fingerprints differ beyond it (harness/analysis/compare.py).
"""
from __future__ import annotations

import functools
import statistics
import time

import torch

from harness.clock import cuda_event_ms
from harness.measure.gpu_state import nvml_handle
from harness.modes.graphed import warm_up_on_side_stream

REPEATS = 5
COPY_BYTES = 256 << 20  # a device-to-device copy this large runs at the memory's speed, not at the launch's
LAUNCHES = 1000  # back-to-back launches of an (almost) empty kernel, timed as one
GRAPH_KERNELS = 100  # kernels in the captured graph whose replay is timed
# Each figure (logged as tags `fingerprint_<figure>` and `fingerprint_<figure>_spread_pct`): its unit, and a floor a
# little above how far two processes on one machine were seen to move it (the docs' page on checks): compare calls a
# difference a machine's only beyond that floor, or beyond the spread measured, whichever is larger. The launch of
# a lone kernel is the host's figure (Python and the driver), and it moves the most.
FIGURES = {"copy_gb_per_s": ("GB/s", 5.0), "launch_us": ("µs", 75.0), "graph100_us": ("µs", 2.0),
           "sm_clock_under_load_mhz": ("MHz", 2.0)}


@functools.lru_cache(maxsize=8)
def fingerprint(index: int) -> dict[str, str]:
    """The fingerprint of CUDA device `index`, as environment tags (strings, as tags are)."""
    device = torch.device("cuda", index)
    with torch.cuda.device(device):
        samples = {"copy_gb_per_s": _copy_gb_per_s(device), "launch_us": _launch_us(device),
                   "graph100_us": _graph_us(device), "sm_clock_under_load_mhz": _sm_clock_under_load(device)}
    tags = {}
    for name, values in samples.items():
        if not values:  # the clock needs NVML (nvidia-ml-py)
            continue
        median = statistics.median(values)
        tags[f"fingerprint_{name}"] = f"{median:.4g}"
        tags[f"fingerprint_{name}_spread_pct"] = f"{100 * (max(values) - min(values)) / median:.2f}"
    return tags


def _copy_gb_per_s(device: torch.device) -> list[float]:
    """Device-to-device copy: bytes read plus bytes written, per second."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):  # warm: the first copies of a fresh process run slower
        dst.copy_(src)
    return [2 * COPY_BYTES / (ms / 1e3) / 1e9 for ms in cuda_event_ms(lambda: dst.copy_(src), REPEATS)]


def _launch_us(device: torch.device) -> list[float]:
    """An (almost) empty kernel launched back to back: the time of one, launch included."""
    x = torch.zeros(1, device=device)
    x.add_(1)

    def launches() -> None:
        for _ in range(LAUNCHES):
            x.add_(1)

    return [ms * 1e3 / LAUNCHES for ms in cuda_event_ms(launches, REPEATS)]


def _graph_us(device: torch.device) -> list[float]:
    """A CUDA graph of GRAPH_KERNELS such kernels, replayed: one replay's time."""
    x = torch.zeros(1, device=device)
    warm_up_on_side_stream(lambda: x.add_(1), steps=1)  # as capture wants (the process's one side stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_KERNELS):
            x.add_(1)
    graph.replay()
    replays = 20

    def replay() -> None:
        for _ in range(replays):
            graph.replay()

    return [ms * 1e3 / replays for ms in cuda_event_ms(replay, REPEATS)]


def _sm_clock_under_load(device: torch.device) -> list[float]:
    """The SM clock NVML reads while matmuls keep the GPU busy (its boost under load, which power and
    temperature limits move from one board to the next)."""
    handle = nvml_handle(device)
    if handle is None:
        return []
    import pynvml

    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    readings = []
    for _ in range(REPEATS):
        for _ in range(40):  # about 0.1 s of work queued, the host free to read the clock meanwhile
            a @ a
        time.sleep(0.02)
        readings.append(float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)))
        torch.cuda.synchronize(device)
    return readings
