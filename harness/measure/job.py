"""One job, start to finish: build → prepare → prefill → warm up → time → verify → result.

Pure measurement: no Hydra, no MLflow. The result is a Measurement; the caller records it. `measure` builds the
model, and `_decode` runs the other phases, a call each, in that order. What a job takes from the jobs before it and
leaves to the next (eager references, plain eager's own loop as its reference, the kept context) is asked of one
object, references.JobReferences, before and after the timed loop, which itself knows nothing of it.
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
from harness.measure import mutations, references, timing
from harness.measure.context_check import context_digest, context_fills, verified_steps
from harness.measure.stats import NOISY_PCT, block_steps, clock_failure, decode_metrics, is_noisy, stop_reason
from harness.measure.timing import DecodeTiming, timed_decode, to_the_window, warm_up_again, window_problem
from harness.measure.verify import verify


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
    """The phases after the build, in order: prepare, prefill, warm up, time, verify. The references the job keeps
    and takes (references.JobReferences) are asked for between them: the first timed block is timed on its own so
    that plain eager's loop is kept as its own check's reference before the rest, outside any clock."""
    model = loaded.model
    prompt = seeded_prompt(cfg.bs, cfg.context_len, model.config.vocab_size, cfg.seed, device)
    phases = {"build_ms": loaded.build_ms}
    stepper = prepare(cfg, model, mode, prompt, device, on_phase, phases)
    filled_by = prefill(cfg, model, stepper, prompt, device, on_phase, phases)
    kept = references.JobReferences(model, prompt, stepper, mode.exact,
                                     verified_steps(cfg.attn, cfg.context_len, cfg.cache_len),
                                     context_offer=(phases["prefill_tokens_per_s"], filled_by))
    warm_tokens = warm_up(cfg, stepper, device, on_phase, phases, keep_logits=kept.loop_logits)
    # the lockstep's steps past the warm-up, decoded in the first block too: one eager pass serves both checks
    steps = _block_steps(cfg, phases.get("warmup_pace_ms"), kept.steps_checked - warm_tokens.shape[0], stepper.tags,
                         kept.kept_loop_steps(warm_tokens.shape[0]))
    timed = TimedBlocks(cfg, steps, stepper, device, on_phase)
    decoded = torch.cat([warm_tokens, timed.first(keep_logits=kept.loop_logits).tokens])
    kept.keep_loop(decoded)
    blocks = timed.rest()
    metrics, arch = _metrics(cfg, model, stepper, device, phases, timed, decoded)
    _profile(cfg, stepper, device, on_phase, metrics, artifacts_dir)
    on_phase("verify")
    with stopwatch(device, metrics, "verify_ms"):
        checks, failure = verify(model, prompt, stepper, cfg, mode.exact, decoded, kept,
                                 _recorded_choices(stepper, blocks))
    metrics.update(checks)
    # a wrong clock first: then no figure of the run holds; then a block timed outside the window
    failure = clock_failure(metrics) or failure or window_problem(blocks, cfg.first_timed_position())
    return Measurement(metrics, [ms for b in blocks for ms in b.step_ms], blocks[0].clock, loaded.weights,
                       loaded.source, loaded.reused, stepper.tags, arch, environment_tags(device), failure)


def prepare(cfg: RunConfig, model, mode: DecodeMode, prompt, device, on_phase, phases: dict):
    """The mode's preparation (a capture, a compile; untimed): its stepper, wrapped in a test's fault where one is
    asked for (mutations), its cache allocated first: it lives outside any graph pool."""
    on_phase(mode.prepare_phase)
    mutation = mutations.requested(cfg.mode, cfg.attn)
    with nvtx_range(mode.prepare_phase, device.type == "cuda"), stopwatch(device, phases, "prepare_ms"):
        if mutation:  # a test's fault, active in the capture too
            with mutations.patched(model, mutation):
                stepper = mutations.MutatedStepper(mode.prepare(model, prompt, cfg), mutation)
            stepper.tags["mutation"] = mutation
        else:
            stepper = mode.prepare(model, prompt, cfg)
    inject_fault(cfg, stepper)
    phases["graph_mem_mb"] = stepper.graph_bytes / MiB
    return stepper


def prefill(cfg: RunConfig, model, stepper, prompt, device, on_phase, phases: dict) -> str:
    """A fresh prefill of the context, or the one an earlier job kept (adopt_or_prefill), and the digest
    verification finds the context intact against. Returns the label of the job whose prefill the context is."""
    on_phase("prefill")
    with nvtx_range("prefill", device.type == "cuda"), stopwatch(device, phases, "prefill_ms"):
        filled = adopt_or_prefill(model, stepper, prompt)
    # time to first token at this context: its own prefill's, or that of the earlier job's that filled it
    phases["prefill_tokens_per_s"] = (prompt.numel() / phases["prefill_ms"] * 1e3 if filled is None
                                      else filled.prefill_tokens_per_s)
    phases["prefill_reused"] = float(filled is not None)
    if filled is not None:
        stepper.tags["context_from"] = filled.filled_by
    stepper.prefilled_context_digest = context_digest(stepper)  # what verification finds the context intact against
    return cfg.label if filled is None else filled.filled_by


def warm_up(cfg: RunConfig, stepper, device, on_phase, phases: dict,
            keep_logits: list | None = None) -> torch.Tensor:
    """The untimed warm-up (timing.warm_up): the tokens it decoded; each call's logits to `keep_logits` where given
    (plain eager's loop as its own reference), and each call's best logit and its recorded token's, for
    verification (context_check.recorded_tokens)."""
    on_phase("warmup")
    with nvtx_range("warmup", device.type == "cuda"), stopwatch(device, phases, "warmup_ms"):
        choices: list[torch.Tensor] = []
        warm_tokens, pace_ms = timing.warm_up(stepper, cfg.warmup, device, keep_logits, choices)
        warm_tokens = to_the_window(stepper, cfg.warmup, warm_tokens)  # K steps a call: back to the timed window
    stepper.warm_choices = torch.stack(choices) if choices else torch.empty(0, 2, stepper.bs)
    if pace_ms is not None:
        phases["warmup_pace_ms"] = pace_ms  # ms a step over the warm-up's second half: what sizes a timed block
    return warm_tokens


class TimedBlocks:
    """Timed blocks of `steps` tokens, each from the prefilled context and after a warm-up (the first's were done
    before), until `stop_reason` says enough (cfg.stop: `repeats` blocks, or adaptively), with the GPU's state read
    at their start and end and its energy counter around each, and the machine's load sampled at each block's start
    and end (between blocks, never inside one). The rule that stopped is the tag `stopped_by`. The first block is
    timed on its own (`first`), so that the job can take what it keeps of it before the rest (`rest`)."""

    def __init__(self, cfg: RunConfig, steps: int, stepper, device: torch.device, on_phase):
        self.cfg, self.steps, self.stepper, self.device, self.on_phase = cfg, steps, stepper, device, on_phase
        self.blocks: list[DecodeTiming] = []
        self.gpu, self.load, self.spent_s, self.started = GpuState(device), LoadProbe(), 0.0, 0.0
        self.gpu.read("start")

    def first(self, keep_logits: list | None = None) -> DecodeTiming:
        """The first block; `keep_logits` receives each of its calls' logits (timed_decode: no copy, no sync)."""
        self.started = time.perf_counter()
        return self._block(keep_logits)

    def rest(self) -> list[DecodeTiming]:
        """More blocks, each after a rewind and a warm-up, until the stop rule says enough; every block timed. A
        block's time for the rule runs from its start to the rule's reading (the first's: whatever the job did
        between the two calls included)."""
        while not self._stopped(time.perf_counter() - self.started):
            self.started = time.perf_counter()
            warm_up_again(self.stepper, self.cfg.warmup)  # the same context and window; decode rewrites the rest
            self._block()
        self.gpu.read("end")
        return self.blocks

    def _block(self, keep_logits: list | None = None) -> DecodeTiming:
        cfg = self.cfg
        self.on_phase(f"decode (block {len(self.blocks) + 1}, at most {cfg.repeats})" if cfg.repeats > 1 else "decode")
        energy = self.gpu.energy()
        self.load.sample()
        with nvtx_range("decode", self.device.type == "cuda"):
            self.blocks.append(timed_decode(self.stepper, self.steps, self.device, keep_logits))  # ends in a sync
        self.load.sample()
        self.gpu.add_block(energy)
        return self.blocks[-1]

    def _stopped(self, block_s: float) -> bool:
        self.spent_s += block_s
        why = stop_reason(self.cfg, [b.step_ms for b in self.blocks], self.spent_s, block_s)
        if why is not None:
            self.stepper.tags["stopped_by"] = why
        return why is not None


def _metrics(cfg: RunConfig, model, stepper, device, phases: dict, timed: TimedBlocks,
             decoded: torch.Tensor) -> tuple[dict, dict]:
    """The timed blocks' figures, the phases' times, the GPU's state and the load during timing, and the model's
    speed of light at this shape; and the model's architecture."""
    blocks = timed.blocks
    metrics = {**decode_metrics(blocks, cfg.bs), **phases, **_peaks(device), **stepper.metrics,
               "block_steps": float(timed.steps), "token_repeat_fraction": token_repeat_fraction(decoded)}
    metrics.update(timed.gpu.results(sum(b.n_tokens for b in blocks) * cfg.bs, stepper.tags))
    _mark_noisy(cfg, timed.load, metrics, stepper.tags)
    arch = _architecture(model)
    metrics["parameters"] = float(arch["parameters"])  # the model's size, an axis of the reports
    metrics.update(_speed_of_light(arch, cfg, timed.steps, device, metrics["step_ms_median"], stepper.tags,
                                   stepper.rows))
    return metrics, arch


def _profile(cfg: RunConfig, stepper, device, on_phase, metrics: dict, artifacts_dir: Path | None) -> None:
    """The profiler's pass over a few steps, where cfg.profile asks for it (on a GPU only)."""
    if cfg.profile and device.type == "cuda":
        on_phase("profile")
        metrics.update(profile_steps(stepper, cfg.profile_steps, artifacts_dir))
    elif cfg.profile:
        stepper.tags["profile"] = "skipped: the profiler pass times CUDA kernels, and this job ran on the CPU"
        on_phase(f"profile {stepper.tags['profile']}")


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
    """Useful bytes and FLOPs per step (harness/measure/roofline.py) over the `steps` positions a block timed, what this
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
