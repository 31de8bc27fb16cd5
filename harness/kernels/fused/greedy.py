"""mode=fused's greedy choice inside a captured run of several steps (`graph_steps` > 1): one kernel after lm_head
takes each row's argmax of the logits and writes it where the next step reads its input id and where the run keeps
its tokens, launched with PDL like the step's other kernels.

Why a kernel of its own: torch's argmax and the two copies that feed it back are three ordinary launches a step,
which PDL cannot overlap, so the next step's first kernel could not start its weight copies behind them. The public
megakernel study the harness measures its fused step against times its steps in this scope: one graph replay of all
its decode steps, the argmax and the next token's write included.

One launch, grid (rows, programs): each program finds the largest logit of its span of the vocabulary and the first
index that holds it; the last program of a row to finish (an atomic count, as the folded attention's merge) takes the
programs' results from L2, picks the largest, the first index among equals (torch.argmax's rule), writes it and sets
the count back for the next step. A NaN logit counts as +inf (torch.argmax takes a NaN as the largest), so that a
step gone non-finite does not feed the largest finite logit's token as if nothing were wrong.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels.fused.knobs import KNOBS, Knobs
from harness.kernels.fused.pdl import _pdl_start, _pdl_wait, pdl_launch


@triton.jit
def _greedy_feed(Logits, logits_row, vocab, span, Best, BestAt, Count, Ids, ids_row, Tokens, BLOCK: tl.constexpr,
                 PROGRAMS: tl.constexpr, PDL: tl.constexpr, FEED: tl.constexpr = True):
    """FEED off: a test's fault, the token kept but not fed (the next step reads its own input again)."""
    row, program = tl.program_id(0), tl.program_id(1)
    _pdl_start(PDL)  # lm_head let this launch only after its weight loop: the next step's first kernel may follow
    _pdl_wait(PDL)
    first = program * span
    best, best_at = float("-inf"), vocab  # no index yet: past every real one
    for start in range(first, tl.minimum(first + span, vocab), BLOCK):
        at = start + tl.arange(0, BLOCK)
        inside = at < tl.minimum(first + span, vocab)
        x = tl.load(Logits + row * logits_row + at, mask=inside, other=float("-inf"), cache_modifier=".cg")
        x = tl.where(x != x, float("inf"), x)  # NaN as the largest (torch.argmax's rule)
        top = tl.max(x, 0)
        top_at = tl.min(tl.where(inside & (x == top), at, vocab), 0)
        # blocks go up in index: a later block takes over only with a larger value, so equals keep the first index
        best_at = tl.where((top > best) | (best_at == vocab), top_at, best_at)
        best = tl.maximum(best, top)
    tl.store(Best + row * PROGRAMS + program, best)
    tl.store(BestAt + row * PROGRAMS + program, best_at)
    tl.debug_barrier()  # the results written before the count (released at the GPU's scope) says so
    counted = tl.atomic_add(Count + row, 1, sem="acq_rel", scope="gpu")
    if counted == tl.num_programs(1) - 1:  # the last of the row: every program's result from L2 (".cg")
        p = tl.arange(0, PROGRAMS)
        live = p < tl.num_programs(1)
        values = tl.load(Best + row * PROGRAMS + p, mask=live, other=float("-inf"), cache_modifier=".cg")
        indices = tl.load(BestAt + row * PROGRAMS + p, mask=live, other=vocab, cache_modifier=".cg")
        top = tl.max(values, 0)
        chosen = tl.min(tl.where(live & (values == top), indices, vocab), 0)
        if FEED:
            tl.store(Ids + row * ids_row, chosen.to(tl.int64))
        tl.store(Tokens + row, chosen.to(tl.int64))
        tl.store(Count + row, 0)


class GreedyFeed:
    """The buffers of `_greedy_feed` for logits [rows, vocab] (fp32) and its launch: `__call__(tokens)` writes each
    row's argmax to `input_ids` [rows, 1] (the next step's input) and to `tokens` [rows] (the run's record).
    `feed=False`: a test's fault (harness/measure/mutations.py), the next step's input not written."""

    def __init__(self, logits: torch.Tensor, input_ids: torch.Tensor, pdl: bool, feed: bool = True,
                 knobs: Knobs = KNOBS):
        self.logits, self.input_ids, self.pdl, self.feed = logits, input_ids, pdl, feed
        rows, vocab = logits.shape
        self.block = knobs.greedy_block
        self.programs = min(knobs.greedy_most_programs, triton.next_power_of_2(triton.cdiv(vocab, self.block)))
        self.span = triton.cdiv(triton.cdiv(vocab, self.programs), self.block) * self.block
        self.programs = triton.cdiv(vocab, self.span)  # no program past the vocabulary
        width = triton.next_power_of_2(self.programs)
        self.best = torch.empty(rows, width, device=logits.device, dtype=torch.float32)
        self.best_at = torch.empty(rows, width, device=logits.device, dtype=torch.int32)
        self.count = torch.zeros(rows, device=logits.device, dtype=torch.int32)  # back to 0 by each row's last

    def __call__(self, tokens: torch.Tensor) -> None:
        rows, vocab = self.logits.shape
        _greedy_feed[(rows, self.programs)](
            self.logits, self.logits.stride(0), vocab, self.span, self.best, self.best_at, self.count,
            self.input_ids, self.input_ids.stride(0), tokens, BLOCK=self.block, PROGRAMS=self.best.shape[1],
            FEED=self.feed,
            **pdl_launch(self.pdl))
