"""fused.tune=true: each kind of product's plan chosen on the GPU at hand, by timing the captured step.

The plan's rules (plan.py: programs an SM a product's K splits aim at, packed weights, warps a program, the L2
prefetch, row slices or tiles) were each fitted on a few models, and no single value suits every model: the value
that speeds one step can slow another's (docs/fused-knobs.md). So where asked, the step is planned by coordinate
descent at prepare time (not timed): for each kind of product in turn (QKV, O, gate/up, down, lm_head; every layer's
alike), each choice that differs in one respect from that kind's plan as its turn began, and launches differently, is
captured as a whole step and timed against the best step so far in alternating blocks of graph replays (AB, BA, ...),
as `harness ab` times two arms; it becomes the best where its median ratio is below Knobs.tune_take_below (so a kind
may take two choices in turn, the later one timed against the earlier). Timing the whole step, not a product alone,
keeps what the product costs its neighbours: the PDL overlap, L2.

The choices change only how a product is launched and laid out, never what it computes (the same sums in fp32),
and the run is verified against fp32 as any fused run.

A tuned plan is kept (`tuned`): a file per plan_key under the compile cache folder (`fused-plans/`), so that a later
job of the same shape on the same kind of GPU, with the same kernels, takes it without timing again; delete the
folder to time again.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import triton

from harness.kernels.fused.decoder import FusedDecoder
from harness.kernels.fused.plan import (PRODUCT_KINDS, SPLITTABLE_KINDS, PlanChoice, blocks_and_splits, rule_warps,
                                        slices_apply, sm_count)

SOURCES = Path(__file__).parent  # the kernels and plan a tuned plan was timed with


@dataclass
class Tuning:
    """What tuning did: every candidate tried, as 'kind: choice ratio', and the ones taken; where the plan was kept
    from an earlier job, what timed it (`kept_from`: the GPU and the date) and nothing was timed now."""

    tried: list[str] = field(default_factory=list)
    taken: list[str] = field(default_factory=list)
    seconds: float = 0.0
    kept_from: str | None = None

    def summary(self) -> str:
        said = f"{'; '.join(self.taken) or 'none faster'} (of {len(self.tried)} tried)"
        return said + (f"; kept from {self.kept_from}" if self.kept_from else "")


def candidates(decoder: FusedDecoder, kind: str, prefetch: bool = False) -> list[PlanChoice]:
    """The choices one respect away from `kind`'s current plan that launch differently: the other warp count,
    fused.slices or tiles (where the slices apply); and for tiles, packed or not (where fused.packed leaves packing
    on), the L2 prefetch before the PDL wait on or off (where `prefetch`: a Hopper GPU; packed weights), and each
    other programs-an-SM target that changes the product's blocks or splits (where fused.split_k leaves splitting
    on)."""
    product, options, knobs = decoder.products()[kind], decoder.options, decoder.knobs
    current = product.choice
    found = [replace(current, warps=w) for w in knobs.tune_warps if w != current.warps]
    if slices_apply(knobs, options, decoder.rows):  # fused.slices: the tiles instead, or back, on the rules' warps
        warps = rule_warps(knobs, kind, product.n, product.k, options, decoder.rows, decoder.hidden,
                           not current.slices)
        found.append(replace(current, slices=not current.slices, warps=warps))
    if current.slices:  # row-major slices: packing, the prefetch and the tiles' splits do not apply
        return found
    if options.packed:
        found.append(replace(current, packed=not current.packed, prefetch=False))
    if prefetch and current.packed:
        found.append(replace(current, prefetch=not current.prefetch))
    if kind in SPLITTABLE_KINDS and options.split_k:
        layouts = {(product.bn, product.splits)}
        sms = sm_count(product.weight.device)
        for per_sm in knobs.tune_per_sm:
            layout = blocks_and_splits(knobs, sms, product.n, product.k, product.bk, True, per_sm)
            if layout not in layouts:
                layouts.add(layout)
                found.append(replace(current, per_sm=per_sm))
    return found


def tune(decoder: FusedDecoder, ratio: Callable[[FusedDecoder, FusedDecoder], float],
         prefetch: bool = False) -> tuple[FusedDecoder, Tuning]:
    """Coordinate descent over the kinds of product, once each: the decoder to run and what was tried.
    `ratio(trial, best)`: the trial step's time over the best's (harness/modes/fused.py's StepTimer on a GPU);
    `prefetch`: whether the L2 prefetch may be tried (a Hopper GPU)."""
    started, tuning, best = time.perf_counter(), Tuning(), decoder
    for kind in decoder.products():  # the kinds the step launches as products, in PRODUCT_KINDS' order
        for choice in candidates(best, kind, prefetch):
            trial = best.replanned(kind, choice)
            measured = ratio(trial, best)
            line = f"{kind}: {choice} {measured:.4f}"
            tuning.tried.append(line)
            if measured < decoder.knobs.tune_take_below:
                best = trial
                tuning.taken.append(line)
    tuning.seconds = time.perf_counter() - started
    return best, tuning


def plan_key(decoder: FusedDecoder, gpu: str, prefetch: bool) -> str:
    """What a tuned plan holds for: the kind of GPU, the model's shapes, the batch rows, the longest prefix, the
    switches and knobs, and the kernels, plan and tuner as they are (their source) under this Triton."""
    first = decoder.cache.layers[0]
    described = dict(
        gpu=gpu, prefetch=prefetch, rows=decoder.rows, hidden=decoder.hidden, heads=decoder.heads,
        kv_heads=decoder.kv_heads, head_dim=decoder.head_dim, layers=len(decoder.layers), dtype=str(first.keys.dtype),
        capacity=first.max_cache_len, longest_prefix=decoder.longest_prefix,
        options=dataclasses.asdict(decoder.options), knobs=dataclasses.asdict(decoder.knobs), triton=triton.__version__,
        shapes={kind: [product.n, product.k] for kind, product in decoder.products().items()},
        source=hashlib.sha256(b"".join(p.read_bytes() for p in sorted(SOURCES.glob("*.py")))).hexdigest())
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


def tuned(decoder: FusedDecoder, ratio: Callable[[FusedDecoder, FusedDecoder], float], prefetch: bool,
          folder: Path, gpu: str, gpu_id: str) -> tuple[FusedDecoder, Tuning]:
    """tune(), or the plan an earlier job of the same plan_key kept in `folder` (no candidate timed); a plan tuned
    here is kept there for the next."""
    key = plan_key(decoder, gpu, prefetch)
    path = folder / f"{key}.json"
    if (kept := _kept(path)) is not None:
        choices, tuning = kept
        started = time.perf_counter()
        for kind, choice in choices.items():
            if choice != decoder.products()[kind].choice:
                decoder = decoder.replanned(kind, choice)
        tuning.seconds = time.perf_counter() - started
        return decoder, tuning
    decoder, tuning = tune(decoder, ratio, prefetch)
    _keep(path, decoder, tuning, gpu_id)
    return decoder, tuning


def _kept(path: Path) -> tuple[dict[str, PlanChoice], Tuning] | None:
    """A kept plan (each kind's choice, and what timed it), or None where there is none or any of it cannot be read
    (then the step is timed again)."""
    try:
        kept = json.loads(path.read_text())
        # each kind of product the step launches (a kind it does not know: not a plan of this step's)
        choices = {kind: PlanChoice(**choice) for kind, choice in kept["choices"].items()}
        if not set(choices) <= set(PRODUCT_KINDS):
            return None
        return choices, Tuning(list(kept["tried"]), list(kept["taken"]),
                               kept_from=f"{kept['gpu_id']} at {kept['when']} ({path})")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _keep(path: Path, decoder: FusedDecoder, tuning: Tuning, gpu_id: str) -> None:
    """Written whole or not at all (a temporary file renamed), so that jobs beside this one never read half."""
    choices = {kind: dataclasses.asdict(product.choice) for kind, product in decoder.products().items()}
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(dict(choices=choices, tried=tuning.tried, taken=tuning.taken, gpu_id=gpu_id,
                                         when=when), indent=1))
    os.replace(temporary, path)
