"""Two configs timed against each other in one process on one device: a paired A/B.

Leases differ (one compiled config can measure several per cent apart across GPUs of one model), and a GPU drifts
within a lease (clocks, temperature, what else the host does). So both arms are prepared first, side by side, and
then timed in alternating blocks in balanced order (AB BA AB BA ...): block i of A and block i of B ran back to
back, and a drift moves both. The ratio's interval comes from resampling those pairs (stats.paired_ratio_interval).
Optionally the whole A/B repeats in several fresh processes, one after another, whose differences (a compile's
choices, an autotuner's pick) then widen the interval as they should.

Pure measurement: no Hydra, no MLflow. Neither arm is verified here (`harness` runs each as a job for that).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import torch

from harness.clock import resolve_device
from harness.config.schema import RunConfig
from harness.measure.environment import environment_tags
from harness.measure.job import JobError, prefill, prepare, seeded_prompt, warm_up
from harness.measure.stats import clock_failure, decode_metrics
from harness.measure.timing import DecodeTiming, timed_decode, warm_up_again, window_problem
from harness.models import get_model
from harness.modes import spec

# the folder each variable names under a fresh one: Inductor's and Triton's caches, and the harness's own (its saved
# compiled steps and tuned fused plans, under $HARNESS_CACHE_DIR/compile), which a fresh compile must not read either
CACHE_VARIABLES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "HARNESS_CACHE_DIR": "harness"}


@dataclass
class Arm:
    cfg: RunConfig
    blocks: list = field(default_factory=list)  # its DecodeTimings, in the order they ran
    prepare_ms: float = 0.0
    prepared: list[str] = field(default_factory=list)  # per process: where its compiled kernels came from, if any


def balanced_order(pairs: int) -> list[str]:
    """AB, BA, AB, BA, ...: each arm runs first in half the pairs, so a warm-up or drift favours neither."""
    return [arm for i in range(pairs) for arm in ("AB" if i % 2 == 0 else "BA")]


def time_arms(cfg_a: RunConfig, cfg_b: RunConfig, pairs: int,
              on_phase: Callable[[str], None] = lambda phase: None) -> tuple[Arm, Arm, dict[str, str]]:
    """Prepare both arms (model, mode, prefill, warm-up), then time `pairs` pairs of blocks of `decode_tokens`
    steps in balanced order, each block from the prefilled context after `warmup` steps, at the same slot whatever
    graph_steps (timing.to_the_window). Returns the arms and the environment they ran in."""
    device = resolve_device(cfg_a.device)
    if resolve_device(cfg_b.device) != device:
        raise JobError(f"both arms must run on one device: device={cfg_a.device} against device={cfg_b.device}")
    arms = {"A": Arm(cfg_a), "B": Arm(cfg_b)}
    for arm in arms.values():  # before either is built: an arm that cannot run here costs nothing
        if (why := spec(arm.cfg.mode).mode_class()().check(device)) is not None:
            raise JobError(why)
    steppers = {}
    with torch.inference_mode():
        for name, arm in arms.items():
            on_phase(f"arm {name} ({arm.cfg.label}): prepare")
            steppers[name] = _prepare(arm, device)
        for i, name in enumerate(balanced_order(pairs)):
            on_phase(f"block {i + 1}/{2 * pairs}: arm {name}")
            stepper, cfg = steppers[name], arms[name].cfg
            warm_up_again(stepper, cfg.warmup)  # the same context and window each block
            arms[name].blocks.append(timed_decode(stepper, cfg.decode_tokens, device))
    for name, arm in arms.items():
        why = (clock_failure(decode_metrics(arm.blocks, arm.cfg.bs))
               or window_problem(arm.blocks, arm.cfg.first_timed_position()))
        if why is not None:
            raise JobError(f"arm {name}: {why}")
        steppers[name].release()
    return arms["A"], arms["B"], environment_tags(device)


def time_arms_in_processes(cfg_a: RunConfig, cfg_b: RunConfig, pairs: int, processes: int,
                           on_phase: Callable[[str], None] = lambda phase: None, fresh_compiles: bool = False
                           ) -> tuple[Arm, Arm, dict[str, str], list[int]]:
    """time_arms, `processes` times, each in a fresh interpreter one after another (its own CUDA context, compiles,
    autotuning and kernel caches; the A/B within each stays paired), or in this one where `processes` is 1 (and no
    fresh compiles are asked). `fresh_compiles`: each process compiles into empty cache folders of its own, so that
    no process reads another's kernels or autotuning picks. Returns both arms with every process's blocks, the first
    process's environment, and the process of each pair."""
    if processes == 1 and not fresh_compiles:
        return (*time_arms(cfg_a, cfg_b, pairs, on_phase), [0] * pairs)
    arms, owners, environment = (Arm(cfg_a), Arm(cfg_b)), [], {}
    for index in range(processes):
        on_phase(f"process {index + 1}/{processes}: starting a fresh interpreter"
                 + " with empty compile caches" * fresh_compiles)
        with compile_caches_of_its_own() if fresh_compiles else contextlib.nullcontext():
            blocks, prepared, env = _in_a_spawned_interpreter(cfg_a, cfg_b, pairs)
        for arm, its_blocks, (prepare_ms, how) in zip(arms, blocks, prepared):
            arm.blocks += [DecodeTiming(*block[:4], tokens=torch.empty(0), first_position=block[4])
                           for block in its_blocks]
            arm.prepare_ms += prepare_ms
            arm.prepared += how
        owners += [index] * pairs
        environment = environment or env
    return *arms, environment, owners


@contextlib.contextmanager
def compile_caches_of_its_own():
    """Inductor's, Triton's and the harness's cache folders, for the processes started inside, set to empty ones made
    here (and deleted after): their compiles trace, autotune and build again, as on a machine that never compiled the
    config. (Left to the harness's folder, each process would load the step the first one saved.)"""
    with tempfile.TemporaryDirectory(prefix="harness-ab-compile-") as folder:
        # patch.dict gives the environment back as it was, the variables unset before unset again
        with mock.patch.dict(os.environ, {name: os.path.join(folder, sub) for name, sub in CACHE_VARIABLES.items()}):
            yield folder


def _in_a_spawned_interpreter(cfg_a: RunConfig, cfg_b: RunConfig, pairs: int) -> tuple[tuple, tuple, dict[str, str]]:
    """_in_a_fresh_process in a fresh interpreter. Where this one stops waiting (Ctrl-C, a scheduler's SIGTERM, an
    error), the interpreter is ended too: left alone, it would time its A/B to the end on the GPU, which no one
    reads, and the pool's shutdown would wait for it."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return pool.submit(_in_a_fresh_process, cfg_a, cfg_b, pairs).result()
    except BaseException:
        for worker in multiprocessing.active_children():  # the pool's one worker: `harness ab` starts no other
            worker.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _in_a_fresh_process(cfg_a: RunConfig, cfg_b: RunConfig, pairs: int) -> tuple[tuple, tuple, dict[str, str]]:
    """One process's A/B as plain data (its decoded tokens stay behind: no CUDA tensor crosses processes)."""
    from harness.progress import say

    arm_a, arm_b, environment = time_arms(cfg_a, cfg_b, pairs, on_phase=lambda phase: say(f"ab: {phase}"))
    blocks = tuple([(t.step_ms, t.wall_ms, t.clock, t.tokens_per_call, t.first_position) for t in arm.blocks]
                   for arm in (arm_a, arm_b))
    return blocks, tuple((arm.prepare_ms, arm.prepared) for arm in (arm_a, arm_b)), environment


def _quiet(phase: str) -> None:
    """An arm's phases, not reported one by one (the A/B reports its pairs)."""


def _prepare(arm: Arm, device: torch.device):
    cfg = arm.cfg
    mode = spec(cfg.mode).mode_class()()
    loaded = get_model(cfg.model, cfg.dtype.value, cfg.attn, device, cfg.seed)
    prompt = seeded_prompt(cfg.bs, cfg.context_len, loaded.model.config.vocab_size, cfg.seed, device)
    phases: dict[str, float] = {}
    stepper = prepare(cfg, loaded.model, mode, prompt, device, _quiet, phases)
    prefill(cfg, loaded.model, stepper, prompt, device, _quiet, phases)
    warm_up(cfg, stepper, device, _quiet, phases)
    arm.prepare_ms = phases["prepare_ms"]
    if "compile_cache" in stepper.tags:  # a compiled arm: were its kernels compiled here, or read from the cache?
        arm.prepared.append(stepper.tags["compile_cache"])
    return stepper
