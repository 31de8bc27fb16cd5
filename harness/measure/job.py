"""One job, start to finish: build → prefill → capture → warm up → timed decode → check → result.

Pure measurement: no Hydra, no MLflow. The result is a Measurement; the caller records it.
"""
from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path
from typing import Callable

import torch

from harness.measure.attribution import nvtx_range, profile_steps
from harness.config.schema import RunConfig
from harness.clock import MiB, resolve_device, stopwatch
from harness.measure.environment import LoadProbe, contention, environment_tags, usable_cores
from harness.measure.gpu_state import GpuState
from harness.models import DTYPES, LoadedModel, get_model
from harness.modes import spec
from harness.modes import kept_context
from harness.modes.base import DecodeMode, pad_rows
from harness.progress import say
from harness.record import Measurement
from harness.measure.roofline import ceilings, floor, implementation_bytes, slots_read, step_cost
from harness.measure import mutations, references
from harness.measure.stats import NOISY_PCT, block_steps, clock_failure, decode_metrics, is_noisy, stop_reason
from harness.measure.timing import timed_decode, to_the_window, warm_up, warm_up_again, window_problem
from harness.measure.verify import (context_digest, context_fills, loop_reference, loop_serves_as_reference,
                                   verified_steps, verify)


SLOW_MS = 20.0  # what HARNESS_INJECT_FAULT=slow adds to each step


class JobError(RuntimeError):
    """A job that cannot run or whose output is wrong; the message is the recorded reason."""


def measure(cfg: RunConfig, on_phase: Callable[[str], None] = lambda phase: None,
            artifacts_dir: Path | None = None) -> Measurement:
    """Measure one job. `artifacts_dir` receives the profiler's files when cfg.profile is set."""
    device = resolve_device(cfg.device)
    mode = spec(cfg.mode).mode_class()()
    if device.type == "cuda" and not torch.cuda.is_available():
        raise JobError(f"device={device} asked for, but no CUDA GPU is visible; use device=auto or device=cpu")
    if (why := mode.check(device)) is not None:
        raise JobError(why)
    torch.set_num_threads(cfg.cpu_threads)  # before anything is built: what the job builds and times runs on them
    on_phase("build")
    with nvtx_range("build", device.type == "cuda"):
        loaded = get_model(cfg.model, cfg.dtype.value, cfg.attn, device, cfg.seed)
    memory = MemoryProbe(device)
    oom = None
    try:
        inject_fault(cfg)
        with torch.inference_mode():
            result = _decode(cfg, loaded, mode, device, on_phase, artifacts_dir)
    except torch.OutOfMemoryError as err:
        oom = str(err).splitlines()[0]  # keep the text only: the traceback would pin the job's tensors
    finally:
        kept_context.forget_taken()
    released = memory.after_release()
    if oom is not None:
        back = {1.0: "yes", 0.0: "NO"}.get(released.get("mem_returned_to_baseline"), "not measured off a GPU")
        raise JobError(f"out of memory at bs={cfg.bs} cache_len={cfg.cache_len} mode={cfg.mode} "
                       f"({oom}); memory back at the post-load baseline: {back}")
    result.metrics.update(released)
    return result


def inject_fault(cfg: RunConfig, stepper=None) -> None:
    """Test hook: HARNESS_INJECT_FAULT=oom:LABEL, sigkill:LABEL or slow:LABEL hits the job whose label contains
    LABEL (slow: SLOW_MS more per step, inside the timed step, once its stepper exists)."""
    kind, _, where = os.environ.get("HARNESS_INJECT_FAULT", "").partition(":")
    if not kind or where not in cfg.label or (kind == "slow") != (stepper is not None):
        return
    if kind == "slow":
        step = stepper.step
        stepper.step = lambda: (time.sleep(SLOW_MS / 1e3), step())[1]
        stepper.tags["fault"] = f"slowed by {SLOW_MS:g} ms a step (HARNESS_INJECT_FAULT, a test hook)"
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected by HARNESS_INJECT_FAULT for {cfg.label}")
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)


def _decode(cfg: RunConfig, loaded: LoadedModel, mode: DecodeMode, device: torch.device, on_phase,
            artifacts_dir: Path | None) -> Measurement:
    model = loaded.model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, device)
    phases = {"build_ms": loaded.build_ms}
    stepper, warm_tokens, kept = run_phases(cfg, model, mode, prompt, device, on_phase, phases, keep_loop_logits=True)
    loop = []  # plain eager's loop as its own check's reference (verify.LoopReference), built after the first block
    checked = verified_steps(cfg.attn, cfg.context_len, cfg.cache_len)
    # the lockstep's steps past the warm-up, decoded in the first block too: one eager pass serves both checks
    steps = _block_steps(cfg, phases.get("warmup_pace_ms"), checked - warm_tokens.shape[0], stepper.tags,
                         _kept_loop_steps(model, prompt, stepper, mode.exact, warm_tokens.shape[0]))

    def first_block(block) -> None:
        loop.append(loop_reference(kept, torch.cat([warm_tokens, block.tokens]), checked))
        kept.clear()

    load = LoadProbe()
    blocks, gpu = _timed_blocks(cfg, steps, stepper, device, on_phase, kept,
                                first_block if kept is not None else None, load)
    metrics = {**decode_metrics(blocks, cfg.bs), **phases, **_peaks(device), **stepper.metrics,
               "block_steps": float(steps), "token_repeat_fraction": token_repeat_fraction(torch.cat([warm_tokens, blocks[0].tokens]))}
    metrics.update(gpu.results(sum(b.n_tokens for b in blocks) * cfg.bs, stepper.tags))
    _mark_noisy(cfg, load, metrics, stepper.tags)
    arch = _architecture(model)
    metrics["parameters"] = float(arch["parameters"])  # the model's size, an axis of the reports
    metrics.update(_speed_of_light(arch, cfg, steps, device, metrics["step_ms_median"], stepper.tags, stepper.rows))
    if cfg.profile and device.type == "cuda":
        on_phase("profile")
        metrics.update(profile_steps(stepper, cfg.profile_steps, artifacts_dir))
    elif cfg.profile:
        stepper.tags["profile"] = "skipped: the profiler pass times CUDA kernels, and this job ran on the CPU"
        on_phase(f"profile {stepper.tags['profile']}")
    on_phase("verify")
    with stopwatch(device, metrics, "verify_ms"):
        checks, failure = verify(model, prompt, stepper, cfg, mode.exact, torch.cat([warm_tokens, blocks[0].tokens]),
                                 loop[0] if loop else None, _recorded_choices(stepper, blocks))
    metrics.update(checks)
    failure = clock_failure(metrics) or failure or window_problem(blocks, cfg.first_timed_position())  # clock first
    return Measurement(metrics, [ms for b in blocks for ms in b.step_ms], blocks[0].clock, loaded.weights,
                       loaded.source, loaded.reused, stepper.tags, arch, environment_tags(device), failure)


def _recorded_choices(stepper, blocks) -> list:
    """Each call's recorded tokens and the logits they came from, by the part of the loop that decoded them: the
    warm-up, then each timed block (verify's argmax check of every recorded token)."""
    return [("the warm-up", stepper.warm_choices), *((f"timed block {i + 1}", b.choices) for i, b in enumerate(blocks))]


def _mark_noisy(cfg: RunConfig, load: LoadProbe, metrics: dict, tags: dict) -> None:
    """The tag `noisy`, where the median's interval is wide or the job's threads had fewer cores than they needed."""
    noise = [f"median interval ±{metrics['step_ms_ci_pct']:.1f}% (> ±{NOISY_PCT:g}%)"] if is_noisy(metrics) else []
    noise += _contention(cfg, load, metrics, tags)
    if noise:
        tags["noisy"] = "; ".join(noise)


def _contention(cfg: RunConfig, load: LoadProbe, metrics: dict, tags: dict) -> list[str]:
    """The threads the job timed on against the cores it had (tags `cpu_cores`, metric `cpu_load`): each reason the
    host's clock timed the scheduler too, warned about on the console and returned for the `noisy` tag."""
    cores, machine = usable_cores(), os.cpu_count() or 1
    tags["cpu_cores"] = f"{cores} of {machine}"
    if (during := load.load()) is not None:
        metrics["cpu_load"] = during
    why = contention(cfg.cpu_threads, cores, machine, during)
    for reason in why:
        say(f"warning: {cfg.label}: {reason}: its times are noisy")
    return why


def _block_steps(cfg: RunConfig, pace_ms: float | None, at_least: int, tags: dict,
                 reference_steps: int | None) -> int:
    steps, cut = block_steps(cfg, pace_ms, at_least, reference_steps)
    if cut is not None:
        tags["block_cut"] = cut
    return steps


def _kept_loop_steps(model, prompt, stepper, exact: bool, warm_tokens: int) -> int | None:
    """The steps past the warm-up of the loop an earlier job of this shape, prompt and first token left as the token
    check's reference (plain eager's own loop, in a sweep), where this run's check is eager's (an exact mode)."""
    if not exact:
        return None
    kept = references.kept_length("gaps", references.shape_of(model, stepper), [prompt, stepper.first_ids])
    return None if kept is None else kept - warm_tokens


def _timed_blocks(cfg: RunConfig, steps: int, stepper, device, on_phase, keep_logits: list | None = None,
                  first_block: Callable | None = None, load: LoadProbe | None = None) -> tuple[list, GpuState]:
    """Timed blocks of `steps` tokens, each from the prefilled context and after a warm-up (the first's were done
    before), until `stop_reason` says enough (cfg.stop: `repeats` blocks, or adaptively), with the GPU's state read
    at their start and end and its energy counter around each (between blocks). The rule that stopped is the tag
    `stopped_by`.
    The first block's logits go to `keep_logits`, and `first_block(timing)` runs after it, outside the clock; `load`
    samples the machine's load at each block's start and end."""
    blocks, gpu, spent_s = [], GpuState(device), 0.0
    load = load or LoadProbe()
    gpu.read("start")
    while True:
        started = time.perf_counter()
        if blocks:
            warm_up_again(stepper, cfg.warmup)  # the same context and window; decode rewrites only the slots after it
        on_phase(f"decode (block {len(blocks) + 1}, at most {cfg.repeats})" if cfg.repeats > 1 else "decode")
        energy = gpu.energy()
        load.sample()
        with nvtx_range("decode", device.type == "cuda"):
            blocks.append(timed_decode(stepper, steps, device, None if blocks else keep_logits))  # ends in a sync
        load.sample()
        gpu.add_block(energy)
        if first_block is not None and len(blocks) == 1:
            first_block(blocks[0])
        block_s = time.perf_counter() - started
        spent_s += block_s
        if (why := stop_reason(cfg, [b.step_ms for b in blocks], spent_s, block_s)) is not None:
            stepper.tags["stopped_by"] = why
            break
    gpu.read("end")
    return blocks, gpu


def run_phases(cfg: RunConfig, model, mode: DecodeMode, prompt, device, on_phase, phases: dict,
               keep_loop_logits: bool = False):
    """The untimed phases before decode: the mode's preparation, a fresh prefill, the warm-up. Returns the
    stepper, the tokens its warm-up decoded, and, where asked and the loop is plain eager (its own check's
    reference), the warm-up's logits in a list the first timed block extends (else None)."""
    cuda = device.type == "cuda"
    on_phase(mode.prepare_phase)
    mutation = mutations.requested(cfg.mode, cfg.attn)
    with nvtx_range(mode.prepare_phase, cuda), stopwatch(device, phases, "prepare_ms"):
        if mutation:  # a test's fault, active in the capture too
            with mutations.patched(model, mutation):
                stepper = mutations.MutatedStepper(mode.prepare(model, prompt, cfg), mutation)
            stepper.tags["mutation"] = mutation
        else:
            stepper = mode.prepare(model, prompt, cfg)  # allocates the cache first: it lives outside any graph pool
    inject_fault(cfg, stepper)
    phases["graph_mem_mb"] = stepper.graph_bytes / MiB
    on_phase("prefill")
    with nvtx_range("prefill", cuda), stopwatch(device, phases, "prefill_ms"):
        filled = adopt_or_prefill(model, stepper, prompt)
    # time to first token at this context: its own prefill's, or that of the earlier job's that filled it
    phases["prefill_tokens_per_s"] = (prompt.numel() / phases["prefill_ms"] * 1e3 if filled is None
                                      else filled.prefill_tokens_per_s)
    phases["prefill_reused"] = float(filled is not None)
    if filled is not None:
        stepper.tags["context_from"] = filled.filled_by
    stepper.prefilled_context_digest = context_digest(stepper)  # what verification finds the context intact against
    # what the job hands the next one with its cache, where verification keeps it (verify.keep_or_release)
    stepper.context_offer = (phases["prefill_tokens_per_s"], filled.filled_by if filled is not None else cfg.label)
    on_phase("warmup")
    with nvtx_range("warmup", cuda), stopwatch(device, phases, "warmup_ms"):
        kept = [] if keep_loop_logits and loop_serves_as_reference(stepper, mode.exact) else None
        choices: list[torch.Tensor] = []
        warm_tokens, pace_ms = warm_up(stepper, cfg.warmup, device, kept, choices)
        warm_tokens = to_the_window(stepper, cfg.warmup, warm_tokens)  # K steps a call: back to the timed window
    # each warm-up call's best logit and its recorded token's, for verification (verify.recorded_tokens)
    stepper.warm_choices = torch.stack(choices) if choices else torch.empty(0, 2, stepper.bs)
    if pace_ms is not None:
        phases["warmup_pace_ms"] = pace_ms  # ms a step over the warm-up's second half: what sizes a timed block
    return stepper, warm_tokens, kept


def adopt_or_prefill(model, stepper, prompt: torch.Tensor) -> kept_context.Filled | None:
    """Prefill the stepper's context, or, where its cache is the one an earlier job kept and that job's prefill
    read this very prompt with these weights, prefill attention, rows, capacity and dtype (context_fills), decode
    from it as the prefill would have left it: the same context, the same first token. A kept context whose slots
    no longer sum to what they summed to when it was kept, or a stepper with a test's fault (which may act in its
    prefill), prefills. Returns the kept context it took, or None."""
    filled = None if isinstance(stepper, mutations.MutatedStepper) else kept_context.taken_with(stepper.cache)
    if filled is not None and filled.serves(context_fills(model, stepper), pad_rows(prompt, stepper.rows)):
        stepper.context_len, stepper.first_ids = filled.context_len, filled.first_ids
        stepper.rewind()
        if torch.equal(context_digest(stepper), filled.digest):
            return filled
    stepper.restart(prompt)
    return None


def _speed_of_light(arch: dict, cfg: RunConfig, steps: int, device: torch.device, median_ms: float, tags: dict,
                    rows: int) -> dict[str, float]:
    """Useful bytes and FLOPs per step (harness/roofline.py) over the `steps` positions a block timed, what this
    implementation moves instead, and on a GPU the floor they set and how close the run came to it."""
    first = cfg.first_timed_position()  # the slot of the first timed step's token, whatever graph_steps
    positions = range(first, first + steps)
    itemsize = DTYPES[cfg.dtype.value].itemsize
    cost = step_cost(arch, cfg.bs, first + (steps + 1) / 2, itemsize)
    moved = implementation_bytes(arch, rows, cfg.attn, cfg.cache_len, positions, itemsize)
    cost.update(implementation_bytes=moved, waste_factor=moved / cost["step_bytes"],
                kv_slots_read=slots_read(cfg.attn, cfg.cache_len, positions))
    if device.type != "cuda":
        return cost
    ceil = ceilings(device)
    tags.update(ceiling_copy_gb_per_s=f"{ceil['copy_bytes_per_s'] / 1e9:.0f}",
                ceiling_bf16_tflop_per_s=f"{ceil['bf16_flops_per_s'] / 1e12:.0f}", ceiling_key=ceil["key"])
    lowest = floor(cost, ceil)
    return {**cost, **lowest, "efficiency": lowest["floor_ms"] / median_ms,
            "implementation_floor_ms": moved / ceil["copy_bytes_per_s"] * 1e3}


def token_repeat_fraction(tokens: torch.Tensor) -> float:
    """The share of decode steps (over every row) whose token equals the row's previous one: near 1, the greedy
    decode repeats its input, and a check of its tokens cannot tell a stale token from a right one."""
    return float((tokens[1:] == tokens[:-1]).float().mean()) if tokens.shape[0] > 1 else 0.0


def seeded_prompt(bs: int, context_len: int, vocab: int, seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (bs, context_len), generator=generator).to(device)


def _architecture(model: torch.nn.Module) -> dict:
    c = model.config
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size")
    arch = {k: getattr(c, k, None) for k in keys}
    arch["parameters"] = sum(p.numel() for p in model.parameters())
    return arch


def _peaks(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {"peak_mem_allocated_mb": torch.cuda.max_memory_allocated(device) / MiB,
            "peak_mem_reserved_mb": torch.cuda.max_memory_reserved(device) / MiB}


class MemoryProbe:
    """The post-load baseline of allocated GPU memory, and whether a job gave it all back."""

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.baseline = self._allocated()

    def _allocated(self) -> int:
        """The bytes allocated on the device, less the cache kept from one job for the next (kept_context)."""
        return torch.cuda.memory_allocated(self.device) - kept_context.kept_bytes()

    def after_release(self) -> dict[str, float]:
        """The job's memory back, and whether all of it came back; `release_ms`, the time that took."""
        if self.device.type != "cuda":
            return {}
        released: dict[str, float] = {}
        with stopwatch(self.device, released, "release_ms"):
            collect_this_jobs_garbage()
            torch.cuda.synchronize(self.device)
            # cuBLAS keeps a workspace per stream in the caching allocator and never gives it back itself
            getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
            torch.cuda.empty_cache()
        leaked = self._allocated() - self.baseline
        return {"mem_baseline_mb": self.baseline / MiB, "mem_leaked_mb": leaked / MiB,
                "mem_returned_to_baseline": float(leaked <= 0), **released}


def collect_this_jobs_garbage() -> None:
    """A full collection over what the process made since the last one, and only that: what survives it (models,
    compiled code, kept contexts) is frozen, so that later jobs' collections, and the interpreter's own during
    a timed loop, stop walking the millions of objects a compile leaves. Releasing a model unfreezes everything
    (harness/models.py), so that nothing frozen is kept past the model it belonged to."""
    gc.collect()
    gc.freeze()
