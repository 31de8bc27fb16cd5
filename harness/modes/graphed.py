from __future__ import annotations

import functools
import time

import torch

from harness.modes import kept_context
from harness.modes.base import CaptureError, DecodeMode, Stepper

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
    capture added to the reserved memory (the graph's own pool, or its growth of a shared one). The
    capture runs on the warm-up stream, whose cuBLAS workspace the warm-up already allocated: so the
    bytes are the graph's alone, not a workspace that every job's first capture would otherwise pay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side_stream(torch.cuda.current_device())):
        before = torch.cuda.memory_reserved()  # read inside: entering the capture empties the cache first
        out = fn()
    return graph, out, torch.cuda.memory_reserved() - before


class GraphedStepper(Stepper):
    """`graph_steps` decode steps in one graph. With one step the host feeds the argmax back, as in
    the article; with more, argmax and feeding are captured too, so a token costs no host work."""

    def __init__(self, model, prompt, cache_len, graph_steps: int = 1, rows: int | None = None, prefill: bool = False):
        super().__init__(model, prompt, cache_len, rows, prefill=prefill)
        self.tokens_per_step, self.feeds_itself = graph_steps, graph_steps > 1
        if self.feeds_itself:
            self.tokens = torch.zeros(graph_steps, self.bs, dtype=torch.long, device=prompt.device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def capture(self, prompt: torch.Tensor, pool=None) -> GraphedStepper:
        """Warm up on the side stream and capture. Values don't matter to a capture, only addresses: the
        cache may be empty, and is left for the caller to prefill."""
        fn = self._k_steps if self.feeds_itself else super().step
        start = time.perf_counter()
        warm_up_on_side_stream(self.from_one_position(fn))
        try:
            self.graph, self.logits, self.graph_bytes = capture(fn, pool)
        except RuntimeError as err:  # e.g. a mixture of experts whose routing asks the host how many tokens
            raise CaptureError(f"this model's decode step cannot be captured in a CUDA graph: "
                               f"{str(err).strip().splitlines()[0][:300]} (an op in it syncs with the host)") from err
        torch.cuda.synchronize()
        self.metrics["capture_ms"] = (time.perf_counter() - start) * 1e3  # side-stream warm-up + capture
        return self

    def release(self) -> None:
        super().release()
        self.graph = None  # its private pool goes back to the allocator

    def from_one_position(self, fn):
        """fn, each call of it from one cache position: the cache's now (a kept context's end, or 0 before a
        prefill), or as late as leaves a call's graph_steps slots inside the cache. A capture's warm-up calls fn
        SIDE_STREAM_WARMUP times, and calls that went on from one another would write that many replays' K/V after
        a kept context: past a cache sized for the context, the warm-up and the decode (Qwen3-0.6B at context 1024,
        cache 1280, graph_steps=127: slots 1024 to 1404, which mode=fused's kernels append to unchecked, over the
        next head's slots and past the tensor). A cache holds the context, the warm-up and a replay at least
        (RunConfig.timed_slots), so the calls write after the context, not over it."""
        first = self.cache.layers[0]
        position = min(int(first.cumulative_length), first.max_cache_len - self.tokens_per_step)  # a sync

        def from_position():
            kept_context.set_write_position(self.cache, position)
            return fn()
        return from_position

    def _k_steps(self) -> torch.Tensor:
        for k in range(self.tokens_per_step):
            logits = self.forward()
            self._feed(k, logits)
        return logits[: self.bs]

    def _feed(self, k: int, logits: torch.Tensor) -> None:
        """Step k's argmax as the next step's input and the replay's k-th token."""
        self.static_ids.copy_(logits.argmax(dim=-1, keepdim=True))
        self.tokens[k].copy_(self.static_ids[: self.bs, 0])

    def step(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


class GraphedMode(DecodeMode):
    """Decode steps captured into a torch.cuda.CUDAGraph over static input/output buffers and
    replayed once per token (graph_steps=1: the article's section-6 method)."""

    name = "graphed"
    needs_cuda = True

    def prepare(self, model, prompt, cfg):
        return GraphedStepper(model, prompt, cfg.cache_len, cfg.graph_steps).capture(prompt)
