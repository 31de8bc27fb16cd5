from __future__ import annotations

import torch

from harness.modes.base import DecodeMode, forward_step

SIDE_STREAM_WARMUP = 3  # as the article: lazy init (cuBLAS workspace, kernels) must happen before capture


class GraphedStepper:
    def __init__(self, graph: torch.cuda.CUDAGraph, input_ids: torch.Tensor, logits: torch.Tensor):
        self.graph, self.input_ids, self.logits = graph, input_ids, logits

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
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(SIDE_STREAM_WARMUP):
                forward_step(model, cache, static_ids)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = forward_step(model, cache, static_ids)
        return GraphedStepper(graph, static_ids, logits)
