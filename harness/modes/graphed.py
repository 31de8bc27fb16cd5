from __future__ import annotations

import functools

import torch

from harness.modes.base import DecodeMode, forward_step

SIDE_STREAM_WARMUP = 3  # as the article: lazy init (cuBLAS workspace, kernels) must happen before capture


@functools.lru_cache(maxsize=None)
def side_stream(device_index: int) -> torch.cuda.Stream:
    """One warm-up stream per device for the whole process: every new stream gets its own cuBLAS
    workspace, which is never returned, so a fresh stream per job would leak memory job after job."""
    return torch.cuda.Stream(device=device_index)


def warm_up_on_side_stream(fn, steps: int = SIDE_STREAM_WARMUP) -> None:
    side = side_stream(torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(steps):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn, pool=None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, int]:
    """Capture fn into a graph; returns the graph, fn's output (a static buffer) and the bytes the
    capture added to the reserved pool (the graph's own memory)."""
    graph = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_reserved()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out, torch.cuda.memory_reserved() - before


class GraphedStepper:
    def __init__(self, graph: torch.cuda.CUDAGraph, input_ids: torch.Tensor, logits: torch.Tensor, graph_bytes: int):
        self.graph, self.input_ids, self.logits, self.graph_bytes = graph, input_ids, logits, graph_bytes

    def step(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


class GraphedMode(DecodeMode):
    """One decode step captured into a torch.cuda.CUDAGraph over static input/output buffers,
    replayed once per token: the article's section-6 method."""

    name = "graphed"
    needs_cuda = True

    def prepare(self, model, cache, input_ids):
        static_ids = input_ids.clone()
        step = functools.partial(forward_step, model, cache, static_ids)
        warm_up_on_side_stream(step)
        graph, logits, graph_bytes = capture(step)
        return GraphedStepper(graph, static_ids, logits, graph_bytes)
