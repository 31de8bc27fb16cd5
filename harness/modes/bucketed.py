from __future__ import annotations

import bisect

import torch

from harness.modes.base import DecodeMode
from harness.modes.eager import EagerStepper
from harness.modes.graphed import GraphedStepper
from harness.timing import median_call_ms

MiB = 1024 * 1024
PADDING_PROBE_CALLS = 50  # replays timed on each of the bucket graph and an exact-bs graph


def pick_bucket(buckets: list[int], bs: int) -> int | None:
    """The smallest captured size that holds bs, or None when bs exceeds them all."""
    i = bisect.bisect_left(buckets, bs)
    return buckets[i] if i < len(buckets) else None


class BucketedMode(DecodeMode):
    """As vLLM's cudagraph_capture_sizes and SGLang's --cuda-graph-bs: one graph per bucket, largest
    first, in one shared pool; a batch replays the smallest bucket that holds it, padded."""

    name = "bucketed"
    needs_cuda = True

    def prepare(self, model, prompt, cfg):
        bs, buckets = prompt.shape[0], list(cfg.buckets)
        bucket = pick_bucket(buckets, bs)
        if bucket is None:  # as the engines do: a batch above every bucket runs eagerly
            stepper = EagerStepper(model, prompt, cfg.cache_len)
            stepper.metrics["bucket"] = 0
            stepper.tags["bucket"] = f"none: bs={bs} > largest bucket {buckets[-1]}, ran eagerly"
            return stepper

        largest_alone = self._largest_alone(model, prompt, cfg)
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for size in sorted(buckets, reverse=True):  # largest first: smaller graphs reuse its blocks
            rows_prompt = prompt[:size] if size < bs else prompt  # a smaller bucket serves a smaller batch
            graphs[size] = GraphedStepper(model, rows_prompt, cfg.cache_len, cfg.graph_steps, rows=size, pool=pool)
        capture_ms = {size: g.metrics["capture_ms"] for size, g in graphs.items()}
        stepper = graphs[bucket]
        stepper.bucket_set = graphs  # all stay resident, as in a server
        set_bytes = sum(g.graph_bytes for g in graphs.values())
        stepper.graph_bytes = set_bytes
        stepper.metrics.update({f"capture_ms_bucket_{s}": ms for s, ms in capture_ms.items()})
        stepper.metrics.update(
            bucket=bucket, capture_ms=sum(capture_ms.values()),
            bucket_set_pool_mb=set_bytes / MiB, largest_bucket_alone_pool_mb=largest_alone / MiB,
            pool_vs_largest_alone=set_bytes / largest_alone if largest_alone else float("nan"),
        )
        stepper.tags["bucket"] = str(bucket)
        if bucket != bs:
            stepper.metrics["padding_overhead_pct"] = self._padding_overhead(model, prompt, cfg, stepper)
        stepper.restart(prompt)
        return stepper

    @staticmethod
    def _largest_alone(model, prompt, cfg) -> int:
        """The pool of the largest bucket captured on its own, to price the rest of the set."""
        size = max(cfg.buckets)
        alone = GraphedStepper(model, prompt[:size], cfg.cache_len, cfg.graph_steps, rows=size)
        pool_bytes = alone.graph_bytes
        del alone
        torch.cuda.empty_cache()
        return pool_bytes

    @staticmethod
    def _padding_overhead(model, prompt, cfg, bucket_stepper) -> float:
        """Per-replay latency of bs padded to its bucket against bs captured exactly, in percent."""
        exact = GraphedStepper(model, prompt, cfg.cache_len, cfg.graph_steps)
        exact_ms = median_call_ms(exact.step, PADDING_PROBE_CALLS)
        del exact
        bucket_ms = median_call_ms(bucket_stepper.step, PADDING_PROBE_CALLS)
        return (bucket_ms / exact_ms - 1.0) * 100.0
