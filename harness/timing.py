"""The timed decode loop: the only place the harness takes time (statistics are in stats.py).

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

import torch

if TYPE_CHECKING:
    from harness.modes.base import Stepper

MiB = 1024 * 1024


@dataclass
class DecodeTiming:
    """One timed block. A call decodes `tokens_per_call` tokens (a replay of K steps is one call), and
    gives one sample: its time divided by K, so that a K-step graph's samples are not copied K times."""

    step_ms: list[float]  # per-token time of each call: CUDA events on GPU, host clock on CPU
    wall_ms: float  # the whole loop on the host clock, argmax and feeding included
    clock: str  # "cuda_event" | "host"
    tokens_per_call: int
    tokens: torch.Tensor  # [calls * tokens_per_call, bs]: what the loop decoded, kept on the device

    @property
    def n_tokens(self) -> int:
        return len(self.step_ms) * self.tokens_per_call


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


def run_steps(stepper: Stepper, tokens: int) -> torch.Tensor:
    """Untimed greedy steps (warm-up); returns the tokens they decoded, [steps, bs], on the device."""
    decoded = []
    for _ in range(calls_for(stepper, tokens)):
        advance(stepper)
        decoded.append(stepper.tokens.clone())
    return torch.cat(decoded)


def timed_decode(stepper: Stepper, tokens: int, device: torch.device) -> DecodeTiming:
    calls, k = calls_for(stepper, tokens), stepper.tokens_per_step
    produced = torch.empty(calls * k, stepper.bs, dtype=torch.long, device=stepper.input_ids.device)
    done = iter(range(calls))

    def after(logits) -> None:  # between calls, outside the events: feed, and keep the tokens (no sync)
        if not stepper.feeds_itself:
            feed_argmax(stepper, logits)
        i = next(done)
        produced[i * k:(i + 1) * k].copy_(stepper.tokens)

    if device.type == "cuda":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call_ms, clock = cuda_event_ms(stepper.step, calls, after), "cuda_event"  # its one sync is at its end
    else:
        t0 = time.perf_counter()
        call_ms, clock = _host_ms(stepper.step, calls, after), "host"
    wall_ms = (time.perf_counter() - t0) * 1e3
    return DecodeTiming([ms / k for ms in call_ms], wall_ms, clock, k, produced)


def _host_ms(fn: Callable[[], object], calls: int, after: Callable[[object], None]) -> list[float]:
    call_ms = []
    for _ in range(calls):
        start = time.perf_counter()
        out = fn()
        call_ms.append((time.perf_counter() - start) * 1e3)
        after(out)
    return call_ms


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
