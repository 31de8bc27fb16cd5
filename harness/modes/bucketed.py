from __future__ import annotations

import bisect

import torch

from harness.modes.base import DecodeMode
from harness.modes.eager import EagerStepper
from harness.modes.graphed import GraphedStepper
from harness.clock import MiB, median_call_ms

PADDING_PROBE_CALLS = 50  # replays timed on each of the bucket graph and an exact-bs graph


def pick_bucket(buckets: list[int], bs: int) -> int | None:
    """The smallest captured size that holds bs, or None when bs exceeds them all."""
    i = bisect.bisect_left(buckets, bs)
    return buckets[i] if i < len(buckets) else None


class BucketedStepper(GraphedStepper):
    """The batch padded to its bucket, replaying that bucket's graph. The other buckets' graphs are
    captured beside it into one shared pool, largest first, and stay resident, as in a server."""

    def __init__(self, model, prompt, cache_len, graph_steps: int, buckets: list[int], bucket: int):
        super().__init__(model, prompt, cache_len, graph_steps, rows=bucket)
        self.buckets, self.others = buckets, {}

    def capture(self, prompt: torch.Tensor, pool=None) -> BucketedStepper:
        pool = torch.cuda.graph_pool_handle()
        capture_ms = {}
        for size in sorted(self.buckets, reverse=True):  # largest first: smaller graphs reuse its blocks
            if size == self.rows:
                graph = super().capture(prompt, pool)
            else:  # a smaller bucket serves a smaller batch
                rows_prompt = prompt[:size] if size < self.bs else prompt
                graph = GraphedStepper(self.model, rows_prompt, self.cache_len, self.tokens_per_step, rows=size)
                self.others[size] = graph.capture(rows_prompt, pool)
            capture_ms[size] = graph.metrics["capture_ms"]
        self.graph_bytes = sum(g.graph_bytes for g in (self, *self.others.values()))
        self.metrics.update({f"capture_ms_bucket_{s}": ms for s, ms in capture_ms.items()})
        self.metrics.update(bucket=self.rows, capture_ms=sum(capture_ms.values()),
                            bucket_set_pool_mb=self.graph_bytes / MiB)
        self.tags["bucket"] = str(self.rows)
        return self


class BucketedMode(DecodeMode):
    """As vLLM's cudagraph_capture_sizes and SGLang's --cuda-graph-bs: one graph per bucket, largest
    first, in one shared pool; a batch replays the smallest bucket that holds it, padded."""

    name = "bucketed"
    needs_cuda = True

    def prepare(self, model, prompt, cfg):
        bs, buckets = prompt.shape[0], list(cfg.buckets)
        bucket = pick_bucket(buckets, bs)
        if bucket is None:  # as the engines do: a batch above every bucket runs eagerly
            stepper = EagerStepper(model, prompt, cfg.cache_len, prefill=False)
            stepper.metrics["bucket"] = 0
            stepper.tags["bucket"] = f"none: bs={bs} > largest bucket {buckets[-1]}, ran eagerly"
            return stepper
        largest_alone = self._largest_alone(model, prompt, cfg)
        stepper = BucketedStepper(model, prompt, cfg.cache_len, cfg.graph_steps, buckets, bucket).capture(prompt)
        stepper.metrics.update(largest_bucket_alone_pool_mb=largest_alone / MiB,
                               pool_vs_largest_alone=stepper.graph_bytes / largest_alone if largest_alone else float("nan"))
        if bucket != bs:
            stepper.metrics["padding_overhead_pct"] = self._padding_overhead(model, prompt, cfg, stepper)
        return stepper

    @staticmethod
    def _largest_alone(model, prompt, cfg) -> int:
        """The pool of the largest bucket captured on its own, to price the rest of the set."""
        size = max(cfg.buckets)
        alone = GraphedStepper(model, prompt[:size], cfg.cache_len, cfg.graph_steps, rows=size)
        pool_bytes = alone.capture(prompt[:size]).graph_bytes
        del alone
        torch.cuda.empty_cache()
        return pool_bytes

    @staticmethod
    def _padding_overhead(model, prompt, cfg, bucket_stepper) -> float:
        """Per-replay latency of bs padded to its bucket against bs captured exactly, in percent."""
        calls = min(PADDING_PROBE_CALLS, cfg.cache_len // cfg.graph_steps - 1)  # replays that fit the cache
        exact = GraphedStepper(model, prompt, cfg.cache_len, cfg.graph_steps).capture(prompt)
        exact.cache.reset()
        exact_ms = median_call_ms(exact.step, calls)
        del exact
        bucket_stepper.cache.reset()
        bucket_ms = median_call_ms(bucket_stepper.step, calls)
        return (bucket_ms / exact_ms - 1.0) * 100.0
