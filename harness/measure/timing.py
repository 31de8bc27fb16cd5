"""The timed decode loop: the only place the harness takes time (statistics are in stats.py).

On CUDA every step's forward is bracketed by a pair of CUDA events recorded on the stream,
and the whole loop by the host clock; the host waits for the GPU once, after the last step.
On CPU, execution is synchronous and each step is timed by the host clock.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from harness.clock import cuda_event_ms, stopwatch

if TYPE_CHECKING:
    from harness.modes.base import Stepper

@dataclass
class DecodeTiming:
    """One timed block. A call decodes `tokens_per_call` tokens (a replay of K steps is one call), and
    gives one sample: its time divided by K, so that a K-step graph's samples are not copied K times."""

    step_ms: list[float]  # per-token time of each call: CUDA events on GPU, host clock on CPU
    wall_ms: float  # the whole loop on the host clock, argmax and feeding included
    clock: str  # "cuda_event" | "host"
    tokens_per_call: int
    tokens: torch.Tensor  # [calls * tokens_per_call, bs]: what the loop decoded, kept on the device
    # [calls, 2, bs]: each call's best logit and the logit of the token recorded for its last step, from the logits
    # that call returned, kept on the device (note_choice): a recorded token must be an argmax (recorded_not_argmax)
    choices: torch.Tensor | None = None
    # the slot the block's first timed step wrote its K/V to, read from the cache before the clock started
    # (write_position): every block's must be the run's first timed position (window_problem)
    first_position: int | None = None

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


def note_choice(logits: torch.Tensor, recorded: torch.Tensor, into: torch.Tensor) -> None:
    """A call's best logit and that of the token recorded for its last step, each [bs], into `into` [2, bs] (fp32,
    on the device; no sync): the token is an argmax where the two are equal (a tie between tokens included)."""
    into[0].copy_(logits.amax(dim=-1))
    into[1].copy_(logits.gather(-1, recorded[:, None])[:, 0])


def recorded_not_argmax(choices: torch.Tensor) -> tuple[int, int] | None:
    """The first call (index, and how many calls in all) whose recorded token is not an argmax of the logits it
    returned, from note_choice's [calls, 2, bs]; None where every one is. A sync: after timing."""
    wrong = ~(choices[:, 1] >= choices[:, 0]).all(dim=1)  # a NaN logit is no argmax either
    if not bool(wrong.any()):
        return None
    return int(wrong.nonzero()[0, 0]), int(wrong.sum())


def run_steps(stepper: Stepper, tokens: int, keep_logits: list | None = None,
              choices: list | None = None) -> torch.Tensor:
    """Untimed greedy steps (warm-up); returns the tokens they decoded, [steps, bs], on the device. `keep_logits`
    receives each call's logits (the tensor the stepper returned: no copy); `choices`, each call's note_choice."""
    decoded = []
    for _ in range(calls_for(stepper, tokens)):
        logits = advance(stepper)
        if keep_logits is not None:
            keep_logits.append(logits)
        decoded.append(stepper.tokens.clone())
        if choices is not None:
            choices.append(torch.empty(2, stepper.bs, device=logits.device))
            note_choice(logits, decoded[-1][-1], choices[-1])
    return torch.cat(decoded)


def warm_up(stepper: Stepper, tokens: int, device: torch.device, keep_logits: list | None = None,
            choices: list | None = None) -> tuple[torch.Tensor, float | None]:
    """The untimed warm-up (run_steps), and its pace: ms a token over its second half of calls, between syncs (outside
    any timed loop), so that a first call's one-off costs (a late compile, a cold cache) do not count; None where
    it makes fewer than two calls."""
    calls, k = calls_for(stepper, tokens), stepper.tokens_per_step
    if calls < 2:
        return run_steps(stepper, tokens, keep_logits, choices), None
    first = run_steps(stepper, calls // 2 * k, keep_logits, choices)
    second_half: dict[str, float] = {}
    with stopwatch(device, second_half, "ms"):
        second = run_steps(stepper, (calls - calls // 2) * k, keep_logits, choices)
    return torch.cat([first, second]), second_half["ms"] / second.shape[0]


def to_the_window(stepper: Stepper, warmup: int, decoded: torch.Tensor) -> torch.Tensor:
    """The timed window's rule: every timed block starts at the same slot, `warmup` steps after the context
    (RunConfig.first_timed_position), whatever graph_steps, so that runs that differ in graph_steps time the same
    positions. A warm-up decodes greedily from the context in whole calls: at one step a call it stops there; a
    stepper of K steps a call (graph_steps > 1, its graph feeding itself) decodes round_up(warmup, K) steps and goes
    past it, so it is rewound to it here (Stepper.rewind_to), its input the token its own warm-up fed that slot's
    step, as a warm-up of `warmup` steps would have left it: the K/V before the slot stay as the warm-up wrote them,
    and the block rewrites those after it. `decoded` [steps, bs]: the warm-up's tokens; returns the first `warmup` of them,
    the decode before the window, which the block's tokens continue."""
    if decoded.shape[0] > warmup:
        stepper.rewind_to(warmup, decoded[warmup - 1])
    return decoded[:warmup]


def warm_up_again(stepper: Stepper, warmup: int) -> None:
    """A later block's start: back to the context (Stepper.rewind), `warmup` untimed steps (in whole calls), and into
    the window (to_the_window)."""
    stepper.rewind()
    to_the_window(stepper, warmup, run_steps(stepper, warmup))


def write_positions(stepper: Stepper) -> list[int]:
    """The slots the layers of the stepper's cache write their next K/V to, each once, in order (one host sync)."""
    return torch.stack([layer.cumulative_length.reshape(()) for layer in stepper.cache.layers]).unique().tolist()


def write_position(stepper: Stepper) -> int | None:
    """The slot the stepper's next step writes its K/V to (write_positions); None where the layers disagree."""
    positions = write_positions(stepper)
    return int(positions[0]) if len(positions) == 1 else None


def window_problem(blocks: list[DecodeTiming], first: int) -> str | None:
    """Why the timed blocks did not all start at slot `first` (RunConfig.first_timed_position), or None."""
    for index, block in enumerate(blocks):
        if block.first_position != first:
            found = ("at no one slot (the cache's layers write at different ones)" if block.first_position is None
                     else f"at slot {block.first_position}")
            return (f"timed block {index + 1} started {found}, not at slot {first} (context_len + warmup): "
                    f"it timed other positions than the run's window")
    return None


def timed_decode(stepper: Stepper, tokens: int, device: torch.device,
                 keep_logits: list | None = None) -> DecodeTiming:
    """`keep_logits` receives each call's logits, between calls: a reference to the tensor the stepper returned (no
    copy, no kernel, no sync; an eager step allocates its output anew), so that plain eager's loop can be its own
    check's reference. Each call's best logit and the recorded token's are kept too (note_choice: two small kernels
    between calls, outside the events, no sync), so that every recorded token is checked against the logits it
    came from after the loop."""
    calls, k = calls_for(stepper, tokens), stepper.tokens_per_step
    produced = torch.empty(calls * k, stepper.bs, dtype=torch.long, device=stepper.input_ids.device)
    choices = torch.empty(calls, 2, stepper.bs, device=stepper.input_ids.device)
    done = iter(range(calls))
    first_position = write_position(stepper)  # a sync, before the clock starts

    def after(logits) -> None:  # between calls, outside the events: feed, and keep the tokens (no sync)
        if not stepper.feeds_itself:
            feed_argmax(stepper, logits)
        i = next(done)
        if keep_logits is not None:
            keep_logits.append(logits)
        produced[i * k:(i + 1) * k].copy_(stepper.tokens)
        note_choice(logits, produced[(i + 1) * k - 1], choices[i])

    if device.type == "cuda":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call_ms, clock = cuda_event_ms(stepper.step, calls, after), "cuda_event"  # its one sync is at its end
    else:
        t0 = time.perf_counter()
        call_ms, clock = _host_ms(stepper.step, calls, after), "host"
    wall_ms = (time.perf_counter() - t0) * 1e3
    return DecodeTiming([ms / k for ms in call_ms], wall_ms, clock, k, produced, choices, first_position)


def _host_ms(fn: Callable[[], object], calls: int, after: Callable[[object], None]) -> list[float]:
    call_ms = []
    for _ in range(calls):
        start = time.perf_counter()
        out = fn()
        call_ms.append((time.perf_counter() - start) * 1e3)
        after(out)
    return call_ms


