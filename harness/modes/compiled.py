from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch

from harness.clock import MiB, device_index
from harness.modes import saved_step, spec
from harness.modes.base import DecodeMode, Stepper, forward_step

# a compiled step's `compile_cache` tag where its process compiled nothing for it: Dynamo served code compiled before
COMPILED_EARLIER = "in process: compiled by an earlier job"
LOADED = "loaded: the saved step (its trace and Inductor's code) of an earlier sweep"
TRACED = "traced and compiled, and saved for later sweeps (the ahead-of-time path reads no FX graph cache)"
# "0" turns the saved steps off: every sweep's compile traces the model again (harness/modes/saved_step.py)
KEEP_STEPS_VARIABLE = "HARNESS_SAVE_COMPILED_STEPS"
COMPILE_WARMUP = 3  # calls before timing: the first compiles, the next record CUDA graphs
# Where a compile's time goes, from Dynamo's own timers (torch._dynamo.utils.compile_times: seconds, summed over the
# process), each logged as what this job's compile added to it. A warm compile still traces and loads: only these
# tell whether its seconds are Dynamo's trace, the backend (AOTAutograd and Inductor, compiling or reading their
# caches), or the calls themselves (compile_calls_ms: running the steps, and recording their CUDA graphs).
# Each phase names its timer on torch.compile's path, then its timer on the ahead-of-time path that saved steps take
# (harness/modes/saved_step.py). On the first, the second runs inside the first or not at all; on the second, the first
# runs for a millisecond or not at all: the larger of what this compile added to them counts.
COMPILE_PHASES = {"compile_dynamo_ms": ("_compile.compile_inner",  # the whole of Dynamo's compile, backend included
                                        "fullgraph_capture"),
                  "compile_trace_ms": ("bytecode_tracing",),  # Dynamo reading the step's Python into a graph
                  "compile_backend_ms": ("OutputGraph.call_user_compiler",  # AOTAutograd and Inductor
                                         "create_aot_dispatcher_function"),
                  "compile_code_load_ms": ("PyCodeCache.load_by_key_path",)}  # importing Inductor's generated modules
_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def inductor_options(compile_mode: str, inductor: dict) -> dict:
    """The Inductor options a compile runs with: compile_mode's own, then the run's `inductor.*` over them."""
    from torch._inductor import list_mode_options  # imported with Inductor, by the compiled modes only

    return {**list_mode_options(compile_mode, dynamic=False), **inductor}


class _Regions:
    """Whether the step being traced compiles each decoder layer as one nested region. Every compiled call sets it
    (CompiledStepper.step) and resets it after, so that an eager decode between compiled steps runs the layers' own
    forward. What keeps a process's regional and whole-model steps apart is their code objects (_regional_step):
    a guard on this switch did not, on torch 2.11."""

    on = False


def _compile_layers_once(model: torch.nn.Module) -> None:
    """Route each decoder layer class of `model` through torch.compiler.nested_compile_region while _Regions.on,
    and through its own forward otherwise: Dynamo then traces one layer, Inductor compiles it once, and every other
    layer of the same structure calls that code (a layer of another structure gets its own). Outside a compile the
    region is a plain call. The class is patched for the process: eager and graphed runs go through one more call."""
    for layer_class in {type(layer) for layer in decoder_layers(model)}:
        if getattr(layer_class, "_harness_region", None) is not None:
            continue
        own, region = layer_class.forward, torch.compiler.nested_compile_region(layer_class.forward)

        def forward(self, *args, _own=own, _region=region, **kwargs):
            return (_region if _Regions.on else _own)(self, *args, **kwargs)

        layer_class._harness_region, layer_class.forward = region, forward


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """A transformers causal LM's decoder layers (`model.model.layers`); none for another module."""
    return list(getattr(getattr(model, "model", None), "layers", None) or [])


def _regional_step(model: torch.nn.Module, cache, input_ids: torch.Tensor) -> torch.Tensor:
    """forward_step under a code object of its own: Dynamo keeps compiled code per code object, so a regional step
    and a whole-model step of one model never serve each other. On the H200 (torch 2.11), a guard on the switch
    alone did not keep them apart: an A/B's regional arm compiled nothing and ran the whole-model arm's code."""
    return forward_step(model, cache, input_ids)


def compiled_step(model: torch.nn.Module, compile_mode: str, inductor: dict, regions: bool = False):
    """One compiled decode step per (model, compile mode, Inductor options, regions) for the whole process, so that
    later jobs of a sweep reuse Dynamo's compiled code (and Inductor's on-disk caches) instead of recompiling."""
    per_model = _compiled.setdefault(model, {})
    key = (compile_mode, json.dumps(inductor, sort_keys=True, default=str), regions)
    _prepare_layers(model, regions)
    if key not in per_model:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # dynamic=False: each batch size gets kernels specialised to it, as a captured graph does; torch.compile
        # takes a mode or options, not both, so options carry the mode's own
        how = dict(options=inductor_options(compile_mode, inductor)) if inductor else dict(mode=compile_mode)
        per_model[key] = torch.compile(_regional_step if regions else forward_step, dynamic=False, **how)
    return per_model[key]


def _prepare_layers(model: torch.nn.Module, regions: bool) -> None:
    if regions and not decoder_layers(model):
        raise TypeError(f"{type(model).__name__} has no model.layers: compile_regions=true needs a transformers "
                        f"decoder-only model")
    # either way, so that every step of the model is traced through one layer forward: a whole-model step traced
    # before a regional one patched the class would be traced again after it (seen on torch 2.13 on a CPU)
    _compile_layers_once(model)


@contextlib.contextmanager
def counted_graph_replays() -> Iterator[list]:
    """A list that gains an entry for each CUDA graph replayed inside the block: torch.cuda.CUDAGraph.replay, which
    cudagraph trees call for every graph they run. No profiler: every compiled job counts one warm-up step."""
    replays, original = [], torch.cuda.CUDAGraph.replay

    def counted(graph, *args, **kwargs):
        replays.append(1)
        return original(graph, *args, **kwargs)

    torch.cuda.CUDAGraph.replay = counted
    try:
        yield replays
    finally:
        torch.cuda.CUDAGraph.replay = original


def saved_steps_folder() -> Path | None:
    """Where compiled steps are kept between sweeps (beside Inductor's caches), or None where the user turned it off."""
    if os.environ.get(KEEP_STEPS_VARIABLE, "1") == "0":
        return None
    from harness.kernels.triton_runtime import compile_cache_dir

    return compile_cache_dir() / "steps"


class CompiledStepper(Stepper):
    def __init__(self, model, prompt, cache_len, compile_mode: str, inductor: dict, regions: bool = False,
                 keep_in: Path | None = None, not_kept_because: str = "not asked"):
        """`keep_in`: the folder of saved steps to load this step from, or save it into (None: torch.compile
        in process only, for the reason `not_kept_because`)."""
        super().__init__(model, prompt, cache_len, prefill=False)
        torch._dynamo.mark_static_address(self.static_ids)  # no copy into the graph's input each step
        self.compile_mode, self.inductor, self.regions, self.keep_in = compile_mode, inductor, regions, keep_in
        self.not_kept_because = not_kept_because
        self.step_source: str | None = None  # LOADED, TRACED or COMPILED_EARLIER where the step is kept on disk
        # with CUDA graphs, a step's outputs may be overwritten by the next: each step is marked as new
        self.mark_steps = bool(inductor_options(compile_mode, inductor).get("triton.cudagraphs"))

    def compile(self, prompt: torch.Tensor) -> CompiledStepper:
        """Compile (or load a saved step, or reuse this process's compiled step) and record its graphs; the caller
        prefills."""
        before = _graph_pool_bytes(prompt.device)
        lookups, phases_before = _fx_graph_cache_counts(), compile_phase_seconds()
        start = time.perf_counter()
        self.fn = self._kept_step() or compiled_step(self.model, self.compile_mode, self.inductor, self.regions)
        for _ in range(COMPILE_WARMUP - 1):
            self.step()
        with counted_graph_replays() as replays:  # by the last warm-up call, cudagraph trees replay what they recorded
            self.step()
        self._record_graph_replays(len(replays))
        torch.cuda.synchronize() if prompt.is_cuda else None
        self.metrics["compile_ms"] = (time.perf_counter() - start) * 1e3
        self._record_cache_use(lookups)
        self.metrics.update(phase_ms(phases_before, compile_phase_seconds(), self.metrics["compile_ms"]))
        # the growth of the one pool that cudagraph trees share across the process's compiled graphs
        self.graph_bytes = _graph_pool_bytes(prompt.device) - before
        return self

    def _record_graph_replays(self, replays: int) -> None:
        """What a step replayed from CUDA graphs (`cuda_graph_replays_per_step`, and the tag `cuda_graphs`): where the
        compile mode records graphs but the step replayed none (cudagraph trees skipped them, or a loaded step lost
        its options), the run's times are Inductor's kernels launched one by one, and the tag says so."""
        self.metrics["cuda_graph_replays_per_step"] = float(replays)
        if not self.mark_steps:
            self.tags["cuda_graphs"] = "not applied: this compile mode records no CUDA graphs"
        elif replays:
            self.tags["cuda_graphs"] = f"{replays} replayed a step"
        else:
            self.tags["cuda_graphs"] = (f"NONE replayed: {self.compile_mode} records CUDA graphs, but this step "
                                        f"launched its kernels one by one; its times are not a graphed step's")

    def _record_cache_use(self, before: dict[str, int]) -> None:
        """How the compile went: `compile_cache_hit` 1 where every graph Inductor lowered came from its FX graph
        cache (on disk: an earlier job or sweep compiled it), 0 where one was compiled cold; with no lookup at
        all, this process had compiled this very step already (Dynamo's code reused) and nothing is logged."""
        hits, misses = (_fx_graph_cache_counts()[k] - before[k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss"))
        self.metrics.update(compile_graphs_from_cache=float(hits), compile_graphs_compiled=float(misses))
        if self.step_source in (LOADED, TRACED):  # the ahead-of-time path reads no FX graph cache
            self.metrics["compile_cache_hit"] = float(self.step_source == LOADED)
            self.tags["compile_cache"] = self.step_source
            return
        if hits + misses:
            self.metrics["compile_cache_hit"] = float(misses == 0)
        self.tags["compile_cache"] = (COMPILED_EARLIER if not hits + misses else
                                      f"{hits} of {hits + misses} graphs from the FX graph cache, {misses} compiled")

    def _kept_step(self):
        """The step as saved by an earlier job or sweep, or traced now and saved (torch.compile's ahead-of-time
        path, harness/modes/saved_step.py); None where it is not kept (turned off, or not possible for this
        step: the tag `compiled_step` says why), and torch.compile serves it in process."""
        if self.keep_in is None:
            self.tags["compiled_step"] = f"not kept: {self.not_kept_because}"
            return None
        self.budget_bytes = saved_step.budget_bytes()  # a bad value is refused before a compile, not after it
        _prepare_layers(self.model, self.regions)
        options = inductor_options(self.compile_mode, self.inductor)
        key = saved_step.step_key(self.model, (self.rows, self.cache_len), self.model.dtype, self.static_ids.device,
                                  options, self.regions)
        per_model, path = _compiled.setdefault(self.model, {}), self.keep_in / f"{key}.step"
        self.metrics["compile_step_loaded"] = 0.0
        if key in per_model:
            self.tags["compiled_step"], self.step_source = f"{COMPILED_EARLIER}, {key}", COMPILED_EARLIER
            return per_model[key]
        if (note := saved_step.not_kept_note(path)).exists():
            self.tags["compiled_step"] = note.read_text().strip()
            return None
        step = self._load_or_trace(path, key, options)
        if step is not None:
            per_model[key] = step
        return step

    def _load_or_trace(self, path: Path, key: str, options: dict):
        """The step saved at `path`, or where there is none (or it cannot be read), traced now and saved there;
        None where it cannot be saved."""
        step_function = _regional_step if self.regions else forward_step
        args = (self.model, self.cache, self.static_ids)
        if path.exists():
            try:
                step = saved_step.load(path, step_function, options, args)
                self.tags["compiled_step"], self.metrics["compile_step_loaded"] = f"{LOADED}, {key}", 1.0
                self.step_source = LOADED
                return step
            except saved_step.StepNotSaved as why:
                self.tags["compiled_step_load_failed"] = str(why)  # traced and saved again, below
        _Regions.on = self.regions
        try:
            step = saved_step.compile_and_save(path, step_function, options, args)
        except saved_step.StepNotSaved as why:
            self.tags["compiled_step"] = str(why)
            return None
        finally:
            _Regions.on = False
        self.tags["compiled_step"], self.step_source = f"{TRACED}, {key}", TRACED
        self._prune(path)
        return step

    def _prune(self, saved: Path) -> None:
        """The saved steps' folder back within its budget now that `saved` was added (saved_step.prune); the tag
        `compiled_steps_pruned` says what that deleted."""
        try:
            deleted = saved_step.prune(saved.parent, self.budget_bytes, saved)
        except OSError as error:  # housekeeping: the job's own step is saved and runs either way
            self.tags["compiled_steps_pruned"] = f"not pruned: {saved_step.one_line(error)}"
            return
        if deleted:
            steps = f"{len(deleted)} saved step{'s' * (len(deleted) > 1)}"
            self.tags["compiled_steps_pruned"] = (
                f"{steps} least recently used deleted, {sum(b for _, b in deleted) / MiB:.1f} MB, "
                f"to keep {saved.parent} within {saved_step.BUDGET_VARIABLE}={self.budget_bytes / MiB:g} MB")

    def step(self):
        if self.mark_steps:  # the last step's outputs may be overwritten: we took its argmax already
            torch.compiler.cudagraph_mark_step_begin()
        _Regions.on = self.regions
        try:
            return self.fn(self.model, self.cache, self.static_ids)
        finally:
            _Regions.on = False


class CompiledMode(DecodeMode):
    """torch.compile(mode="reduce-overhead"): Inductor's fused kernels replayed from CUDA graphs,
    the route Hugging Face recommends for static-cache decode."""

    name = "compiled"
    needs_cuda = True
    prepare_phase = "compile"
    exact = False  # Inductor's fused kernels round differently from eager's: compared teacher-forced

    def check(self, device):
        return super().check(device) or _compiler_missing(device)

    def prepare(self, model, prompt, cfg):
        compile_mode = cfg.compile_mode or spec(self.name).compile_modes[0]
        # a test's fault patches the model (harness/measure/mutations.py): a step traced with it is not kept
        mutated = getattr(model, "harness_mutation", None)
        keep_in = None if mutated else saved_steps_folder()
        why = f"a test's fault ({mutated}) is injected" if mutated else f"{KEEP_STEPS_VARIABLE}=0"
        stepper = CompiledStepper(model, prompt, cfg.cache_len, compile_mode, cfg.inductor,
                                  cfg.compile_regions, keep_in, why).compile(prompt)
        stepper.tags["compile_mode"] = compile_mode
        return stepper


class CompiledNoGraphMode(CompiledMode):
    """Inductor's fused kernels launched one by one: fusion without CUDA graphs."""

    name = "compiled-nograph"
    needs_cuda = False


def _fx_graph_cache_counts() -> dict[str, int]:
    """Inductor's running counts of FX graph cache lookups in this process (hits, misses)."""
    from torch._dynamo.utils import counters

    return {k: int(counters["inductor"][k]) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}


def compile_phase_seconds() -> dict[str, float]:
    """Dynamo's running totals, in seconds, of the timers COMPILE_PHASES names (those this process has run)."""
    from torch._dynamo.utils import compile_times

    timers, totals = compile_times(repr="csv", aggregate=True)
    named = {timer for alternatives in COMPILE_PHASES.values() for timer in alternatives}
    return {timer: float(total) for timer, total in zip(timers, totals) if timer in named}


def phase_ms(before: dict[str, float], after: dict[str, float], compile_ms: float) -> dict[str, float]:
    """What a compile added to each phase's timer, in ms (0 where it did not need the phase: the step compiled
    earlier in this process, or a cache served it), and compile_calls_ms, the rest of compile_ms. A phase none of
    whose timers this process has run is left out, not logged as 0: this torch may not keep them at all."""
    phases = {}
    for metric, alternatives in COMPILE_PHASES.items():
        added = [(after[t] - before.get(t, 0.0)) * 1e3 for t in alternatives if t in after]
        if added:
            phases[metric] = max(added)
    if "compile_dynamo_ms" in phases:
        phases["compile_calls_ms"] = max(compile_ms - phases["compile_dynamo_ms"], 0.0)
    return phases


def _graph_pool_bytes(device: torch.device) -> int:
    """Bytes reserved by the private pool into which cudagraph trees record every compiled graph."""
    if device.type != "cuda":
        return 0
    from torch._inductor import cudagraph_trees  # the pool has no public handle

    index = device_index(device)
    manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
    if manager is None:  # no graph recorded yet (or compiled-nograph)
        return 0
    pool = tuple(manager.cuda_graphs_thread_pool)
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if seg["device"] == index and tuple(seg["segment_pool_id"]) == pool)


def _compiler_missing(device: torch.device) -> str | None:
    """Inductor needs Triton on a GPU, a C++ compiler on a CPU."""
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "compiled modes need Triton for Inductor's GPU kernels, and it is not installed"
        return None
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "compiled modes on CPU need a C++ compiler for Inductor (none of g++, c++, clang++ is on PATH)"
    return None
