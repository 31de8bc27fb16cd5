"""What the benchmarks share: the config a job would run, the model and prompt a `mode=fused` job builds, its
captured stepper warmed up (with the rules' knobs or a variant's), a knob variant read from the command line, and
the paired ratio that `harness ab` reports. Run from the repository root as `python benchmarks/NAME.py`; this folder
is then on the path."""
from __future__ import annotations

import dataclasses
import sys

import torch

from harness.cli.precheck import compose_single_run
from harness.clock import block_ms
from harness.config.schema import RunConfig
from harness.kernels.fused.knobs import KNOBS, Knobs
from harness.measure.job import seeded_prompt
from harness.measure.stats import paired_ratio_interval
from harness.measure.timing import calls_for
from harness.models import get_model
from harness.modes.fused import FusedMode


def run_config(*overrides: str) -> RunConfig:
    """The config `python -m harness OVERRIDES` runs as one job, composed and validated as the job will be."""
    return compose_single_run(list(overrides))


def fused_model_and_prompt(overrides: list[str]):
    """The config, the model (on the GPU) and the seeded prompt that `python -m harness mode=fused ...` builds."""
    cfg = compose_single_run(["mode=fused", *overrides])
    device = torch.device("cuda")
    model = get_model(cfg.model, cfg.dtype.value, cfg.attn, device, cfg.seed).model
    return cfg, model, seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, device)


def warm_fused_stepper(model, prompt, cfg, knobs: Knobs | None = None, steps: int = 10):
    """mode=fused's captured stepper for the run, planned with `knobs` (the rules' where None), restarted from the
    prompt and replayed `steps` times (call under torch.inference_mode)."""
    stepper = FusedMode().prepare(model, prompt, cfg, knobs)
    stepper.restart(prompt)
    for _ in range(steps):
        if stepper.feeds_itself:  # a graph of several steps: replays on from one another could pass the cache
            stepper.rewind()
        stepper.step()
    return stepper


def step_ms(stepper, steps: int) -> float:
    """ms a step over one block of `steps` steps from the prefilled context (one pair of events, no sync inside):
    that many replays of one step, or as few replays of a graph of several steps as make them."""
    stepper.rewind()
    return block_ms(stepper.step, calls_for(stepper, steps)) / stepper.tokens_per_step


def knobs_from(spec: str) -> Knobs:
    """`name=value,name=value` as the rules' knobs with those replaced (dataclasses.replace), each value read as the
    field's type (a tuple as `a+b`); an unknown name or a bad value ends the program with one line and exit 2."""
    fields = {f.name: f for f in dataclasses.fields(Knobs)}
    changes = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if name not in fields:
            refuse(f"knob {name!r} is not one of Knobs' fields: {', '.join(fields)}")
        default = getattr(KNOBS, name)
        try:
            changes[name] = (tuple(type(default[0])(v) for v in filter(None, value.split("+")))
                             if isinstance(default, tuple) else type(default)(value))
        except (ValueError, IndexError):
            refuse(f"knob {name}={value!r} is not a {type(default).__name__}")
    return dataclasses.replace(KNOBS, **changes)


def refuse(message: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    print(f"{sys.argv[0]}: {message}", file=sys.stderr)
    sys.exit(2)


def against_first(first: list[float], spans: list[float]) -> str:
    """A variant's median over the first's, with the 95% interval of a bootstrap over rounds that keeps each round's
    pair together (both timed back to back in it): what harness ab reports for its arms."""
    ratio, low, high = paired_ratio_interval([[t] for t in first], [[t] for t in spans])
    return f"{ratio:.4f} ({low:.4f}–{high:.4f})"
